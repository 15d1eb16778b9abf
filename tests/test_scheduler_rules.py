"""The rules each scheduler is built on, one at a time, and the new workloads on small
hand-checked examples."""

from __future__ import annotations

import asyncio
import tempfile

import pytest

from ordo.procedures.registry import default_registry
from ordo.scheduler.base import make_scheduler
from ordo.scheduler.batch import BatchExecution, PreparedTxn, prepare
from ordo.scheduler.execution import ABORTED, COMMITTED
from ordo.scheduler.locking import _LockTable
from ordo.scheduler.opchain import OpChainScheduler
from ordo.scheduler.vll import _Counters
from ordo.scheduler.worker import PartitionWorker
from ordo.log.records import Batch
from ordo.storage.keys import decode_key, encode_key
from ordo.storage.overlay import BatchOverlay
from ordo.storage.partitioning import Partitioner
from ordo.storage.values import decode_value

REGISTRY = default_registry()
DEFAULTS = {t.name: t.default for t in REGISTRY.tables.values()}


def txn(index: int, writes=(), reads=()) -> PreparedTxn:
    """A single-partition transaction on keys named by letters."""
    w = {k.encode(): ("t", k) for k in writes}
    r = tuple(k.encode() for k in reads) + tuple(w)
    return PreparedTxn(index, f"t{index}", None, {}, r, w, r, (0,), (0,))


def run_batch(requests: list[tuple[str, dict]], scheduler="opchain", make=None):
    """One batch on one partition: (outcomes in log order, {(table, key): value}, changes)."""
    batch = Batch(1, 1, 1_000, {}, [[f"r{i}", proc, args] for i, (proc, args) in enumerate(requests)])
    with tempfile.TemporaryDirectory() as data_dir:
        worker = PartitionWorker(data_dir, 0, 1, scheduler, REGISTRY)
        if make is not None:
            worker.scheduler = make()
        try:
            result = asyncio.run(worker.execute(batch))
            worker.commit({"batch": 1, "cursor": {}})
            state = {decode_key(k): decode_value(v) for k, v in worker.shard.items()}
        finally:
            worker.close()
    outcomes = sorted(result.outcomes, key=lambda o: o.index)
    return [(o.status, o.result, o.error) for o in outcomes], state, result.changes


# --- locking ------------------------------------------------------------------------------


def test_locking_grants_a_run_of_reads_together_and_writes_in_log_order():
    table = _LockTable(execution=None)
    w1, r2, r3, w4, r5, w6 = (
        table.request(t)
        for t in (
            txn(1, writes="a"),
            txn(2, reads="a"),
            txn(3, reads="a"),
            txn(4, writes="a"),
            txn(5, reads="a"),
            txn(6, writes="a"),
        )
    )
    assert [h.missing for h in (w1, r2, r3, w4, r5, w6)] == [0, 1, 1, 1, 1, 1]

    table.release(w1)  # the whole run of reads behind the write, not the write after it
    assert [h.txn.index for h in table.ready] == [2, 3]
    assert w4.missing == 1
    table.ready.clear()

    table.release(r3)  # reads release in any order; the write waits for both
    assert not table.ready
    table.release(r2)
    assert [h.txn.index for h in table.ready] == [4]
    table.ready.clear()

    table.release(w4)
    assert [h.txn.index for h in table.ready] == [5]  # a run of one read, then the write
    table.ready.clear()
    table.release(r5)
    assert [h.txn.index for h in table.ready] == [6]


def test_locking_locks_blind_writes_and_read_write_keys_exclusively():
    table = _LockTable(execution=None)
    first = table.request(txn(1, writes="b"))  # blind write
    reader = table.request(txn(2, reads="b"))
    both = table.request(txn(3, writes="c", reads="c"))  # read and written: one write lock
    other = table.request(txn(4, reads="c"))
    assert (first.missing, reader.missing, both.missing, other.missing) == (0, 1, 0, 1)
    assert len(table.queues[b"c"][0]) == 2


class HeldExchange:
    """A read exchange whose remote reads arrive only when the test says so."""

    def __init__(self, values: dict):
        self.values = values
        self.arrived = asyncio.Event()

    def send(self, batch_id, index, to, values):
        pass

    def flush(self):
        pass

    def when_received(self, batch_id, index, senders, callback):
        async def later():
            await self.arrived.wait()
            callback(dict(self.values))

        asyncio.get_running_loop().create_task(later())


class EmptyStore:
    def get_many(self, keys):
        return [None] * len(keys)


