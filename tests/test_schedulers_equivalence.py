"""Every scheduler, on one partition and on two, gives what a plain serial reading of the
log gives: the same outcome per request, the same final state, the same change data.

Requests mix every workload over a handful of keys (so hot keys, repeated keys inside one
transaction and aborts are common), plus requests the engine must reject, plus a few
test-only procedures that exercise the operation-chain scheduler's other paths: whole
transactions without an operation form (one of them deletes), a condition on a key the
transaction does not write, a form whose function raises where RUN aborts, and a form
that names a key ANALYZE did not declare.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordo.procedures.args import Int, List
from ordo.procedures.contract import Procedure
from ordo.procedures.operations import READ_MODIFY, WRITE, Condition, Operations
from ordo.procedures.registry import RequestError, default_registry
from ordo.scheduler.exchange import LocalExchange
from ordo.scheduler.execution import COMMITTED, REJECTED, execute, txn_seed
from ordo.scheduler.opchain import OpChainScheduler
from ordo.scheduler.vll import VLLScheduler
from ordo.scheduler.worker import PartitionWorker
from ordo.log.records import Batch
from ordo.sequencer.routing import build_routing, placement_of, slice_of
from ordo.storage.partitioning import Partitioner
from ordo.storage.digest import combine, digest_pairs
from ordo.storage.keys import encode_key
from ordo.storage.overlay import ABSENT
from ordo.storage.values import encode_value

# --- test-only procedures ---------------------------------------------------------------


def _gs_keys(args):
    keys = [("gs", k) for k in args["keys"]]
    return keys, keys


def _clear(ctx, args):
    """Deletes keys that hold an even value: a data-dependent delete, RUN only."""
    cleared = 0
    for k in args["keys"]:
        if ctx.read("gs", k) % 2 == 0:
            ctx.delete("gs", k)
            cleared += 1
    return cleared


def _div_keys(args):
    return [("gs", args["key"])], [("gs", args["key"])]


def _div(ctx, args):
    ctx.write("gs", args["key"], ctx.read("gs", args["key"]) // args["by"])
    return None


def _div_ops(args):
    by = args["by"]
    return Operations([READ_MODIFY("gs", args["key"], lambda v: v // by)])  # raises for by == 0


def _guarded_keys(args):
    return [("gs", args["guard"]), ("gs", args["other"])], [("gs", args["key"])]


def _guarded(ctx, args):
    """Writes `key` only if two other keys are high enough together."""
    if ctx.read("gs", args["guard"]) + ctx.read("gs", args["other"]) < 10:
        ctx.abort("guard too low")
    ctx.write("gs", args["key"], args["value"])
    return args["value"]


def _guarded_ops(args):
    # The guard keys get probe entries only: their chains may run past this transaction
    # before it is decided, so the condition must use the versions they published.
    high = Condition([("gs", args["guard"]), ("gs", args["other"])], lambda g, o: g + o >= 10, "guard too low")
    return Operations([WRITE("gs", args["key"], args["value"], condition=high)], lambda out: out[0])


def _sneaky(ctx, args):
    ctx.write("gs", args["key"] + 1, 7)  # outside its declared write set
    return None


def _sneaky_ops(args):
    return Operations([WRITE("gs", args["key"] + 1, 7)])


def build_registry():
    registry = default_registry()
    base = registry.procedures
    for name in ("sl_transfer", "ob_bid", "tp_report", "micro_rmw"):
        registry.add_procedure(dataclasses.replace(base[name], name=f"{name}_whole", operations=None))
    registry.add_procedure(Procedure("t_clear", {"keys": List(Int(0), min_len=1, max_len=8)}, _gs_keys, _clear))
    registry.add_procedure(Procedure("t_div", {"key": Int(0), "by": Int(0, 3)}, _div_keys, _div, operations=_div_ops))
    registry.add_procedure(
        Procedure(
            "t_guarded",
            {"key": Int(0), "guard": Int(0), "other": Int(0), "value": Int(-5, 40)},
            _guarded_keys,
            _guarded,
            operations=_guarded_ops,
        )
    )
    registry.add_procedure(Procedure("t_sneaky", {"key": Int(0)}, _div_keys, _sneaky, operations=_sneaky_ops))
    return registry


REGISTRY = build_registry()
DEFAULTS = {t.name: t.default for t in REGISTRY.tables.values()}

# --- requests ---------------------------------------------------------------------------

key = st.integers(0, 5)
keys = st.lists(key, min_size=1, max_size=5)  # repeats allowed
small = st.integers(0, 30)


def _transfer(a, b, c, d, x, y):
    return {"src_account": a, "dst_account": b, "src_asset": c, "dst_asset": d, "account_amount": x, "asset_amount": y}


def _paired(field):
    return st.lists(
        st.tuples(key, st.integers(80, 130) if field == "prices" else st.integers(0, 300)), min_size=1, max_size=4
    ).map(lambda pairs: {"items": [p[0] for p in pairs], field: [p[1] for p in pairs]})


micro_args = st.builds(lambda ks: {"keys": ks}, st.lists(st.integers(0, 11), min_size=1, max_size=6))
deposit_args = st.builds(
    lambda a, b, x, y: {"account": a, "asset": b, "account_amount": x, "asset_amount": y}, key, key, small, small
)
transfer_args = st.builds(_transfer, key, key, key, key, small, small)
bid_args = st.builds(lambda i, p, q: {"item": i, "price": p, "qty": q}, key, st.integers(80, 130), st.integers(0, 600))
report_args = st.builds(
    lambda v, s, sp: {"vehicle": v, "segment": s, "speed": sp}, st.integers(0, 5), st.integers(0, 2), st.integers(0, 80)
)

good = st.one_of(
    st.tuples(st.just("micro_rmw"), micro_args),
    st.tuples(st.just("sl_deposit"), deposit_args),
    st.tuples(st.just("sl_transfer"), transfer_args),
    st.tuples(st.just("gs_read"), st.builds(lambda ks: {"keys": ks}, keys)),
    st.tuples(st.just("gs_write"), st.builds(lambda ks, v: {"keys": ks, "value": v}, keys, st.integers(-5, 40))),
    st.tuples(st.just("ob_bid"), bid_args),
    st.tuples(st.just("ob_alter"), _paired("prices")),
    st.tuples(st.just("ob_top"), _paired("qtys")),
    st.tuples(st.just("tp_report"), report_args),
    st.tuples(st.just("sl_transfer_whole"), transfer_args),
    st.tuples(st.just("ob_bid_whole"), bid_args),
    st.tuples(st.just("tp_report_whole"), report_args),
    st.tuples(st.just("micro_rmw_whole"), micro_args),
    st.tuples(st.just("t_clear"), st.builds(lambda ks: {"keys": ks}, keys)),
    st.tuples(st.just("t_div"), st.builds(lambda k, b: {"key": k, "by": b}, key, st.integers(0, 3))),
    st.tuples(
        st.just("t_guarded"),
        st.builds(
            lambda k, g, o, v: {"key": k, "guard": g, "other": o, "value": v}, key, key, key, st.integers(-5, 40)
        ),
    ),
    st.tuples(st.just("t_sneaky"), st.builds(lambda k: {"key": k}, key)),
)
bad = st.sampled_from(
    [
        ("no_such_procedure", {}),
        ("sl_deposit", {"account": "1", "asset": 1, "account_amount": 1, "asset_amount": 1}),
        ("sl_deposit", {"account": 1}),
        ("micro_rmw", {"keys": []}),
        ("gs_write", {"keys": [1], "value": True}),
        ("ob_alter", {"items": [1, 2], "prices": [100]}),  # ANALYZE refuses unequal lengths
        ("sl_transfer", [1, 2]),
        (7, {}),
        (None, "rejected by the sequencer"),
    ]
)
request = st.one_of(good, good, good, good, bad)
batches = st.lists(st.lists(request, min_size=1, max_size=20), min_size=1, max_size=3)


def sequenced(request_id: str, proc, args) -> list:
    """The entry a sequencer logs for a request: itself, or its rejection with the reason
    (an engine refuses to run an accepted entry its procedures cannot validate)."""
    if proc is None:
        return [request_id, None, args]
    try:
        REGISTRY.analyze(proc, args)
    except RequestError as exc:
        return [request_id, None, str(exc)]
    return [request_id, proc, args]


def to_batches(drawn) -> list[Batch]:
    out, n = [], 0
    for b, requests in enumerate(drawn, start=1):
        entries = []
        for proc, args in requests:
            entries.append(sequenced(f"r{n}", proc, args))
            n += 1
        out.append(Batch(b, 1, 1_000 * b, {}, entries))
    return out


def routed(log: list[Batch], partitions: int) -> list[Batch]:
    """The same batches with the routing a sequencer told `partitions` records: workers
    then take their slices from it instead of placing every entry themselves."""
    partitioner = Partitioner.for_tables(partitions, {t.name: t.partitioner for t in REGISTRY.tables.values()})
    out = []
    for batch in log:
        placements = []
        for _, proc, args in batch.entries:
            try:
                _, read_set, write_set = REGISTRY.analyze(proc, args)
            except RequestError:
                placements.append(None)  # what a sequencer would reject
                continue
            placements.append(placement_of(partitioner, read_set, write_set))
        out.append(
            Batch(
                batch.batch_id,
                batch.generation,
                batch.time_ms,
                batch.offsets,
                batch.entries,
                routing=build_routing(partitions, placements),
            )
        )
    return out


# --- the yardstick: a dictionary and RUN, one request at a time --------------------------


def interpret(log: list[Batch]):
    state: dict[bytes, object] = {}
    outcomes, changes = [], []
    for batch in log:
        for index, (request_id, proc, args) in enumerate(batch.entries):
            if proc is None:
                outcomes.append((batch.batch_id, index, request_id, REJECTED, None, args))
                continue
            try:
                procedure, reads, writes = REGISTRY.analyze(proc, args)
            except RequestError as exc:
                outcomes.append((batch.batch_id, index, request_id, REJECTED, None, str(exc)))
                continue
            snapshot = {encode_key(t, k): state.get(encode_key(t, k), ABSENT) for t, k in reads}
            status, result, error, written = execute(
                procedure,
                args,
                snapshot,
                {encode_key(t, k) for t, k in writes},
                DEFAULTS,
                batch.time_ms,
                txn_seed(batch.batch_id, index),
            )
            outcomes.append((batch.batch_id, index, request_id, status, result, error))
            if status != COMMITTED:
                continue
            for encoded in sorted(written):
                table, k, value = written[encoded]
                if value is ABSENT:
                    state.pop(encoded, None)
                else:
                    state[encoded] = value
                changes.append((batch.batch_id, index, encoded, None if value is ABSENT else value))
    digest = digest_pairs((k, encode_value(v)) for k, v in state.items())
    return outcomes, sorted(changes, key=lambda c: c[:3]), digest


# --- the engine: partition workers driven in-process -------------------------------------


class HoldingEndpoint:
    """An exchange that, like the socket one, keeps local reads in an outbox until `flush`:
    a scheduler that waits without flushing hangs here."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.mailbox = endpoint.mailbox
        self.outbox = []

    def send(self, batch_id, index, to, values):
        self.outbox.append((batch_id, index, to, values))

    def flush(self):
        outbox, self.outbox = self.outbox, []
        for message in outbox:
            self.endpoint.send(*message)

    def when_received(self, batch_id, index, senders, callback):
        self.endpoint.when_received(batch_id, index, senders, callback)


