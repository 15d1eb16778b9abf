"""Running logs of dependent transactions (procedures/ollp.py) through real partition
workers in-process, the way the sequencer and the engine close the loop: the requests a
batch's re-sequenced transactions append are parsed by the sequencer's wire parser and
open the next batch."""

from __future__ import annotations

import asyncio
import json
import tempfile

import msgpack

from ordo.procedures.registry import Registry
from ordo.scheduler.exchange import LocalExchange
from ordo.scheduler.outputs import CollectedOutputs
from ordo.scheduler.worker import PartitionWorker
from ordo.log.records import Batch
from ordo.sequencer.wire import parse_request
from ordo.storage.digest import combine
from ordo.storage.keys import decode_key
from ordo.storage.values import decode_value


def _entry(message: bytes, registry: Registry) -> list:
    """The log entry the sequencer makes of a request message, as a worker decodes it."""
    entry = parse_request(message, None, 0, 0, registry, 1 << 20)
    return msgpack.unpackb(msgpack.packb(entry), strict_map_key=False)


def run_dependent(
    batches: list[list[dict]],
    scheduler: str,
    partitions: int,
    registry: Registry,
    max_batches: int = 200,
    restarts_first: bool = True,
    ms_per_batch: int = 1_000,
    ordering: str | None = None,
) -> dict:
    """Execute `batches` of request dicts (then the restarts they cause, each batch's
    restarts opening the next batch) on `partitions` workers, batch k at log time
    k * `ms_per_batch`; return the outcomes, change data, restart messages, the final log,
    digest and state. `ordering`: the stamp of every batch (log/records.py), None for
    log order."""
    pending = [list(b) for b in batches]
    with tempfile.TemporaryDirectory() as data_dir:
        exchange = LocalExchange()
        workers = [
            PartitionWorker(data_dir, p, partitions, scheduler, registry, exchange.endpoint(p))
            for p in range(partitions)
        ]
        outputs = CollectedOutputs()
        log: list[list] = []
        restarts: list[bytes] = []
        try:
            batch_id = 0
            carried: list[list] = []
            while pending or carried:
                batch_id += 1
                assert batch_id <= max_batches, "restarts did not settle"
                fresh = [_entry(json.dumps(r).encode(), registry) for r in (pending.pop(0) if pending else [])]
                entries = carried + fresh if restarts_first else fresh + carried
                batch = Batch(batch_id, 1, ms_per_batch * batch_id, {}, entries, ordering=ordering)
                log.append(entries)
                step = CollectedOutputs()

                async def all_partitions(batch=batch):
                    return await asyncio.wait_for(asyncio.gather(*(w.execute(batch) for w in workers)), 60)

                for result in asyncio.run(all_partitions()):
                    step.publish(batch_id, len(batch), result.outcomes, result.changes, result.streamed)
                for worker in workers:
                    worker.commit({"batch": batch_id, "cursor": {}})
                outputs.merge(step)
                restarts += step.restarts
                carried = [_entry(message, registry) for message in step.restarts]
            digest = combine(w.shard.digest() for w in workers)
            state = {}
            for worker in workers:
                for raw_key, raw_value in worker.shard.items(None):
                    state[decode_key(raw_key)] = decode_value(raw_value)
        finally:
            for worker in workers:
                worker.close()
    return {
        "outcomes": outputs.outcomes,
        "positioned": outputs.positioned,
        "changes": outputs.changes,
        "restarts": restarts,
        "log": log,
        "digest": digest,
        "state": state,
        "ordering": ordering,
    }


def serial_interpretation(run: dict, registry: Registry) -> dict:
    """The plain serial interpretation (scheduler/reference.py) of the log a run built:
    what it publishes (a re-sequencing publishes no outcome), its change data and digest."""
    from ordo.scheduler.reference import SerialInterpreter

    batches = [
        Batch(b, 1, 1_000 * b, {}, entries, ordering=run["ordering"]) for b, entries in enumerate(run["log"], start=1)
    ]
    interpreter = SerialInterpreter(registry).apply(batches)
    return {
        "outcomes": [o for o in interpreter.outcomes if o["status"] != "restarted"],
        "changes": interpreter.changes,
        "digest": interpreter.digest(),
    }


def assert_equals_serial_interpretation(run: dict, registry: Registry) -> None:
    reference = serial_interpretation(run, registry)
    assert (run["outcomes"], run["changes"], run["digest"]) == (
        reference["outcomes"],
        reference["changes"],
        reference["digest"],
    )


def assert_same_run(run: dict, first: dict, label: tuple) -> None:
    """Same outcomes, change data, re-sequenced requests, log and state as the first run."""
    for part in ("outcomes", "changes", "restarts", "log", "digest"):
        assert run[part] == first[part], (*label, part)
