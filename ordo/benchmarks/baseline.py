"""The conventional baseline of BENCHMARKS.md: what a user would build instead of Ordo.

A Kafka consumer reads `<ns>.requests` from offset 0 and applies each request as one
SERIALIZABLE transaction in PostgreSQL (Debian's server, a private cluster on a Unix
socket, no TCP), committing per request and retrying serialization failures. The `micro`
and `sl` procedures are written in SQL over tables of integer keys and values, where a
missing key reads as 0 (writes are upserts).

Checking: the baseline applies requests in its own consumption order, which is not
necessarily the order of an Ordo log (with several request partitions it is not), and
`sl` does not commute (a transfer's check depends on earlier deposits). So the final
state is checked against `SerialInterpreter` run over the baseline's own application
order, which is right whatever the order. Where the orders do coincide (one request
partition, as in `ordo bench`), the bench also compares with the engine's state.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from ordo.benchmarks.prefill import Log

SUPPORTED = ("micro", "sl")
TABLES = {"micro": ("micro",), "sl": ("account", "asset")}


class BaselineUnavailable(RuntimeError):
    """PostgreSQL is not installed (and could not be) or would not start."""


def _bindir_candidates() -> list[str]:
    found = []
    initdb = shutil.which("initdb")
    if initdb:
        found.append(os.path.dirname(os.path.realpath(initdb)))

    # Debian keeps the server out of PATH, under one directory per major version.
    def major(path: str) -> int:
        version = path.split("/")[-2]
        return int(version) if version.isdigit() else 0

    found.extend(sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major, reverse=True))
    return [
        d for d in found if os.path.exists(os.path.join(d, "postgres")) and os.path.exists(os.path.join(d, "pg_ctl"))
    ]


def find_bindir(install: bool = False) -> str:
    """Directory of Debian's `postgres`, `initdb` and `pg_ctl`; with `install`, and as root,
    apt-get installs the server first if it is missing."""
    candidates = _bindir_candidates()
    if candidates:
        return candidates[0]
    if install and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "postgresql"]):
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise BaselineUnavailable(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
        candidates = _bindir_candidates()
        if candidates:
            return candidates[0]
    raise BaselineUnavailable("PostgreSQL server not found: install Debian's server (apt-get install -y postgresql)")


class PostgresServer:
    """A throwaway PostgreSQL cluster: initdb into a temporary directory, started on a Unix
    socket in that directory (listen_addresses='' : no TCP), removed on stop, and by a
    lifeline (ordo/lifeline.py) if the process that started it ends first. PostgreSQL
    refuses to run as root, so as root it runs as the `postgres` user (which Debian's
    package creates), else `nobody`."""

    def __init__(self, install: bool = False):
        from ordo.extras import MissingExtra, require

        try:
            require("psycopg", "bench", "the PostgreSQL baseline")
        except MissingExtra as exc:
            raise BaselineUnavailable(str(exc)) from None
        self.bindir = find_bindir(install)
        self.root: str | None = None
        self.run_as: str | None = None
        self.version: str = ""

    @property
    def socket_dir(self) -> str:
        return os.path.join(self.root, "socket")

    def _command(self, tool: str, *args: str) -> list[str]:
        command = [os.path.join(self.bindir, tool), *args]
        return ["runuser", "-u", self.run_as, "--", *command] if self.run_as else command

    def _run(self, tool: str, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            self._command(tool, *args), capture_output=True, text=True, timeout=timeout, cwd=self.root
        )
        if done.returncode != 0:
            log = self._log_tail()
            raise BaselineUnavailable(f"{tool} failed ({done.returncode}): {done.stderr.strip()[-800:]}{log}")
        return done.stdout

    def _log_tail(self) -> str:
        path = os.path.join(self.root or "", "server.log")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return "\nserver log: " + f.read()[-800:]

    def start(self) -> "PostgresServer":
        from ordo.lifeline import stop_server_with_owner

        self.root = tempfile.mkdtemp(prefix="ordo-pg-")
        # pg_ctl daemonizes the server: it would outlive an owner stopped by SIGTERM or SIGKILL.
        stop_server_with_owner(os.path.join(self.root, "data", "postmaster.pid"), self.root)
        os.makedirs(self.socket_dir)
        if os.geteuid() == 0:
            self.run_as = "postgres" if _user_exists("postgres") else "nobody"
            entry = pwd.getpwnam(self.run_as)
            for path in (self.root, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        data = os.path.join(self.root, "data")
        try:
            self._run("initdb", "-D", data, "-U", "ordo", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
            options = f"-c listen_addresses='' -k {self.socket_dir} -c max_connections=20"
            self._run(
                "pg_ctl",
                "-D",
                data,
                "-l",
                os.path.join(self.root, "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            )
            with self.connect() as conn:
                self.version = conn.execute("SHOW server_version").fetchone()[0]
        except BaseException:
            self.stop()
            raise
        return self

    def connect(self):
        import psycopg

        return psycopg.connect(host=self.socket_dir, dbname="postgres", user="ordo")

    def stop(self) -> None:
        if self.root is None:
            return
        data = os.path.join(self.root, "data")
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            subprocess.run(
                self._command("pg_ctl", "-D", data, "-m", "fast", "-w", "stop"),
                capture_output=True,
                timeout=60,
                cwd=self.root,
            )
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


# -- the procedures in SQL ---------------------------------------------------------------


def _upsert_add(table: str) -> str:
    # Adds to the stored value, a missing key counting as 0. Repeated keys of a request
    # are summed first: one statement may not update a row twice.
    return (
        f"INSERT INTO {table} (k, v) SELECT * FROM unnest(%s::bigint[], %s::bigint[]) "
        f"ON CONFLICT (k) DO UPDATE SET v = {table}.v + excluded.v"
    )


class Aborted(Exception):
    pass


def _add(cur, table: str, deltas: list[tuple[int, int]]) -> None:
    summed: Counter = Counter()
    for key, delta in deltas:
        summed[key] += delta
    cur.execute(_upsert_add(table), (list(summed), list(summed.values())))


def _micro_rmw(cur, args: dict) -> None:
    _add(cur, "micro", [(key, 1) for key in args["keys"]])


def _sl_deposit(cur, args: dict) -> None:
    _add(cur, "account", [(args["account"], args["account_amount"])])
    _add(cur, "asset", [(args["asset"], args["asset_amount"])])


def _sl_transfer(cur, args: dict) -> None:
    account, asset = cur.execute(
        "SELECT coalesce((SELECT v FROM account WHERE k = %s), 0), coalesce((SELECT v FROM asset WHERE k = %s), 0)",
        (args["src_account"], args["src_asset"]),
    ).fetchone()
    if account < args["account_amount"] or asset < args["asset_amount"]:
        raise Aborted("insufficient funds")
    _add(
        cur, "account", [(args["src_account"], -args["account_amount"]), (args["dst_account"], args["account_amount"])]
    )
    _add(cur, "asset", [(args["src_asset"], -args["asset_amount"]), (args["dst_asset"], args["asset_amount"])])


PROCEDURES = {"micro_rmw": _micro_rmw, "sl_deposit": _sl_deposit, "sl_transfer": _sl_transfer}


def create_tables(conn, workload: str) -> None:
    if workload not in SUPPORTED:
        raise ValueError(f"the baseline implements {', '.join(SUPPORTED)}, not '{workload}'")
    with conn.transaction():
        for table in TABLES[workload]:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} (k bigint PRIMARY KEY, v bigint NOT NULL)")


def read_state(conn, workload: str) -> dict[tuple[str, int], int]:
    state = {}
    for table in TABLES[workload]:
        for key, value in conn.execute(f"SELECT k, v FROM {table}"):
            state[(table, int(key))] = int(value)
    return state


# -- the consumer ------------------------------------------------------------------------


@dataclass
class BaselineResult:
    workload: str
    requests: int
    seconds: float
    committed: int = 0
    aborted: int = 0
    rejected: int = 0
    retries: int = 0
    synchronous_commit: bool = False
    order: list[list] = field(default_factory=list, repr=False)  # [id, proc, args] as applied
    state: dict = field(default_factory=dict, repr=False)

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def apply_request(conn, body: dict, max_retries: int = 50) -> tuple[str, int]:
    """Run one request as one SERIALIZABLE transaction; (status, retries)."""
    from psycopg import errors

    procedure = PROCEDURES.get(body.get("proc")) if isinstance(body, dict) else None
    if procedure is None or not isinstance(body.get("args"), dict):
        return "rejected", 0
    for attempt in range(max_retries + 1):
        try:
            with conn.cursor() as cur:
                procedure(cur, body["args"])
            conn.commit()
            return "committed", attempt
        except Aborted:
            conn.rollback()
            return "aborted", attempt
        except (errors.SerializationFailure, errors.DeadlockDetected):
            conn.rollback()
            time.sleep(min(0.001 * 2**attempt, 0.05))
        except (KeyError, TypeError, ValueError, errors.DataError):
            conn.rollback()
            return "rejected", attempt
    raise RuntimeError(f"request {body.get('id')} failed {max_retries} serialization retries")


def requests_consumer(bootstrap: str, topic: str):
    """A consumer of every partition of `topic` from offset 0: a baseline replays the
    requests the engine got."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from ordo.broker.clients import kafka_config
    from ordo.broker.topics import partition_count

    consumer = Consumer(
        kafka_config(
            bootstrap,
            {
                "group.id": f"ordo-baseline-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "fetch.wait.max.ms": 5,
            },
        )
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partition_count(bootstrap, topic))])
    return consumer