@pytest.mark.parametrize("name, overtakes", [("locking", True), ("vll", True), ("serial", False)])
def test_later_transactions_go_on_while_one_waits_for_remote_reads(name, overtakes):
    # micro keys partition by key modulo 2: key 0 is ours, key 1 is partition 1's.
    requests = [
        ("micro_rmw", {"keys": [0, 1]}),  # multi-partition: waits for key 1
        ("micro_rmw", {"keys": [2]}),  # no conflict
        ("micro_rmw", {"keys": [0]}),
    ]  # conflicts with the first
    batch = Batch(1, 1, 1_000, {}, [[f"r{i}", p, a] for i, (p, a) in enumerate(requests)])
    partitioner = Partitioner.for_tables(2, {t.name: t.partitioner for t in REGISTRY.tables.values()})
    txns, _ = prepare(batch, REGISTRY, partitioner, 0)
    exchange = HeldExchange({encode_key("micro", 1): 5})
    overlay = BatchOverlay(EmptyStore())
    execution = BatchExecution(batch, 0, overlay, DEFAULTS, lambda t, k, e: partitioner.of(t, k, e), exchange)

    async def scenario():
        task = asyncio.ensure_future(make_scheduler(name).run_batch(txns, execution))
        for _ in range(10):
            await asyncio.sleep(0)
        done_while_waiting = sorted(o.index for o in execution.outcomes)
        exchange.arrived.set()
        await task
        return done_while_waiting

    done_while_waiting = asyncio.run(scenario())
    assert done_while_waiting == ([1] if overtakes else [])
    assert [o.index for o in execution.outcomes] == [0, 1, 2]  # reported in log order
    assert overlay.get(encode_key("micro", 0)) == 2  # the conflicting one went after
    assert overlay.get(encode_key("micro", 2)) == 1


# --- VLL ----------------------------------------------------------------------------------


def test_vll_blocked_transaction_runs_when_it_reaches_the_head():
    vll = _Counters(execution=None, sca_threshold=1_000)  # no SCA here
    first = vll.arrive(txn(1, writes="x"))  # free: stands for one still waiting on remote reads
    second = vll.arrive(txn(2, writes="a"))  # free
    third = vll.arrive(txn(3, writes="a"))  # blocked by the second
    fourth = vll.arrive(txn(4, reads="a"))  # blocked by the second and third
    assert [a.blocked for a in (first, second, third, fourth)] == [False, False, True, True]
    vll.ready.clear()

    vll.finish(second)  # its conflict is gone, but the third is not at the head yet
    assert third.blocked and not vll.ready
    vll.finish(first)  # now everything before it is done
    assert not third.blocked and list(vll.ready) == [third]
    assert fourth.blocked
    vll.ready.clear()
    vll.finish(third)
    assert list(vll.ready) == [fourth]


def test_vll_sca_frees_a_blocked_transaction_without_a_real_conflict_and_never_one_with():
    vll = _Counters(execution=None, sca_threshold=1_000)
    head = vll.arrive(txn(1, writes="a"))  # running (waiting on remote reads)
    free = vll.arrive(txn(2, writes="b"))  # running
    stuck = vll.arrive(txn(3, writes="ac"))  # blocked: conflicts with the head, really
    loose = vll.arrive(txn(4, writes="b"))  # blocked by txn 2, which will finish
    behind = vll.arrive(txn(5, writes="c"))  # blocked by txn 3, which is still blocked
    reader = vll.arrive(txn(6, reads="d"))  # free
    reads_c = vll.arrive(txn(7, reads="c"))  # blocked: txn 3 and 5 write c
    vll.ready.clear()
    vll.finish(free)
    vll.finish(reader)
    assert loose.blocked  # not at the head, so only SCA can see it is free

    assert vll.sca() == 1
    assert not loose.blocked and list(vll.ready) == [loose]
    assert stuck.blocked and behind.blocked and reads_c.blocked
    assert head.blocked is False


def test_vll_sca_lets_readers_share_but_not_pass_a_writer():
    vll = _Counters(execution=None, sca_threshold=1_000)
    vll.arrive(txn(1, writes="x"))  # head, running
    w = vll.arrive(txn(2, writes="k"))
    r1 = vll.arrive(txn(3, reads="k"))  # blocked behind the write
    vll.ready.clear()
    vll.finish(w)  # write finished: the read is blocked only by stale counters
    later_w = vll.arrive(txn(4, writes="k"))  # blocked by the reader
    r2 = vll.arrive(txn(5, reads="k"))  # blocked by the later write
    assert vll.sca() == 1
    assert not r1.blocked and later_w.blocked and r2.blocked


# --- operation chains -----------------------------------------------------------------------


def transfer(src, dst, amount, asset_amount=None):
    asset_amount = amount if asset_amount is None else asset_amount
    return (
        "sl_transfer",
        {
            "src_account": src,
            "dst_account": dst,
            "src_asset": src,
            "dst_asset": dst,
            "account_amount": amount,
            "asset_amount": asset_amount,
        },
    )


