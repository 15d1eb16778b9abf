"""The aria scheduler against the serial reading of its documented order
(scheduler/aria.py): first-pass commits in read-before-write order, smallest position
first, then the fallback in log order. The yardstick (scheduler/reference.py) picks the
commits by plain pairwise comparison and runs every request once, serially."""

from __future__ import annotations

import asyncio
import tempfile

from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordo.procedures.streams import split_result
from ordo.scheduler.reference import SerialInterpreter
from ordo.log.records import ARIA, Batch
from ordo.storage.digest import digest_pairs
from ordo.storage.keys import encode_key
from ordo.storage.values import encode_value
from ordo.scheduler.worker import PartitionWorker
from tests.test_schedulers_equivalence import REGISTRY, MemoryShard, dependent, engine, request, to_batches


def stamped(log: list[Batch]) -> list[Batch]:
    return [
        Batch(b.batch_id, b.generation, b.time_ms, b.offsets, b.entries, routing=b.routing, ordering=ARIA) for b in log
    ]


def aria_reading(log: list[Batch], registry=REGISTRY):
    """The reference's outcomes, change data and digest, in the form `engine` gives them."""
    reference = SerialInterpreter(registry).apply(log)
    outcomes = [
        (o["batch"], o["txn"], o["id"], o["status"], (o["result"], o.get("steps")), o["error"])
        for o in reference.outcomes
    ]
    changes = sorted((b, i, encode_key(t, k), v) for b, i, t, k, v in reference.changes)
    digest = digest_pairs((k, encode_value(v)) for k, v in reference.state.items())
    return outcomes, changes, digest, reference


def published_changes(log: list[Batch], scheduler: str, registry=REGISTRY) -> list[tuple]:
    """The change data one partition publishes, in its published order."""
    changes = []
    with tempfile.TemporaryDirectory() as data_dir, mock.patch("ordo.scheduler.worker.RocksShard", MemoryShard):
        worker = PartitionWorker(data_dir, 0, 1, scheduler, registry)
        for batch in log:
            result = asyncio.run(worker.execute(batch))
            changes += [(batch.batch_id, i, encode_key(t, k), v) for i, t, k, v in result.changes]
            worker.commit({"batch": batch.batch_id, "cursor": {}})
        worker.close()
    return changes


def in_published_order(reference: SerialInterpreter) -> list[tuple]:
    """The reference's change data as a partition publishes it: the first-pass commits' by
    position (they write distinct keys), then the fallback's in the order it ran."""
    turn = {}
    for b, order in reference.aria_orders.items():
        commits = reference.aria_commits[b]
        published = commits + [i for i in order if i not in set(commits)]
        turn.update(((b, i), n) for n, i in enumerate(published))
    return [
        (b, i, encode_key(t, k), v)
        for b, i, t, k, v in sorted(
            reference.changes, key=lambda c: (c[0], turn.get(c[:2], c[1]), encode_key(c[2], c[3]))
        )
    ]


def check(log: list[Batch], schedulers=("aria", "serial", "locking"), partitions=(1,), registry=REGISTRY):
    expected = aria_reading(log, registry)
    for count in partitions:
        for name in schedulers:  # any engine runs an aria-stamped batch with aria
            outcomes, changes, digest, _ = engine(log, name, count, holding=count > 1, memory=True, registry=registry)
            outcomes = [(*o[:4], split_result(o[4]), o[5]) for o in outcomes]  # a dataflow's steps apart
            assert (outcomes, changes, digest) == expected[:3], (name, count)
    assert published_changes(log, schedulers[0], registry) == in_published_order(expected[3])
    return expected[3]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(request, min_size=1, max_size=20), min_size=1, max_size=3))
def test_every_workload_and_rejection_equals_the_documented_serial_order(drawn):
    check(stamped(to_batches(drawn)), schedulers=("aria",), partitions=(1, 2, 3))