class MemoryShard:
    """The storage backend, in a dictionary: the property test opens hundreds of shards,
    and what it checks is the schedulers, not RocksDB (the other tests use RocksDB)."""

    def __init__(self, path, sync=False):
        self.data: dict[bytes, bytes] = {}
        self.marker = None

    def get_many(self, keys):
        return [self.data.get(k) for k in keys]

    def apply_batch(self, writes, marker, first=None):
        for k, v in writes.items():
            if v is None:
                self.data.pop(k, None)
            else:
                self.data[k] = v
        self.marker = marker

    def applied(self):
        return self.marker

    def digest(self):
        return digest_pairs(self.data.items())

    def close(self):
        pass


def engine(log: list[Batch], scheduler: str, partitions: int, make=None, holding=False, memory=False, registry=None):
    """Outcomes, change data and digest of `log` run by `partitions` workers."""
    if memory:
        with mock.patch("ordo.scheduler.worker.RocksShard", MemoryShard):
            return engine(log, scheduler, partitions, make, holding, registry=registry)
    with tempfile.TemporaryDirectory() as data_dir:
        exchange = LocalExchange()
        endpoints = [exchange.endpoint(p) for p in range(partitions)]
        if holding:
            endpoints = [HoldingEndpoint(e) for e in endpoints]
        workers = [
            PartitionWorker(data_dir, p, partitions, scheduler, registry or REGISTRY, endpoints[p])
            for p in range(partitions)
        ]
        if make is not None:
            for worker in workers:
                worker.scheduler = make()
        outcomes, changes = [], []
        try:
            for position, batch in enumerate(log):
                upcoming = log[position + 1] if position + 1 < len(log) else None

                async def both(batch=batch, upcoming=upcoming):
                    # A deadlock between partitions fails the test instead of hanging it. Each
                    # worker prepares the next batch while it waits for its peers, as followers do.
                    return await asyncio.wait_for(
                        asyncio.gather(*(w.execute(batch, upcoming=upcoming) for w in workers)), 60
                    )

                results = asyncio.run(both())
                for result in results:
                    outcomes += [(batch.batch_id, o.index, o.id, o.status, o.result, o.error) for o in result.outcomes]
                    changes += [(batch.batch_id, c[0], encode_key(c[1], c[2]), c[3]) for c in result.changes]
                for worker in workers:
                    worker.commit({"batch": batch.batch_id, "cursor": {}})
            digest = combine(w.shard.digest() for w in workers)
            fallbacks = sum(getattr(w.scheduler, "fallbacks", 0) for w in workers)
        finally:
            for worker in workers:
                worker.close()
    return sorted(outcomes, key=lambda o: o[:2]), sorted(changes, key=lambda c: c[:3]), digest, fallbacks


