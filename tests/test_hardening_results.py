"""Every scheduler applies the same checks to what RUN hands back: a result no outcome can
carry and a value no shard can hold abort that transaction alike under serial, locking,
vll and opchain, and the batch and those after it go on. A RUN that changes its own
arguments changes nothing another run or another partition sees."""

from __future__ import annotations

import asyncio

import pytest

from ordo.procedures.registry import default_registry
from ordo.scheduler.exchange import LocalExchange
from ordo.scheduler.execution import ABORTED, COMMITTED
from ordo.scheduler.worker import PartitionWorker
from ordo.log.records import Batch
from ordo.storage.digest import combine
from ordo.storage.keys import encode_key
from ordo.storage.values import decode_value

REGISTRY = default_registry(["tests.hardening_procedures"])
SCHEDULERS = ["serial", "locking", "vll", "opchain"]
OUT_OF_RANGE = "integer out of range (-2**63 to 2**64 - 1)"
DEPOSIT = {"account": 1, "asset": 1, "account_amount": 5, "asset_amount": 5}

LOG = [
    [
        ("h_big", {"key": 10}),
        ("h_nan", {"key": 11}),
        ("h_huge", {"key": 12, "sign": 1}),
        ("h_huge", {"key": 13, "sign": -1}),
        ("h_huge", {"key": 14, "sign": 0}),
        ("sl_deposit", DEPOSIT),
    ],
    [("h_take", {"keys": [1, 2]}), ("h_bump", {"key": 3, "add": 5}), ("h_plus_one", {"key": 4})],
    [("h_take", {"keys": [1]}), ("h_bump", {"key": 3, "add": 1}), ("sl_deposit", DEPOSIT)],
]

EXPECTED = {
    (1, 0): (ABORTED, None, f"result too large: {70 * 1024 + 2} bytes > limit 65536"),
    (1, 1): (ABORTED, None, "result cannot be published: nan is not a finite number"),
    (1, 2): (ABORTED, None, f"h_huge: cannot store h[12]: {OUT_OF_RANGE}"),
    (1, 3): (ABORTED, None, f"h_huge: cannot store h[13]: {OUT_OF_RANGE}"),
    (1, 4): (ABORTED, None, f"h_huge: cannot store h[14]: {OUT_OF_RANGE}"),
    (1, 5): (COMMITTED, None, None),
    (2, 0): (COMMITTED, 2, None),
    (2, 1): (COMMITTED, 15, None),
    (2, 2): (COMMITTED, None, None),
    (3, 0): (COMMITTED, 2, None),
    (3, 1): (COMMITTED, 11, None),
    (3, 2): (COMMITTED, None, None),
}
STATE = {1: 2, 2: 1, 3: 26, 4: 1}


def log() -> list[Batch]:
    """The batches, decoded once and shared by every partition in this process, as
    partitions driven in one process share them."""
    n = 0
    batches = []
    for b, requests in enumerate(LOG, start=1):
        entries = []
        for proc, args in requests:
            entries.append([f"r{n}", proc, {k: (list(v) if type(v) is list else v) for k, v in args.items()}])
            n += 1
        batches.append(Batch(b, 1, 1_000 * b, {}, entries))
    return batches


def run(data_dir, scheduler: str, partitions: int):
    exchange = LocalExchange()
    workers = [
        PartitionWorker(str(data_dir), p, partitions, scheduler, REGISTRY, exchange.endpoint(p))
        for p in range(partitions)
    ]
    outcomes, changes = {}, []
    try:
        for batch in log():

            async def every_partition(batch=batch):
                return await asyncio.wait_for(asyncio.gather(*(w.execute(batch) for w in workers)), 60)

            for result in asyncio.run(every_partition()):
                for o in result.outcomes:
                    assert (batch.batch_id, o.index) not in outcomes, "two outcomes for one request"
                    outcomes[batch.batch_id, o.index] = (o.status, o.result, o.error)
                changes += [(batch.batch_id, *change) for change in result.changes]
            for worker in workers:
                worker.commit({"batch": batch.batch_id, "cursor": {}})
        state = {}
        for key in range(20):
            encoded = encode_key("h", key)
            for worker in workers:
                [raw] = worker.shard.get_many([encoded])
                if raw is not None:
                    state[key] = decode_value(raw)
        digest = combine(w.shard.digest() for w in workers)
        fallbacks = sum(getattr(w.scheduler, "fallbacks", 0) for w in workers)
    finally:
        for worker in workers:
            worker.close()
    return outcomes, sorted(changes, key=lambda c: c[:2]), digest, state, fallbacks


@pytest.mark.parametrize("partitions", [1, 2])
def test_every_scheduler_gives_the_same_clear_outcome(tmp_path, partitions):
    runs = {}
    for scheduler in SCHEDULERS:
        outcomes, changes, digest, state, fallbacks = run(tmp_path / f"{scheduler}-{partitions}", scheduler, partitions)
        assert outcomes == EXPECTED, scheduler
        assert state == STATE, scheduler
        runs[scheduler] = (changes, digest)
        if scheduler == "opchain":
            assert fallbacks > 0  # the forms did fail, and RUN decided
    assert all(run == runs["serial"] for run in runs.values()), {s: r[1] for s, r in runs.items()}


def test_values_are_stored_as_the_shard_gives_them_back():
    from ordo.scheduler.execution import BadValue, result_problem, stored_value

    original = {"b": (1, [2]), "a": "é"}
    stored = stored_value(original)
    assert stored == {"a": "é", "b": [1, [2]]} and list(stored) == ["a", "b"]
    stored["b"][1].append(3)
    assert original["b"][1] == [2]
    for bad in (2**64, -(2**63) - 1, float("inf"), b"raw", "\ud800", {(1, 2): 1}, {1: "x", "a": 2}, {1, 2}):
        with pytest.raises(BadValue):
            stored_value(bad)
    assert result_problem("x" * 10_000) is None and result_problem(2**70) is not None
