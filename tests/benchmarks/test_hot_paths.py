"""Micro-benchmarks of the engine's hot paths, with pytest-benchmark. The normal test run
skips them; run them with `python -m pytest tests/benchmarks --benchmark-enable`.

Every benchmark works on one batch of BATCH micro transactions (Calvin's epoch cap), so
their times add up to what one batch costs a partition worker on one core."""

from __future__ import annotations

import asyncio
import json

import pytest

from ordo.procedures.registry import default_registry
from ordo.procedures.workloads import micro, sl
from ordo.scheduler.base import available_schedulers, make_scheduler
from ordo.scheduler.batch import BatchExecution, Outcome, prepare
from ordo.scheduler.execution import COMMITTED
from ordo.scheduler.outputs import change_records, outcome_record
from ordo.log.records import Batch
from ordo.sequencer.wire import encode_request, parse_request
from ordo.storage.overlay import BatchOverlay
from ordo.storage.partitioning import Partitioner
from ordo.storage.rocks import RocksShard

BATCH = 200
MAX_REQUEST_BYTES = 64 * 1024
CONTENTION = {"ci-0.0001": 10_000, "ci-0.1": 10}


@pytest.fixture(scope="module")
def registry():
    return default_registry()


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def requests_of(workload, count: int = BATCH, **knobs) -> list[dict]:
    return list(workload.generate(count, 1, **knobs))


def batch_of(requests: list[dict], batch_id: int = 1) -> Batch:
    return Batch(
        batch_id, 1, 1_700_000_000_000, {0: [0, len(requests)]}, [[r["id"], r["proc"], r["args"]] for r in requests]
    )


def encoded(requests: list[dict]) -> list[tuple[bytes, bytes]]:
    return [(r["id"].encode(), encode_request(r["id"], r["proc"], r["args"])) for r in requests]


# -- the sequencer: decoding and validating a request -------------------------------------


@pytest.mark.parametrize("workload", [micro, sl], ids=["micro", "sl"])
def test_parse_request_batch(benchmark, registry, workload):
    messages = encoded(requests_of(workload))

    def parse_all():
        return [
            parse_request(value, key, 0, offset, registry, MAX_REQUEST_BYTES)
            for offset, (key, value) in enumerate(messages)
        ]

    entries = benchmark(parse_all)
    assert all(entry[1] is not None for entry in entries)


# -- ANALYZE: argument checks and read/write sets -------------------------------------------


@pytest.mark.parametrize("workload", [micro, sl], ids=["micro", "sl"])
def test_registry_analyze_batch(benchmark, registry, workload):
    requests = requests_of(workload)

    def analyze_all():
        return [registry.analyze(r["proc"], r["args"]) for r in requests]

    assert len(benchmark(analyze_all)) == BATCH


def test_prepare_batch(benchmark, registry):
    batch = batch_of(requests_of(micro))
    partitioner = Partitioner.for_tables(1, {t.name: t.partitioner for t in registry.tables.values()})
    txns, rejected = benchmark(prepare, batch, registry, partitioner, 0)
    assert len(txns) == BATCH and not rejected


# -- each scheduler running one prepared batch on a RocksDB shard ---------------------------


@pytest.mark.parametrize("contention", list(CONTENTION))
@pytest.mark.parametrize("scheduler_name", available_schedulers())
def test_scheduler_step(benchmark, registry, loop, tmp_path, scheduler_name, contention):
    """A partition worker's step after prepare: prefetch the batch's keys into a fresh
    overlay, then the scheduler runs every transaction of the batch on it."""
    batch = batch_of(requests_of(micro, hot=CONTENTION[contention]))
    partitioner = Partitioner.for_tables(1, {t.name: t.partitioner for t in registry.tables.values()})
    defaults = {t.name: t.default for t in registry.tables.values()}
    scheduler = make_scheduler(scheduler_name)
    shard = RocksShard(str(tmp_path / "shard"))

    def setup():
        txns, _ = prepare(batch, registry, partitioner, 0)
        return (txns, BatchOverlay(shard)), {}

    def step(txns, overlay):
        overlay.prefetch(key for txn in txns for key in txn.local_reads)
        execution = BatchExecution(batch, 0, overlay, defaults, lambda table, key, encoded: 0)
        loop.run_until_complete(scheduler.run_batch(txns, execution))
        return execution

    execution = benchmark.pedantic(step, setup=setup, rounds=30, warmup_rounds=2)
    shard.close()
    assert len(execution.outcomes) == BATCH
    assert all(outcome.status == COMMITTED for outcome in execution.outcomes)


# -- storage: the overlay becoming one WriteBatch -----------------------------------------------


def test_overlay_and_apply_batch(benchmark, registry, tmp_path):
    """The storage side of a batch: multi-get of its keys into an overlay, a put per
    written key, the dirty keys encoded, one WriteBatch with the applied marker."""
    batch = batch_of(requests_of(micro))
    partitioner = Partitioner.for_tables(1, {t.name: t.partitioner for t in registry.tables.values()})
    txns, _ = prepare(batch, registry, partitioner, 0)
    keys = [key for txn in txns for key in txn.local_reads]
    shard = RocksShard(str(tmp_path / "shard"))
    batch_ids = iter(range(1, 1_000_000))

    def overlay_and_apply():
        overlay = BatchOverlay(shard)
        overlay.prefetch(keys)
        for key in keys:
            value = overlay.get(key)
            overlay.put(key, value + 1 if type(value) is int else 1)
        writes = overlay.encoded_writes()
        shard.apply_batch(writes, {"batch": next(batch_ids), "cursor": {}})
        return writes

    writes = benchmark(overlay_and_apply)
    shard.close()
    assert len(writes) == len(set(keys))


# -- outputs: outcome records and change data --------------------------------------------------


def test_outcome_records_batch(benchmark):
    outcomes = [Outcome(i, f"micro-1-{i}", COMMITTED, None, None) for i in range(BATCH)]
    records = benchmark(lambda: [outcome_record(outcome, 17) for outcome in outcomes])
    assert json.loads(records[0])["status"] == COMMITTED


def test_change_records_batch(benchmark):
    changes = [[i // 10, "micro", 1000 * i, i] for i in range(BATCH * 10)]
    messages = benchmark(change_records, 17, BATCH, range(BATCH), changes)
    assert len(messages) == BATCH
    assert sum(len(json.loads(value)["changes"]) for _, value in messages) == len(changes)