CONFIGS = [
    ("serial", None),
    ("locking", None),
    ("vll", None),
    ("vll", lambda: VLLScheduler(sca_threshold=0)),  # SCA on every chance
    ("opchain", None),
    ("opchain", lambda: OpChainScheduler(shuffle_seed=7)),  # chains walked in any order
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_every_scheduler_equals_serial_interpretation(drawn):
    log = to_batches(drawn)
    expected_outcomes, expected_changes, expected_digest = interpret(log)
    may_fall_back = any(proc == "t_div" and args.get("by") == 0 for batch in drawn for proc, args in batch)
    # 1 and 2 partitions place every entry themselves; 3 take their slices from routing.
    for partitions, layout_log in ((1, log), (2, log), (3, routed(log, 3))):
        for name, make in CONFIGS:
            outcomes, changes, digest, fallbacks = engine(
                layout_log, name, partitions, make, holding=partitions > 1, memory=True
            )
            label = f"{name}{'' if make is None else '*'} on {partitions} partition(s)"
            assert outcomes == expected_outcomes, label
            assert changes == expected_changes, label
            assert digest == expected_digest, label
            if not may_fall_back:
                assert fallbacks == 0, label


def generated_log(knobs: dict, seed: int, batch_size: int, stride: int, prefix: str) -> list[Batch]:
    """Three batches mixing every workload generator's own stream."""
    from ordo.procedures.workloads import ALL_WORKLOADS

    streams = {name: ALL_WORKLOADS[name].generate(10_000, seed=seed, **knobs[name]) for name in knobs}
    names = list(streams)
    log, n = [], 0
    for b in range(1, 4):
        entries = []
        for i in range(batch_size):
            req = next(streams[names[(i * stride + b) % len(names)]])
            entries.append(sequenced(f"{prefix}{n}", req["proc"], req["args"]))
            n += 1
        log.append(Batch(b, 1, 1_000 * b, {}, entries))
    return log


# Every generator at 2 partitions, half of micro multi-partition, over few records.
MIXED_KNOBS = {
    "micro": {"partitions": 2, "keys": 60, "hot": 4, "mp": 0.5},
    "sl": {"records": 40},
    "gs": {"records": 40},
    "ob": {"records": 40},
    "tp": {"segments": 4, "vehicles": 80},
    "alias": {"aliases": 8, "accounts": 6},
}


def test_workload_generators_agree_across_schedulers():
    """The benchmark generators' own streams, 2 partitions, larger batches."""
    log = generated_log(MIXED_KNOBS, seed=3, batch_size=150, stride=7, prefix="g")
    expected = interpret(log)
    for partitions in (1, 2):
        for name, make in CONFIGS:
            outcomes, changes, digest, fallbacks = engine(log, name, partitions, make)
            assert (outcomes, changes, digest) == expected, f"{name} on {partitions} partition(s)"
            assert fallbacks == 0


def test_routed_batches_of_hundreds_on_three_and_four_partitions():
    """Every workload generator aimed at 4 partitions, half multi-partition, in batches of
    300: routed and unrouted, on 3 and 4 partitions, every scheduler gives the serial result."""
    knobs = {
        "micro": {"partitions": 4, "keys": 400, "hot": 8, "mp": 0.5},
        "sl": {"records": 200},
        "gs": {"records": 200},
        "ob": {"records": 200},
        "tp": {"segments": 8, "vehicles": 300},
    }
    log = generated_log(knobs, seed=5, batch_size=300, stride=3, prefix="h")
    for batch in log:
        batch.entries[7] = [batch.entries[7][0], None, "rejected by the sequencer"]
    expected = interpret(log)
    multi = sum(type(item) is list for batch in routed(log, 4) for item in slice_of(batch.routing, 0))
    assert multi > 50  # the mix really spans partitions
    for partitions in (3, 4):
        for layout_log in (log, routed(log, partitions)):
            for name, make in CONFIGS:
                outcomes, changes, digest, fallbacks = engine(
                    layout_log, name, partitions, make, holding=True, memory=True
                )
                label = f"{name} on {partitions} partitions, {'routed' if layout_log is not log else 'placed'}"
                assert (outcomes, changes, digest) == expected, label
                assert fallbacks == 0, label


# Cross-chain dependencies are where operation chains go wrong: a denser mix of the
# procedures that have them (conditions on unwritten keys, functions of other keys)
# over three keys, with the chains walked in several orders.
tiny = st.integers(0, 2)
dependent = st.one_of(
    st.tuples(
        st.just("t_guarded"),
        st.builds(
            lambda k, g, o, v: {"key": k, "guard": g, "other": o, "value": v}, tiny, tiny, tiny, st.integers(-5, 12)
        ),
    ),
    st.tuples(
        st.just("gs_write"),
        st.builds(lambda ks, v: {"keys": ks, "value": v}, st.lists(tiny, min_size=1, max_size=2), st.integers(-5, 12)),
    ),
    st.tuples(st.just("gs_read"), st.builds(lambda ks: {"keys": ks}, st.lists(tiny, min_size=1, max_size=3))),
    st.tuples(st.just("t_clear"), st.builds(lambda ks: {"keys": ks}, st.lists(tiny, min_size=1, max_size=2))),
    st.tuples(
        st.just("tp_report"),
        st.builds(lambda v, sp: {"vehicle": v, "segment": 0, "speed": sp}, tiny, st.integers(0, 80)),
    ),
    st.tuples(st.just("sl_transfer"), st.builds(_transfer, tiny, tiny, tiny, tiny, small, small)),
    st.tuples(
        st.just("sl_deposit"),
        st.builds(
            lambda a, b, x, y: {"account": a, "asset": b, "account_amount": x, "asset_amount": y},
            tiny,
            tiny,
            small,
            small,
        ),
    ),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(dependent, min_size=2, max_size=20), min_size=1, max_size=2), st.integers(0, 2**16))