def test_a_read_of_a_key_written_later_in_the_batch_is_ordered_before_the_write():
    """Position 1 reads what 0 writes and commits before it (it sees the starting value);
    2 writes what 0 writes and goes to the fallback, after every first-pass commit; 4 reads
    what 3 writes and comes before 3. Every engine reads the stamped batch alike."""
    setup = Batch(1, 1, 1_000, {}, [["s0", "gs_write", {"keys": [0, 1], "value": 5}]])
    aria = Batch(
        2,
        1,
        2_000,
        {},
        [
            ["a0", "gs_write", {"keys": [0], "value": 6}],
            ["a1", "gs_read", {"keys": [0]}],
            ["a2", "t_div", {"key": 0, "by": 2}],
            ["a3", "gs_write", {"keys": [1], "value": 7}],
            ["a4", "t_guarded", {"key": 2, "guard": 1, "other": 1, "value": 9}],
        ],
        ordering=ARIA,
    )
    reference = check([setup, aria])
    assert reference.aria_orders[2] == [1, 0, 4, 3, 2]
    results = {o["id"]: (o["status"], o["result"]) for o in reference.outcomes}
    assert results["a1"] == ("committed", 5) and results["a4"] == ("committed", 9)
    assert {(k, v) for k, v in reference.state.items()} == {
        (encode_key("gs", 0), 3),
        (encode_key("gs", 1), 7),
        (encode_key("gs", 2), 9),
    }
    *_, fallbacks = engine([setup, aria], "aria", 1, memory=True)
    assert fallbacks == 1


def test_workload_generators_in_aria_batches():
    """The benchmark generators' own streams (OLLP's dependent alias transactions and
    aborting transfers among them) in batches of 150, on every engine."""
    from tests.test_schedulers_equivalence import generated_log

    knobs = {
        "micro": {"partitions": 1, "keys": 60, "hot": 4},
        "sl": {"records": 40},
        "gs": {"records": 40},
        "ob": {"records": 40},
        "tp": {"segments": 4, "vehicles": 80},
        "alias": {"aliases": 8, "accounts": 6},
    }
    log = stamped(generated_log(knobs, seed=3, batch_size=150, stride=7, prefix="g"))
    reference = check(log, schedulers=("aria", "serial", "locking", "vll", "opchain"))
    statuses = {o["status"] for o in reference.outcomes}
    assert {"committed", "aborted"} <= statuses
    *_, fallbacks = engine(log, "aria", 1, memory=True)
    assert 0 < fallbacks < sum(map(len, log))


def test_tpcc_in_aria_batches_keeps_the_consistency_conditions():
    """Declared ranges conflict with the keys written inside them; dependent (OLLP)
    payments by name re-sequence as under any scheduler."""
    from ordo.procedures.registry import default_registry
    from ordo.procedures.workloads import tpcc
    from ordo.procedures.workloads.tpcc_consistency import violations
    from tests.dependent_logs import assert_equals_serial_interpretation, assert_same_run, run_dependent
    from tests.test_tpcc import FULL_MIX, SIZE, _records, _split

    registry = default_registry()
    loads, mix = _split(tpcc.generate(400, seed=7, **SIZE, **FULL_MIX))
    batches = [loads] + [mix[i : i + 60] for i in range(0, len(mix), 60)]
    run = run_dependent(batches, "aria", 1, registry, ordering=ARIA)
    assert violations(_records(run["state"])) == []
    assert_equals_serial_interpretation(run, registry)
    for scheduler, partitions in (("locking", 1), ("aria", 2), ("serial", 3)):
        assert_same_run(
            run_dependent(batches, scheduler, partitions, registry, ordering=ARIA), run, (scheduler, partitions)
        )


def test_the_ordering_stamp_travels_in_the_batch_record_and_old_records_read_as_log_order():
    import pickle

    from ordo.log.records import BATCH, decode, encode_batch, encode_entry

    entries = [encode_entry(["r1", "gs_read", {"keys": [1]}])]
    record = encode_batch(3, 0, 10, {0: (0, 1)}, entries, log_id="L", ordering=ARIA, namespace="n")
    kind, batch = decode(record, "n", "L")
    assert kind == BATCH and batch.ordering == ARIA and batch.entries == [["r1", "gs_read", {"keys": [1]}]]
    assert pickle.loads(pickle.dumps(batch)).ordering == ARIA  # as it travels to a Ray worker
    _, plain = decode(encode_batch(3, 0, 10, {0: (0, 1)}, entries, log_id="L", namespace="n"), "n", "L")
    assert plain.ordering is None and len(plain) == 1


# --- procedures without ANALYZE -----------------------------------------------------------


def _o_transfer(ctx, args):
    """Moves `amount` from a to b unless a has less; a and b may lie on other partitions."""
    if ctx.read("gs", args["a"]) < args["amount"]:
        ctx.abort("insufficient")
    ctx.write("gs", args["a"], ctx.read("gs", args["a"]) - args["amount"])
    ctx.write("gs", args["b"], ctx.read("gs", args["b"]) + args["amount"])


def _o_chase(ctx, args):
    """Which key it increments depends on a value: its keys change when that value does."""
    target = abs(ctx.read("gs", args["key"])) % 6
    ctx.write("gs", target, ctx.read("gs", target) + 1)
    return target