def deposit(account, amount, asset_amount=None):
    asset_amount = amount if asset_amount is None else asset_amount
    return (
        "sl_deposit",
        {"account": account, "asset": account, "account_amount": amount, "asset_amount": asset_amount},
    )


OPCHAIN_ORDERS = [None] + [lambda seed=seed: OpChainScheduler(shuffle_seed=seed) for seed in range(4)]


@pytest.mark.parametrize("make", OPCHAIN_ORDERS)
def test_opchain_failed_transfer_leaves_no_trace_on_later_operations(make):
    requests = [
        deposit(1, 10),
        transfer(1, 2, 50, 5),  # fails on the account check; its asset part would fit
        transfer(2, 3, 40, 0),  # would pass only if it saw the failed transfer's credit
        deposit(2, 1, 0),
        transfer(1, 2, 10),
    ]
    outcomes, state, changes = run_batch(requests, make=make)
    assert outcomes == [
        (COMMITTED, None, None),
        (ABORTED, None, "insufficient funds"),
        (ABORTED, None, "insufficient funds"),
        (COMMITTED, None, None),
        (COMMITTED, None, None),
    ]
    assert state == {("account", 1): 0, ("account", 2): 11, ("asset", 1): 0, ("asset", 2): 10}
    assert {c[0] for c in changes} == {0, 3, 4}
    assert (outcomes, state, changes) == run_batch(requests, scheduler="serial")


@pytest.mark.parametrize("make", OPCHAIN_ORDERS)
def test_opchain_condition_sees_the_earlier_write_to_its_key(make):
    requests = [
        deposit(7, 30),
        transfer(7, 8, 30),  # passes only on the deposit's value of account 7
        transfer(7, 9, 1),  # account 7 is empty again: fails
        deposit(7, 100),  # a later write to account 7 it must not see
        transfer(8, 7, 30),  # account 8 holds the first transfer's credit
    ]
    outcomes, state, _ = run_batch(requests, make=make)
    assert [o[0] for o in outcomes] == [COMMITTED, COMMITTED, ABORTED, COMMITTED, COMMITTED]
    assert state == {("account", 7): 130, ("asset", 7): 130, ("account", 8): 0, ("asset", 8): 0}


def test_opchain_dependency_reads_the_version_at_its_position_not_the_latest():
    # tp's count depends on `seen` as it was before each report. The count chain is walked
    # before the seen chain, so it parks and resumes in a later round, when `seen` has
    # long moved on to 1: only the per-transaction versions give the right count.
    reports = [("tp_report", {"vehicle": v, "segment": 0, "speed": 50}) for v in (1, 1, 2, 1)]
    scheduler = OpChainScheduler()
    _, state, _ = run_batch(reports, make=lambda: scheduler)
    assert state[("count", 0)] == 2
    assert scheduler.rounds >= 2


def test_opchain_reads_and_writes_each_key_once_per_batch():
    requests = [("micro_rmw", {"keys": [0, i % 3, 10 + i]}) for i in range(30)]
    requests += [deposit(1, 5), transfer(1, 2, 3), transfer(2, 1, 1), deposit(2, 1)]
    batch = Batch(1, 1, 1_000, {}, [[f"r{i}", p, a] for i, (p, a) in enumerate(requests)])
    txns, _ = prepare(batch, REGISTRY, Partitioner(1), 0)
    gets, puts = {}, {}

    class Counting(BatchOverlay):
        __slots__ = ()

        def get(self, key):
            gets[key] = gets.get(key, 0) + 1
            return super().get(key)

        def put(self, key, value):
            puts[key] = puts.get(key, 0) + 1
            super().put(key, value)

    overlay = Counting(EmptyStore())
    execution = BatchExecution(batch, 0, overlay, DEFAULTS, lambda t, k, e: 0)
    asyncio.run(OpChainScheduler().run_batch(txns, execution))
    assert max(gets.values()) == 1 and max(puts.values()) == 1
    assert overlay.get(encode_key("micro", 0)) == 40  # 30 + the 10 repeats of key 0 (i % 3 == 0)
    assert overlay.get(encode_key("account", 1)) == 3