def test_opchain_dependencies_whatever_the_walk_order(drawn, seed):
    log = to_batches(drawn)
    expected = interpret(log)
    for make in (None, lambda: OpChainScheduler(shuffle_seed=seed), lambda: OpChainScheduler(shuffle_seed=seed + 1)):
        outcomes, changes, digest, fallbacks = engine(log, "opchain", 1, make, memory=True)
        assert (outcomes, changes, digest) == expected
        assert fallbacks == 0


# --- rounds: waiting batches executed together (scheduler/round.py) ----------------------


def engine_in_rounds(log: list[Batch], scheduler: str, partitions: int, cuts: list[list[int]], make=None):
    """`engine`, with each partition running the log in rounds of its own: partition p
    executes batches [cuts[p][i], cuts[p][i + 1]) together, whatever its peers do."""
    with mock.patch("ordo.scheduler.worker.RocksShard", MemoryShard), tempfile.TemporaryDirectory() as data_dir:
        exchange = LocalExchange()
        endpoints = [HoldingEndpoint(exchange.endpoint(p)) for p in range(partitions)]
        workers = [
            PartitionWorker(data_dir, p, partitions, scheduler, REGISTRY, endpoints[p]) for p in range(partitions)
        ]
        if make is not None:
            for worker in workers:
                worker.scheduler = make()
        outcomes, changes = [], []

        async def follow(worker, bounds):
            for start, end in zip(bounds, bounds[1:]):
                results = await worker.execute_round(log[start:end], upcoming=log[end] if end < len(log) else None)
                for batch, result in zip(log[start:end], results):
                    outcomes.extend(
                        (batch.batch_id, o.index, o.id, o.status, o.result, o.error) for o in result.outcomes
                    )
                    changes.extend((batch.batch_id, c[0], encode_key(c[1], c[2]), c[3]) for c in result.changes)
                worker.commit({"batch": log[end - 1].batch_id, "cursor": {}})

        async def all_partitions():
            await asyncio.wait_for(asyncio.gather(*(follow(w, cuts[w.partition]) for w in workers)), 60)

        try:
            asyncio.run(all_partitions())
            digest = combine(w.shard.digest() for w in workers)
        finally:
            for worker in workers:
                worker.close()
    return sorted(outcomes, key=lambda o: o[:2]), sorted(changes, key=lambda c: c[:3]), digest