def _o_clear(ctx, args):
    for k in args["keys"]:
        if ctx.read("gs", k) % 2 == 0:
            ctx.delete("gs", k)


def _copy_keys(args):
    return [("gs", args["src"])], [("gs", args["dst"])]


def _copy(ctx, args):
    """Writes one more than it read, into another key: a cycle of copies committed together
    would show in every value."""
    ctx.write("gs", args["dst"], ctx.read("gs", args["src"]) + 1)


def open_registry():
    from ordo.procedures.args import Int, List
    from ordo.procedures.contract import Procedure
    from tests.test_schedulers_equivalence import build_registry

    registry = build_registry()
    registry.add_procedure(Procedure("t_copy", {"src": Int(0), "dst": Int(0)}, _copy_keys, _copy))
    registry.add_procedure(
        Procedure("o_transfer", {"a": Int(0), "b": Int(0), "amount": Int(0, 30)}, None, _o_transfer, home=("gs", "a"))
    )
    registry.add_procedure(Procedure("o_chase", {"key": Int(0)}, None, _o_chase, home=("gs", "key")))
    registry.add_procedure(
        Procedure(
            "o_clear",
            {"keys": List(Int(0), min_len=1, max_len=4)},
            None,
            _o_clear,
            home=lambda args: ("gs", args["keys"][-1]),
        )
    )
    return registry


OPEN = open_registry()
few = st.integers(0, 5)
undeclared = st.one_of(
    st.tuples(
        st.just("o_transfer"), st.builds(lambda a, b, x: {"a": a, "b": b, "amount": x}, few, few, st.integers(0, 30))
    ),
    st.tuples(st.just("o_chase"), st.builds(lambda k: {"key": k}, few)),
    st.tuples(st.just("o_clear"), st.builds(lambda ks: {"keys": ks}, st.lists(few, min_size=1, max_size=3))),
)


copies = st.tuples(
    st.just("t_copy"), st.builds(lambda a, b: {"src": a, "dst": b}, st.integers(0, 2), st.integers(0, 2))
)


# Three keys, every request a copy, a read-modify-write, a guarded write or a delete: most
# batches have WAW, RAW and WAR conflicts at once (and cycles of them), and aborts.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.one_of(copies, dependent), min_size=2, max_size=20), min_size=1, max_size=3))
def test_conflict_heavy_batches_equal_their_documented_serial_order(drawn):
    check(aria_batches(drawn), schedulers=("aria",), partitions=(1, 2, 3, 4), registry=OPEN)


def aria_batches(drawn, registry=OPEN) -> list[Batch]:
    """Batches as an aria sequencer logs them: requests its ANALYZE (or home) refuses, rejected."""
    from ordo.procedures.registry import RequestError

    log, n = [], 0
    for b, requests in enumerate(drawn, start=1):
        entries = []
        for proc, args in requests:
            try:
                registry.analyze(proc, args, ARIA)
                entries.append([f"r{n}", proc, args])
            except RequestError as exc:
                entries.append([f"r{n}", None, str(exc)])
            n += 1
        log.append(Batch(b, 1, 1_000 * b, {}, entries, ordering=ARIA))
    return log


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(st.one_of(undeclared, undeclared, dependent), min_size=2, max_size=20), min_size=1, max_size=3)
)
def test_procedures_without_analyze_equal_the_documented_serial_order(drawn):
    """Mixed with declared ones, on 1 to 4 partitions: remote reads found by running RUN,
    keys that change between the first pass and the fallback, data-dependent deletes."""
    check(aria_batches(drawn), schedulers=("aria", "vll"), partitions=(1, 2, 3, 4), registry=OPEN)


def test_a_procedure_without_analyze_is_placed_by_its_home_until_a_run_finds_its_keys():
    """In an aria batch its home places it, whatever it carries; in log order its home
    until a run has found its keys (tests/test_found_keys.py), then those keys."""
    found = {"key": 1, "@ollp": {"restarts": 0, "reads": [["gs", 1], ["gs", 3]], "writes": [["gs", 3]]}}
    assert OPEN.analyze("o_chase", {"key": 1})[1:] == ((("gs", 1),), ())
    assert OPEN.analyze("o_chase", found)[1:] == ((("gs", 1), ("gs", 3)), (("gs", 3),))
    assert OPEN.analyze("o_chase", found, ARIA)[1:] == ((("gs", 1),), ())