def each_request(consumer, count: int, timeout: float) -> Iterator[bytes]:
    """The values of the first `count` messages `consumer` reads, then closes it; a read
    error, or fewer messages within `timeout` seconds, raises."""
    from confluent_kafka import KafkaError

    deadline = time.monotonic() + timeout
    seen = 0
    try:
        while seen < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"baseline consumed {seen} of {count} requests")
            for message in consumer.consume(min(1000, count - seen), 0.1):
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"requests read failed: {message.error()}")
                seen += 1
                yield message.value()
    finally:
        consumer.close()


def run_baseline(
    bootstrap: str,
    namespace: str,
    workload: str,
    count: int,
    server: PostgresServer,
    synchronous_commit: bool = False,
    timeout: float = 300.0,
) -> BaselineResult:
    """Consume the first `count` messages of `<namespace>.requests` (every partition, from
    offset 0) and apply each; the clock runs from the first message consumed to the last
    commit. `synchronous_commit=False` matches Ordo's durability on the local broker (no
    fsync on the path); True is PostgreSQL's default (an fsync per commit)."""
    import psycopg

    from ordo.broker.topics import Topics

    topic = Topics(namespace).requests
    conn = server.connect()
    try:
        create_tables(conn, workload)
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        conn.execute(f"SET synchronous_commit = {'on' if synchronous_commit else 'off'}")
        conn.commit()
        result = BaselineResult(workload, count, 0.0, synchronous_commit=synchronous_commit)
        counts = Counter()
        started = None
        for value in each_request(requests_consumer(bootstrap, topic), count, timeout):
            if started is None:
                started = time.perf_counter()
            try:
                body = json.loads(value)
            except ValueError:
                counts["rejected"] += 1
                continue
            status, retries = apply_request(conn, body)
            counts[status] += 1
            result.retries += retries
            if status != "rejected":
                result.order.append([body.get("id"), body["proc"], body["args"]])
        result.seconds = time.perf_counter() - started
        result.committed, result.aborted, result.rejected = counts["committed"], counts["aborted"], counts["rejected"]
        conn.isolation_level = None
        result.state = read_state(conn, workload)
        conn.commit()
        return result
    finally:
        conn.close()


