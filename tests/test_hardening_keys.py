"""No request stops a namespace by its keys: an argument that can be no key is refused
where the app declares it, and any key that cannot be encoded or placed — from a key path,
ANALYZE, a reconnaissance, a home function or a triggered step — is a rejected outcome of
its request alone, in the sequencer and in every engine, under every scheduler and
partition count (docs/keys.md, "Which values are keys")."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ordo
import tests.key_procedures as keyed
from ordo.client import Client
from ordo.procedures.args import Bool, Float, Int, List, Object, Optional, Str
from ordo.procedures.contract import Procedure
from ordo.log.records import Batch
from ordo.broker.topics import ensure_topics
from ordo.storage.keys import key_problem
from ordo.testing import START_MS, TestEngine, check_deterministic
from tests.helpers import ordo as ordo_process
from tests.helpers import stop

NO_KEYS = [
    Optional(Int()),
    Optional(Str()),
    Float(),
    Bool(),
    Object(),
    List(Float()),
    List(Optional(Int(), default=1)),
    List(List(Int())),
    Int(0, 2**64 - 1),
]


@pytest.mark.parametrize("field", NO_KEYS, ids=repr)
@pytest.mark.parametrize("way", ["keys", "reads", "writes", "home"])
def test_an_argument_that_can_be_no_key_is_refused_where_it_is_declared(field, way):
    app = ordo.App("keys")
    given_keys = {"home": ("t", "k")} if way == "home" else {way: [("t", "k")]}
    with pytest.raises(TypeError) as refused:
        app.procedure("pick", args={"k": field}, **given_keys)(lambda ctx, args: None)
    message = str(refused.value)
    assert "'pick'" in message and "'k'" in message and "\n" not in message, message


@pytest.mark.parametrize("field", [Int(), Int(0, 10), Str(), Optional(Int(), default=0), List(Str())], ids=repr)
def test_arguments_that_are_keys_are_accepted(field):
    ordo.App("keys").procedure("pick", args={"k": field}, keys=[("t", "k")])(lambda ctx, args: None)


def test_a_plain_procedure_homed_on_a_float_is_refused():
    with pytest.raises(TypeError, match="home names argument 'x': a Float is no key"):
        Procedure("p", {"x": Float()}, None, lambda ctx, args: None, home=("t", "x"))


@pytest.mark.parametrize(
    "key, problem",
    [
        (None, "got null"),
        (True, "got bool"),
        (1.5, "got float"),
        (2**63, "64 bits"),
        (-(2**63) - 1, "64 bits"),
        ((), "at least one component"),
        ((1, 2.5), "got float"),
        ((1, (2,)), "got tuple"),
        ("\ud800", "Unicode text"),
        (("a", "\udfff"), "Unicode text"),
        ({"a": 1}, "got dict"),
    ],
)
def test_key_problem_names_what_is_wrong(key, problem):
    assert problem in key_problem(key)


@pytest.mark.parametrize("key", [0, -(2**63), 2**63 - 1, "", "ü", (1, "a"), ("a",)])
def test_keys_are_accepted(key):
    assert key_problem(key) is None


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what the wire takes; keys end at 2**63 - 1
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
    max_leaves=6,
)
ANY_PROCEDURES = ["key_analyzed", "key_recon", "key_home", "key_emit"]


def _request(draw_proc: str, value, position: int) -> dict:
    args = {"v": {"k": value}}
    if draw_proc == "key_optional":
        args = {"k": value}
    elif draw_proc == "key_list":
        args = {"ks": value}
    elif draw_proc == "key_pair":
        args = {"a": value, "b": value}
    return {"id": f"r{position}", "proc": draw_proc, "args": args}


REQUESTS = st.lists(
    st.tuples(st.sampled_from(ANY_PROCEDURES + ["key_optional", "key_list", "key_pair"]), JSON), min_size=1, max_size=12
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(REQUESTS)
def test_any_argument_values_get_one_outcome_each_and_every_scheduler_agrees(drawn):
    requests = [_request(proc, value, i) for i, (proc, value) in enumerate(drawn)]
    requests.append({"id": "after", "proc": "key_analyzed", "args": {"v": {"k": "good"}}})
    outcomes = check_deterministic(keyed, requests, batch_size=5, partitions=(1, 2))
    # Aria orders its batches by its own rule, so it is compared with itself across partition counts.
    under_aria = []
    for partitions in (1, 2):
        with TestEngine(keyed, "aria", partitions) as engine:
            under_aria.append((engine.run(requests, 5), engine.state()))
    assert under_aria[0] == under_aria[1]
    for answered in (outcomes, under_aria[0][0]):
        assert [o["id"] for o in answered] == [r["id"] for r in requests]
        assert answered[-1]["status"] == "committed", answered[-1]
        for outcome in answered:
            if outcome["status"] == "rejected":
                assert outcome["error"] and "\n" not in outcome["error"], outcome


@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("scheduler", ["serial", "vll", "opchain", "aria"])
def test_an_engine_rejects_an_unusable_key_a_log_already_holds(partitions, scheduler):
    """A log sequenced before keys were checked holds such an entry: every engine rejects it
    alone, as the sequencer now would, and runs the rest of its batch."""
    entries = [
        ["good-1", "key_analyzed", {"v": {"k": 1}}],
        ["bad", "key_analyzed", {"v": {"k": None}}],
        ["bad-home", "key_home", {"v": {"k": 1.5}}],
        ["good-2", "key_analyzed", {"v": {"k": "two"}}],
    ]
    with TestEngine(keyed, scheduler, partitions) as engine:
        batch = Batch(1, 1, START_MS, {}, entries, ordering=engine.ordering)

        async def every_partition():
            return await asyncio.gather(*(worker.execute(batch) for worker in engine.workers))

        results = asyncio.run(every_partition())
        outcomes = {o.id: o for result in results for o in result.outcomes}
        assert sorted(outcomes) == ["bad", "bad-home", "good-1", "good-2"]
        assert sum(len(result.outcomes) for result in results) == 4  # each reported once
        assert outcomes["bad"].status == "rejected" and "got null" in outcomes["bad"].error
        assert outcomes["bad-home"].status == "rejected" and "got float" in outcomes["bad-home"].error
        assert outcomes["good-1"].status == outcomes["good-2"].status == "committed"


HOSTILE = [None, True, 1.5, 2**63, -(2**63) - 1, [], [[1]], [1.0], {"a": 1}, [1, None], "ok", 7, ["w", 3]]


@pytest.mark.slow
@pytest.mark.parametrize("partitions", ["1", "2"])
def test_ordo_run_answers_every_hostile_key_and_goes_on(broker, namespace, tmp_path, partitions):
    ensure_topics(broker, namespace)
    engine = ordo_process(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "d"),
        "--partitions",
        partitions,
        "--quiet",
        "--procedures",
        "tests.key_procedures",
    )
    try:
        requests = [
            _request(proc, value, i * 100 + j)
            for i, proc in enumerate(ANY_PROCEDURES + ["key_optional", "key_list"])
            for j, value in enumerate(HOSTILE)
        ]
        requests.append({"id": "after", "proc": "key_analyzed", "args": {"v": {"k": "good"}}})
        with Client(broker, namespace) as client:
            ids = client.submit(requests)
            found = client.collect(ids, timeout=180)
        assert engine.poll() is None, "the engine stopped"
        assert set(found) == set(ids), f"no outcome for {sorted(set(ids) - set(found))}"
        assert all(len(found[i]) == 1 for i in ids)
        assert found["after"][0]["status"] == "committed", found["after"]
        statuses = {found[i][0]["status"] for i in ids}
        assert "rejected" in statuses and "committed" in statuses
    finally:
        assert stop(engine, 60) == 0