def test_a_fallback_that_reaches_a_new_key_goes_on_to_the_next_round():
    """o_chase's first pass increments gs[0] (gs[0] was 0); a0 writes gs[0] first, so it
    falls back, locked to gs[0]; there gs[0] is 1, so it reaches gs[1]: it writes nothing
    in that round and runs again in the next with gs[1] locked too."""
    log = aria_batches([[("gs_write", {"keys": [0], "value": 1}), ("o_chase", {"key": 0})]])
    for partitions in (1, 2):
        reference = check(log, schedulers=("aria",), partitions=(partitions,), registry=OPEN)
    assert [(o["id"], o["status"], o["result"]) for o in reference.outcomes] == [
        ("r0", "committed", None),
        ("r1", "committed", 1),
    ]
    assert reference.aria_orders[1] == [0, 1, 1]  # a0, then o_chase in two fallback rounds


def test_the_test_engine_runs_an_app_without_analyze_under_aria():
    """ordo.testing.TestEngine stamps its batches as `ordo run --scheduler aria` does."""
    from ordo.testing import TestEngine
    from ordo.procedures.loading import load_registry

    app = load_registry(["examples.ycsbt:app"])
    requests = [{"id": f"t{i}", "proc": "ycsbt_transfer", "args": {"a": i % 5, "b": (i + 1) % 5}} for i in range(40)]
    for partitions in (1, 2):
        with TestEngine(app, "aria", partitions) as engine:
            outcomes = engine.run(requests, batch_size=10)
            assert [o["status"] for o in outcomes] == ["committed"] * 40
            assert [engine.read("ycsbt", k) for k in range(5)] == [1_000_000] * 5  # each gave one, got one 8 times
    with TestEngine(app, "locking") as engine:  # in log order, its first turn finds its keys
        [outcome] = engine.run(requests[:1])
        assert outcome["status"] == "restarted" and outcome["result"]["args"]["@ollp"]["reads"] == [
            ["ycsbt", 0],
            ["ycsbt", 1],
        ]
        assert engine.run([{"id": outcome["id"], **outcome["result"]}])[0]["status"] == "committed"


def test_the_logged_procedure_set_tells_a_procedure_without_analyze_from_one_with_it():
    """An engine whose ycsbt_transfer has ANALYZE must not follow a log sequenced with the
    one without (their requests route and run differently), and the other way round."""
    from ordo.procedures.fingerprint import describe, differences
    from ordo.procedures.loading import load_registry

    without = describe(load_registry(["ordo.procedures.workloads.ycsbt_open"]))
    with_analyze = describe(load_registry(["ordo.procedures.workloads.ycsbt"]))
    assert differences(without, with_analyze) == ["procedure 'ycsbt_transfer' is defined differently"]
    # The example app declares the same procedure by its arguments, in code of its own.
    example = load_registry(["examples.ycsbt:app"])
    open_workload = load_registry(["ordo.procedures.workloads.ycsbt_open"])
    assert differences(describe(open_workload, code=False), describe(example, code=False)) == []
    assert differences(without, describe(example)) == ["procedure 'ycsbt_transfer' is defined differently"]


def test_voter_leaderboards_in_aria_batches():
    """S-Store's voter (a dataflow of triggered procedures and windows, composed into one
    procedure per request) in aria batches of 150, on 1 and 2 partitions and under serial."""
    from ordo.procedures.registry import default_registry
    from tests.test_voter import vote_stream

    registry = default_registry()
    requests = vote_stream(1500, phones=900, seed=3)
    log = aria_batches([[(r["proc"], r["args"]) for r in requests[i : i + 150]] for i in range(0, 1500, 150)], registry)
    reference = check(log, schedulers=("aria", "serial"), partitions=(1, 2), registry=registry)
    assert {o["status"] for o in reference.outcomes} == {"committed", "aborted", "rejected"}
    assert any(len(order) > len(reference.aria_commits[b]) for b, order in reference.aria_orders.items())


def test_a_fallback_whose_keys_keep_changing_is_aborted_saying_so(monkeypatch):
    """With one fallback round allowed, the o_chase of the test above, which needs two, is
    aborted in its own batch with the reason, alike on every layout and in the reading."""
    import ordo.scheduler.aria

    monkeypatch.setattr(ordo.scheduler.aria, "FALLBACK_ROUNDS", 1)
    log = aria_batches([[("gs_write", {"keys": [0], "value": 1}), ("o_chase", {"key": 0})]])
    reference = check(log, schedulers=("aria",), partitions=(1, 2, 3), registry=OPEN)
    assert [(o["id"], o["status"], o["error"]) for o in reference.outcomes] == [
        ("r0", "committed", None),
        (
            "r1",
            "aborted",
            "aria: o_chase reached keys outside those it had touched in each of 1 fallback rounds "
            "(its keys kept changing)",
        ),
    ]
