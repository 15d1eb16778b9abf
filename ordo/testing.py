"""Testing procedures in-process: no Kafka, no sequencer process, no Ray.

    from ordo.testing import TestEngine, check_deterministic

    with TestEngine(app) as engine:
        outcome = engine.call("deposit", {"account": 1, "amount": 5})
        assert outcome["status"] == "committed" and engine.read("account", 1) == 105

Requests are checked as the sequencer checks them (JSON, schema, ANALYZE, duplicate ids),
cut into batches, and executed by the real partition workers with the chosen scheduler
over RocksDB shards in a temporary directory: the code path of `ordo run` from the log on.
`check_deterministic` runs the same requests under every scheduler and partition count
and against the plain serial interpretation, and says where they differ.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from typing import Any, Iterable, NamedTuple

from ordo.procedures.fingerprint import describe
from ordo.procedures.ollp import OLLP_FIELD, RESTARTED, SIGNATURE, request_identity
from ordo.log.steps import restart_request
from ordo.procedures.registry import Registry
from ordo.procedures.streams import split_result
from ordo.scheduler.exchange import LocalExchange
from ordo.scheduler.worker import PartitionWorker
from ordo.storage.layout import check_layout
from ordo.log.records import ARIA, Batch
from ordo.sequencer.sequencer import SequencerConfig
from ordo.sequencer.wire import parse_request
from ordo.storage.keys import decode_key, encode_key
from ordo.storage.values import decode_value

SCHEDULERS = ("serial", "locking", "vll", "opchain")
START_MS = 1_700_000_000_000  # the batches' clock: `ctx.now` of batch b is START_MS + 10 * b


def as_registry(procedures: Any, workloads: Iterable[str] = ()) -> Registry:
    """A Registry from an `ordo.App`, a module with PROCEDURES/TABLES, a spec string
    ("module" or "module:app") or a Registry."""
    from ordo.procedures.loading import load_registry, load_spec, workload_spec

    if isinstance(procedures, Registry):
        registry = procedures
    elif isinstance(procedures, str):
        registry = load_registry([procedures])
    elif hasattr(procedures, "registry") and hasattr(procedures, "PROCEDURES"):
        registry = procedures.registry()
    elif hasattr(procedures, "PROCEDURES"):
        registry = Registry()
        registry.add_workload(
            getattr(procedures, "TABLES", ()), procedures.PROCEDURES, getattr(procedures, "STREAMS", ())
        )
    else:
        raise TypeError(f"expected an ordo.App, a procedures module, a spec or a Registry, got {procedures!r}")
    for name in workloads:
        registry.add_workload(*load_spec(workload_spec(name)))
    return registry


class Change(NamedTuple):
    """One write of a committed transaction, as the change data carries it."""

    batch: int
    txn: int  # the transaction's index in its batch
    table: str
    key: Any
    value: Any  # None: deleted


class TestEngine:
    """The engine in this process: `procedures` (an `ordo.App`, a procedures module or a
    spec string) run by the real partition workers under `scheduler` on `partitions`
    RocksDB shards, in `data_dir` (a temporary directory, removed at close, if None).
    Requests are checked as the sequencer checks them, `max_request_bytes` included. A
    context manager: `with TestEngine(app) as engine`."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(
        self,
        procedures: Any,
        scheduler: str = "serial",
        partitions: int = 1,
        data_dir: str | None = None,
        max_request_bytes: int = SequencerConfig().max_request_bytes,
    ):
        self.registry = as_registry(procedures)
        # The check a sequencer's start record makes possible: a procedure set that cannot
        # describe itself the same way in every process fails here, not in production.
        self.fingerprint = describe(self.registry)
        self.scheduler = scheduler
        # Under aria, batches are stamped as `ordo run --scheduler aria` stamps them (its own
        # serial order; procedures without analyze run within the batch).
        self.ordering = ARIA if scheduler == ARIA else None
        self.partitions = partitions
        self.max_request_bytes = max_request_bytes
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="ordo-test-engine-")
        check_layout(self.data_dir, partitions)  # a data directory `ordo dump` and `ordo digest` read
        exchange = LocalExchange()
        self.workers = [
            PartitionWorker(self.data_dir, p, partitions, scheduler, self.registry, exchange.endpoint(p))
            for p in range(partitions)
        ]
        self.next_batch = 1
        self.outcomes: list[dict] = []  # every outcome so far, in log order
        self.changes: list[Change] = []  # in log order
        self._seen_ids: set[str] = set()
        self._position = 0

    # -- running requests --------------------------------------------------------------------

    def call(self, proc: str, args: dict[str, Any], request_id: str | None = None) -> dict:
        """One request in a batch of its own; its outcome."""
        request_id = request_id or f"t{self._position}"
        return self.run_batch([{"id": request_id, "proc": proc, "args": args}])[0]

    def run(self, requests: Iterable[dict | bytes], batch_size: int = 200) -> list[dict]:
        """Requests in batches of `batch_size`, in order; their outcomes in log order."""
        requests, outcomes = list(requests), []
        for start in range(0, len(requests), batch_size):
            outcomes += self.run_batch(requests[start : start + batch_size])
        return outcomes

    def run_batch(self, requests: Iterable[dict | bytes]) -> list[dict]:
        """One batch: each request (a dict, or a raw message body) checked as the sequencer
        checks it, then executed and applied on every partition."""
        entries = [self._entry(request) for request in requests]
        batch = Batch(self.next_batch, 1, START_MS + 10 * self.next_batch, {}, entries, ordering=self.ordering)

        async def every_partition():
            return await asyncio.gather(*(worker.execute(batch) for worker in self.workers))

        results = asyncio.run(every_partition())
        by_index: dict[int, dict] = {}
        changes = []
        for result in results:
            for o in result.outcomes:
                value, steps = split_result(o.result)  # a streaming dataflow's steps (procedures/streams.py)
                if o.status == RESTARTED:  # the next step as the engine publishes it: signed
                    step = json.loads(restart_request(o.id, value))
                    value = {"proc": step["proc"], "args": step["args"]}
                by_index.setdefault(
                    o.index,
                    {
                        "id": o.id,
                        "status": o.status,
                        "batch": batch.batch_id,
                        "txn": o.index,
                        "restarts": o.restarts,
                        "result": value,
                        "error": o.error,
                        **({"steps": steps} if steps is not None else {}),
                    },
                )
            changes += [Change(batch.batch_id, *change) for change in result.changes]
        for worker in self.workers:
            worker.commit({"batch": batch.batch_id, "cursor": {}})
        self.next_batch += 1
        outcomes = [by_index[i] for i in sorted(by_index)]
        self.outcomes += outcomes
        self.changes += sorted(changes, key=lambda c: (c[0], c[1], c[2], repr(c[3])))
        return outcomes

    def _entry(self, request: dict | bytes) -> list:
        raw = request if isinstance(request, bytes) else json.dumps(request).encode()
        key = request.get("id") if isinstance(request, dict) else None
        entry = parse_request(
            raw,
            key.encode() if isinstance(key, str) else None,
            0,
            self._position,
            self.registry,
            self.max_request_bytes,
            self.ordering,
        )
        self._position += 1
        if entry[1] is not None:
            identity = request_identity(entry[0], entry[2])  # as the sequencer remembers it: a step is new
            if identity in self._seen_ids:
                return [entry[0], None, f"duplicate request id '{entry[0]}'"]
            self._seen_ids.add(identity)
        return entry

    # -- reading state -----------------------------------------------------------------------

    def read(self, table: str, key: Any) -> Any:
        """The stored value, or the table's default for a key never written."""
        if table not in self.registry.tables:
            raise KeyError(f"unknown table '{table}'")
        if type(key) is list:
            key = tuple(key)  # a composite key as JSON gives it, as ctx.read takes it
        encoded = encode_key(table, key)
        worker = self.workers[self.workers[0].owner(table, key, encoded)]
        [raw] = worker.shard.get_many([encoded])
        return self.registry.tables[table].default if raw is None else decode_value(raw)

    def state(self) -> dict[tuple[str, Any], Any]:
        """Every stored record as {(table, key): value}."""
        out = {}
        for worker in self.workers:
            for encoded, raw in worker.shard.items():
                out[decode_key(encoded)] = decode_value(raw)
        return out

    def close(self) -> None:
        """Close the shards; remove the data directory if it was a temporary one."""
        for worker in self.workers:
            worker.close()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "TestEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_deterministic(
    procedures: Any,
    requests: Iterable[dict],
    batch_size: int = 50,
    schedulers: Iterable[str] = SCHEDULERS,
    partitions: Iterable[int] = (1, 2),
) -> list[dict]:
    """Run `requests` under every scheduler and partition count, and through the plain
    serial interpretation of the same batches; raise AssertionError naming the first
    configuration whose outcomes, change data or final state differ. Returns the outcomes."""
    from ordo.scheduler.reference import SerialInterpreter

    requests = list(requests)
    registry = as_registry(procedures)
    runs = {}
    for count in partitions:
        for scheduler in schedulers:
            with TestEngine(registry, scheduler, count) as engine:
                outcomes = engine.run(requests, batch_size)
                runs[f"{scheduler}, {count} partition(s)"] = (outcomes, engine.changes, engine.state())
    batches: list[Batch] = []
    engine = TestEngine(registry)
    try:
        for start in range(0, len(requests), batch_size):
            entries = [engine._entry(r) for r in requests[start : start + batch_size]]
            batches.append(Batch(len(batches) + 1, 1, START_MS + 10 * (len(batches) + 1), {}, entries))
    finally:
        engine.close()
    reference = SerialInterpreter(registry).apply(batches)
    (first, (outcomes, changes, state)), *others = runs.items()
    expected = [(o["id"], o["status"], o["result"], o["error"]) for o in reference.outcomes]
    plain_state = {decode_key(k): v for k, v in reference.state.items()}
    _same(
        "serial interpretation",
        first,
        "outcomes",
        expected,
        [(o["id"], o["status"], _unsigned(o["result"]), o["error"]) for o in outcomes],
    )
    _same("serial interpretation", first, "state", plain_state, state)
    for name, (other_outcomes, other_changes, other_state) in others:
        _same(first, name, "outcomes", outcomes, other_outcomes)
        _same(first, name, "change data", changes, other_changes)
        _same(first, name, "state", state, other_state)
    return outcomes


def _unsigned(result: Any) -> Any:
    """A re-sequenced step as the serial interpretation gives it: without the signature the
    engine puts on the message it publishes (log/steps.py)."""
    if type(result) is not dict or type(result.get("args")) is not dict:
        return result
    record = result["args"].get(OLLP_FIELD)
    if type(record) is not dict or SIGNATURE not in record:
        return result
    unsigned = {k: v for k, v in record.items() if k != SIGNATURE}
    return {**result, "args": {**result["args"], OLLP_FIELD: unsigned}}


def _same(a: str, b: str, what: str, left, right) -> None:
    if left == right:
        return
    if isinstance(left, dict):
        keys = sorted(set(left) | set(right), key=repr)
        diff = next(k for k in keys if left.get(k) != right.get(k))
        detail = f"{diff}: {left.get(diff)!r} vs {right.get(diff)!r}"
    else:
        index = next((i for i, (x, y) in enumerate(zip(left, right)) if x != y), min(len(left), len(right)))
        detail = (
            f"item {index}: {left[index] if index < len(left) else 'nothing'!r} vs "
            f"{right[index] if index < len(right) else 'nothing'!r}"
        )
    raise AssertionError(f"not deterministic: {what} of {a} and {b} differ at {detail}")