def test_opchain_runs_a_procedure_without_operation_form_whole_at_its_position():
    import dataclasses

    registry = default_registry()
    registry.add_procedure(
        dataclasses.replace(registry.procedures["sl_transfer"], name="plain_transfer", operations=None)
    )
    requests = [deposit(1, 10), ("plain_transfer", transfer(1, 2, 10)[1]), transfer(2, 3, 10), deposit(1, 1)]
    batch = Batch(1, 1, 1_000, {}, [[f"r{i}", p, a] for i, (p, a) in enumerate(requests)])
    results = {}
    for name in ("serial", "opchain"):
        with tempfile.TemporaryDirectory() as data_dir:
            worker = PartitionWorker(data_dir, 0, 1, name, registry)
            result = asyncio.run(worker.execute(batch))
            results[name] = ([(o.index, o.status, o.error) for o in result.outcomes], result.changes)
            worker.close()
    assert results["opchain"] == results["serial"]
    assert [o[1] for o in results["opchain"][0]] == [COMMITTED] * 4


# --- the new workloads on hand-checked examples ----------------------------------------------


@pytest.mark.parametrize("scheduler", ["serial", "locking", "vll", "opchain"])
def test_gs_reads_sum_and_writes_set(scheduler):
    outcomes, state, _ = run_batch(
        [
            ("gs_write", {"keys": [1, 2], "value": 5}),
            ("gs_write", {"keys": [2], "value": 7}),
            ("gs_read", {"keys": [1, 2, 1, 3]}),  # a repeated key counts twice; 3 reads as 0
        ],
        scheduler,
    )
    assert [o[1] for o in outcomes] == [None, None, 17]
    assert state == {("gs", 1): 5, ("gs", 2): 7}


@pytest.mark.parametrize("scheduler", ["serial", "locking", "vll", "opchain"])
def test_ob_bids_alters_and_tops(scheduler):
    outcomes, state, _ = run_batch(
        [
            ("ob_bid", {"item": 1, "price": 100, "qty": 10}),  # default ask 100, 1000 on offer
            ("ob_bid", {"item": 1, "price": 99, "qty": 1}),  # below the ask
            ("ob_bid", {"item": 1, "price": 200, "qty": 991}),  # more than is left
            ("ob_alter", {"items": [1, 2, 1], "prices": [120, 80, 90]}),  # last price wins
            ("ob_top", {"items": [2, 2], "qtys": [5, 6]}),
            ("ob_bid", {"item": 1, "price": 90, "qty": 990}),
        ],
        scheduler,
    )
    assert outcomes == [
        (COMMITTED, 990, None),
        (ABORTED, None, "bid rejected"),
        (ABORTED, None, "bid rejected"),
        (COMMITTED, None, None),
        (COMMITTED, None, None),
        (COMMITTED, 0, None),
    ]
    assert state == {("item", 1): {"price": 90, "qty": 0}, ("item", 2): {"price": 80, "qty": 1011}}


@pytest.mark.parametrize("scheduler", ["serial", "locking", "vll", "opchain"])
def test_tp_tolls_congested_busy_segments(scheduler):
    from ordo.procedures.workloads.tp import seen_key

    reports = [("tp_report", {"vehicle": v, "segment": 3, "speed": 30}) for v in range(51)]
    reports += [
        ("tp_report", {"vehicle": 51, "segment": 3, "speed": 30}),  # 52 vehicles: 2 * 2^2
        ("tp_report", {"vehicle": 0, "segment": 3, "speed": 30}),  # seen before: still 52
        ("tp_report", {"vehicle": 52, "segment": 3, "speed": 1000}),  # average 2590 // 54 = 47
        ("tp_report", {"vehicle": 0, "segment": 4, "speed": 10}),  # another segment
    ]
    outcomes, state, _ = run_batch(reports, scheduler)
    assert [o[1] for o in outcomes] == [0] * 50 + [2, 8, 8, 0, 0]
    assert state[("speed", 3)] == {"n": 54, "sum": 30 * 53 + 1000}
    assert state[("count", 3)] == 53 and state[("count", 4)] == 1
    assert state[("seen", seen_key(0, 3))] == 1 and state[("seen", seen_key(0, 4))] == 1


def test_generators_are_seeded_and_obey_their_knobs():
    from ordo.procedures.workloads import gs, ob, tp

    assert list(gs.generate(20, seed=4)) == list(gs.generate(20, seed=4))
    reads = [r["proc"] for r in gs.generate(400, seed=1, read=0.8)]
    assert 0.7 < reads.count("gs_read") / len(reads) < 0.9
    assert all(len(set(r["args"]["keys"])) == 10 for r in gs.generate(50, seed=2))
    mix = [r["proc"] for r in ob.generate(800, seed=1)]
    assert 0.65 < mix.count("ob_bid") / len(mix) < 0.85
    assert all(0 <= r["args"]["segment"] < 7 for r in tp.generate(100, seed=1, segments=7))
    for workload in (gs, ob, tp):
        for r in workload.generate(30, seed=5):
            REGISTRY.analyze(r["proc"], r["args"])  # every generated request is valid