def serial_state(order: list[list], workload: str) -> dict[tuple[str, int], Any]:
    """The state the plain serial interpretation reaches over `order`."""
    from ordo.procedures.registry import default_registry
    from ordo.scheduler.reference import SerialInterpreter
    from ordo.log.records import Batch
    from ordo.storage.keys import decode_key

    interpreter = SerialInterpreter(default_registry()).apply([Batch(1, 0, 0, {}, [list(e) for e in order])])
    tables = set(TABLES[workload])
    return {decode_key(k): v for k, v in interpreter.state.items() if decode_key(k)[0] in tables}


def check_serial(result: BaselineResult) -> None:
    """Raise unless the baseline's final state equals the serial interpretation of the
    requests in the order the baseline applied them."""
    expected = serial_state(result.order, result.workload)
    if result.state != expected:
        raise AssertionError(
            f"baseline state differs from the serial interpretation: {describe_difference(result.state, expected)}"
        )


def describe_difference(got: dict, expected: dict, limit: int = 5) -> str:
    keys = sorted(set(got) | set(expected), key=repr)
    wrong = [(k, got.get(k), expected.get(k)) for k in keys if got.get(k) != expected.get(k)]
    shown = ", ".join(f"{k}: {g} != {e}" for k, g, e in wrong[:limit])
    return f"{len(wrong)} key(s) differ ({shown})"


# -- the baseline, measured on an engine log's requests -------------------------------------

DURABLE_BASELINE_REQUESTS = 3000


def measure_baseline(
    bootstrap: str, log: Log, workload: str, count: int, engine_dir: str | None, install: bool = True, server=None
) -> dict:
    """The PostgreSQL baseline over the first `count` requests of the engine's log (it
    consumes the log's own <ns>.requests), checked against the serial interpretation of
    its own order and, where that order is the log's (one request partition, as here),
    against the state the engine left in `engine_dir` after those same requests."""
    from ordo.state import records

    own = server is None
    try:
        if own:
            server = PostgresServer(install=install).start()
    except BaselineUnavailable as exc:
        return {"error": str(exc)}
    try:
        result = run_baseline(bootstrap, log.namespace, workload, count, server, synchronous_commit=False)
        check_serial(result)
        figures = {
            "requests": result.requests,
            "requests_per_s": round(result.requests_per_s),
            "committed": result.committed,
            "aborted": result.aborted,
            "retries": result.retries,
            "server": server.version,
            "checked_serial": True,
            "checked_engine": False,
        }
        if engine_dir is not None and os.path.isdir(engine_dir):
            same_order = [e[0] for e in result.order] == [r["id"] for r in log.requests[:count]]
            engine_state = {
                (r["table"], r["key"]): r["value"] for r in records(engine_dir) if r["table"] in TABLES[workload]
            }
            if same_order and engine_state != result.state:
                raise AssertionError(
                    f"baseline and engine states differ: {describe_difference(result.state, engine_state)}"
                )
            figures["checked_engine"] = same_order
        durable = run_baseline(
            bootstrap, log.namespace, workload, min(count, DURABLE_BASELINE_REQUESTS), server, synchronous_commit=True
        )
        check_serial(durable)
        figures["durable_requests"] = durable.requests
        figures["durable_requests_per_s"] = round(durable.requests_per_s)
        return figures
    finally:
        if own:
            server.stop()
