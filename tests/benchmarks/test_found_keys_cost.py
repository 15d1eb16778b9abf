"""What finding a procedure's keys by running it costs the engine: one batch of BATCH ycsbt
transfers decided on one partition, the sequencer's parsing included, with ANALYZE under
locking, without it under locking (a first turn that finds the keys, then the steps it
re-sequences as the next batch) and without it under aria (found within the batch).
Run with `python -m pytest tests/benchmarks --benchmark-enable`."""

from __future__ import annotations

import asyncio
import shutil
import tempfile

import pytest

from ordo.procedures.loading import load_registry
from ordo.procedures.ollp import RESTARTED
from ordo.log.steps import restart_request
from ordo.procedures.workloads import ycsbt
from ordo.scheduler.execution import COMMITTED
from ordo.scheduler.worker import PartitionWorker
from ordo.log.records import ARIA, Batch
from ordo.sequencer.wire import encode_request, parse_request

BATCH = 200
MAX_REQUEST_BYTES = 64 * 1024
FORMS = {  # name: (procedure module, scheduler, batch ordering)
    "analyze-locking": ("ordo.procedures.workloads.ycsbt", "locking", None),
    "found-locking": ("ordo.procedures.workloads.ycsbt_open", "locking", None),
    "found-aria": ("ordo.procedures.workloads.ycsbt_open", "aria", ARIA),
}


def decided_through_the_log(worker, registry, messages: list[bytes], ordering, loop) -> tuple[int, list]:
    """Parse the messages as the sequencer does, execute them as one batch, and the steps
    it re-sequences as the next, until every request is decided: (batches, outcomes)."""
    batches, decided = 0, []
    while messages:
        batches += 1
        entries = [parse_request(m, None, 0, i, registry, MAX_REQUEST_BYTES, ordering) for i, m in enumerate(messages)]
        batch = Batch(batches, 1, 1_700_000_000_000 + batches, {}, entries, ordering=ordering)
        result = loop.run_until_complete(worker.execute(batch))
        worker.commit({"batch": batches, "cursor": {}})
        messages = [restart_request(o.id, o.result) for o in result.outcomes if o.status == RESTARTED]
        decided += [o for o in result.outcomes if o.status != RESTARTED]
    return batches, decided


@pytest.mark.parametrize("form", list(FORMS))
def test_a_batch_decided(benchmark, form):
    module, scheduler, ordering = FORMS[form]
    registry = load_registry([module])
    messages = [encode_request(r["id"], r["proc"], r["args"]) for r in ycsbt.generate(BATCH, 1, records=1000)]
    loop = asyncio.new_event_loop()
    opened: list = []

    def setup():
        while opened:
            worker, directory = opened.pop()
            worker.close()
            shutil.rmtree(directory, ignore_errors=True)
        directory = tempfile.mkdtemp(prefix="ordo-found-keys-")
        worker = PartitionWorker(directory, 0, 1, scheduler, registry)
        opened.append((worker, directory))
        return (worker, registry, messages, ordering, loop), {}

    batches, decided = benchmark.pedantic(decided_through_the_log, setup=setup, rounds=20, warmup_rounds=2)
    setup()  # closes the last one
    opened[0][0].close()
    shutil.rmtree(opened[0][1], ignore_errors=True)
    loop.close()
    assert batches == (2 if form == "found-locking" else 1)
    assert len(decided) == BATCH and all(o.status == COMMITTED for o in decided)