def _bounds(count: int, cut_at: list[bool]) -> list[int]:
    return [0] + [i for i in range(1, count) if cut_at[i % len(cut_at)]] + [count]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(request, min_size=1, max_size=12), min_size=2, max_size=6),
    st.lists(st.lists(st.booleans(), min_size=1, max_size=6), min_size=3, max_size=3),
)
def test_batches_run_in_rounds_give_what_one_batch_at_a_time_gives(drawn, cut_draws):
    """Any grouping of consecutive batches into rounds, a different one on each partition,
    gives the serial reading's outcomes, change data and state, under every scheduler."""
    log = to_batches(drawn)
    expected = interpret(log)
    for partitions, layout_log in ((1, log), (2, log), (3, routed(log, 3))):
        cuts = [_bounds(len(log), cut_draws[p]) for p in range(partitions)]
        for name, make in CONFIGS:
            got = engine_in_rounds(layout_log, name, partitions, cuts, make)
            assert got == expected, f"{name}{'' if make is None else '*'} on {partitions} partition(s), rounds {cuts}"


def test_the_workload_generators_in_one_round_agree_with_one_batch_at_a_time():
    """The benchmark generators' streams, half multi-partition: the whole log as one round
    on one partition, batch by batch on the other."""
    log = generated_log(MIXED_KNOBS, seed=5, batch_size=120, stride=5, prefix="w")
    expected = interpret(log)
    for name, make in CONFIGS:
        got = engine_in_rounds(log, name, 2, [[0, len(log)], list(range(len(log) + 1))], make)
        assert got == expected, name
