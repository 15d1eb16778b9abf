"""The PostgreSQL baseline for TPC-C: the same transactions (the registered procedures'
RUN functions, unchanged) over PostgreSQL, as a conventional service would run them: a
Kafka consumer reads `<ns>.requests` from offset 0 and applies each request as one
SERIALIZABLE transaction, committing per request and retrying serialization failures.

Rows live in one table `kv (k bytea PRIMARY KEY, v bytea)`: the key is Ordo's encoded
key (table and composite key, order-preserving), the value msgpack. RUN's `ctx.read` is
a SELECT (a missing key reads as its table's default), its writes are buffered and upserted
at the end, as the engine applies them. A conventional database needs no reconnaissance:
a lookup by last name reads the index row inside the transaction, so the `@ollp`
assumptions a request may carry are ignored, and nothing checks declared sets.

The baseline applies the requests in its own order with its own clock, so its state is
not compared with the engine's; it is checked by TPC-C's consistency conditions instead.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from typing import Any, Iterator

from ordo.procedures.contract import Abort
from ordo.procedures.ollp import split_args
from ordo.storage.keys import decode_key, encode_key, normal_key
from ordo.storage.values import decode_value, encode_value

_UPSERT = "INSERT INTO kv (k, v) VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = excluded.v"


class _Context:
    """What RUN sees, over one open PostgreSQL transaction."""

    def __init__(self, cur, defaults: dict, now: int, seed: int):
        self._cur = cur
        self._defaults = defaults
        self.writes: dict[bytes, Any] = {}
        self.now = now
        self.random = random.Random(seed)

    def read(self, table: str, key) -> Any:
        encoded = encode_key(table, normal_key(key))
        if encoded in self.writes:
            value = self.writes[encoded]  # RUN's own write (None: deleted)
            value = None if value is None else decode_value(encode_value(value))
        else:
            row = self._cur.execute("SELECT v FROM kv WHERE k = %s", (encoded,)).fetchone()
            value = None if row is None else decode_value(row[0])
        return self._defaults.get(table, 0) if value is None else value

    def write(self, table: str, key, value: Any) -> None:
        self.writes[encode_key(table, normal_key(key))] = value

    def delete(self, table: str, key) -> None:
        self.writes[encode_key(table, normal_key(key))] = None

    def abort(self, reason: str) -> None:
        raise Abort(reason)

    def flush(self) -> None:
        puts = [(k, encode_value(v)) for k, v in sorted(self.writes.items()) if v is not None]
        deletes = [(k,) for k, v in sorted(self.writes.items()) if v is None]
        if puts:
            self._cur.executemany(_UPSERT, puts)
        if deletes:
            self._cur.executemany("DELETE FROM kv WHERE k = %s", deletes)


def apply_request(conn, registry, body: dict, index: int) -> tuple[str, int]:
    """Run one request's procedure as one SERIALIZABLE transaction: (status, retries)."""
    procedure = registry.procedures.get(body.get("proc")) if isinstance(body, dict) else None
    if procedure is None or not isinstance(body.get("args"), dict):
        return "rejected", 0
    args, _ = split_args(body["args"])
    defaults = {t.name: t.default for t in registry.tables.values()}

    def transaction(cur) -> None:
        ctx = _Context(cur, defaults, int(time.time() * 1000), index)
        procedure.run(ctx, args)
        ctx.flush()

    return serializable(conn, transaction, f"request {body.get('id')}")


def serializable(conn, transaction, what: str, max_retries: int = 50) -> tuple[str, int]:
    """`transaction(cursor)` as one SERIALIZABLE transaction, retried on serialization
    failures: ("committed" or "aborted", retries)."""
    from psycopg import errors

    for attempt in range(max_retries + 1):
        try:
            with conn.cursor() as cur:
                transaction(cur)
            conn.commit()
            return "committed", attempt
        except Abort:
            conn.rollback()
            return "aborted", attempt
        except (errors.SerializationFailure, errors.DeadlockDetected):
            conn.rollback()
            time.sleep(min(0.001 * 2**attempt, 0.05))
    raise RuntimeError(f"{what} failed {max_retries} serialization retries")


def kv_baseline_requests(conn, bootstrap: str, namespace: str, count: int) -> Iterator[tuple[int, dict]]:
    """Make `conn` a SERIALIZABLE connection over an empty `kv` table (commits not waiting
    for the disk, as the engine's do not); then (position from 1, request) for the first
    `count` requests of `<namespace>.requests`, from offset 0."""
    import psycopg

    from ordo.benchmarks.baseline import each_request, requests_consumer
    from ordo.broker.topics import Topics

    with conn.transaction():
        conn.execute("DROP TABLE IF EXISTS kv")
        conn.execute("CREATE TABLE kv (k bytea PRIMARY KEY, v bytea NOT NULL)")
    conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    conn.execute("SET synchronous_commit = off")
    conn.commit()
    consumer = requests_consumer(bootstrap, Topics(namespace).requests)
    for seen, value in enumerate(each_request(consumer, count, 1800), 1):
        yield seen, json.loads(value)


def run_tpcc_baseline(bootstrap: str, namespace: str, requests: list[dict], loads: int, server) -> dict[str, Any]:
    """Apply every request of `<namespace>.requests` (the load, then the mix); the clock
    runs over the mix only. Returns the figures and the consistency conditions found."""
    from ordo.procedures.registry import default_registry
    from ordo.procedures.workloads.tpcc_consistency import violations

    registry = default_registry()
    conn = server.connect()
    counts: Counter = Counter()
    retries = 0
    try:
        started = None
        for seen, body in kv_baseline_requests(conn, bootstrap, namespace, len(requests)):
            if seen == loads + 1:
                started = time.perf_counter()
            status, tries = apply_request(conn, registry, body, seen)
            if seen > loads:
                counts[status] += 1
                retries += tries
        seconds = time.perf_counter() - started
        conn.isolation_level = None
        records = [
            {"table": table, "key": key, "value": decode_value(raw)}
            for table, key, raw in ((*decode_key(bytes(k)), v) for k, v in conn.execute("SELECT k, v FROM kv"))
        ]
        conn.commit()
    finally:
        conn.close()
    timed = len(requests) - loads
    return {
        "txns": timed,
        "tps": round(timed / seconds),
        "seconds": round(seconds, 2),
        "retries": retries,
        "statuses": dict(counts),
        "server": server.version,
        "conditions": violations(records),
    }
