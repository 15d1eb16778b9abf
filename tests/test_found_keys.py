"""Procedures without ANALYZE in batches in log order (docs/ollp.md, "Procedures without
ANALYZE"): their first turn runs RUN to find the keys it touches, and the request is
re-sequenced with them. Mixed with ordinary procedures, every log-order scheduler and
partition count decides the same outcomes, state, change data and re-sequenced requests;
the serial interpretation of the log agrees, and so does a plain model that replays the
decided requests one by one in (batch, txn) order."""

from __future__ import annotations

import json
import random
import signal
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordo.client import Client
from ordo.embedded import read_log
from ordo.procedures.contract import Abort
from ordo.procedures.ollp import MAX_RESTARTS, OLLP_FIELD, request_identity
from ordo.scheduler.reference import SerialInterpreter
from ordo.log.records import ARIA
from ordo.broker.topics import ensure_topics
from tests.found_keys_app import KEYS, app
from tests.dependent_logs import _entry, assert_equals_serial_interpretation, assert_same_run, run_dependent
from tests.helpers import dump_state, ordo as ordo_command, ordo_output, read_results, reference_state, stop

REGISTRY = app.registry()
CONFIGS = [
    ("serial", 1),
    ("locking", 2),
    ("vll", 1),
    ("opchain", 2),
    ("serial", 2),
    ("locking", 1),
    ("vll", 2),
    ("opchain", 1),
]

key = st.integers(0, KEYS - 1)
op = st.one_of(
    st.builds(
        lambda ks, v: ("put", {"keys": ks, "value": v}), st.lists(key, min_size=1, max_size=2), st.integers(-5, 12)
    ),
    st.builds(lambda k, m: ("add", {"key": k, "amount": m}), key, st.integers(0, 9)),
    st.builds(lambda a, b, m: ("move", {"a": a, "b": b, "amount": m}), key, key, st.integers(0, 9)),
    st.builds(lambda k, h: ("chase", {"key": k, "hops": h}), key, st.integers(1, 3)),
    st.builds(lambda ks: ("clear", {"keys": ks}), st.lists(key, min_size=1, max_size=3)),
)
logs = st.lists(st.lists(op, min_size=1, max_size=12), min_size=1, max_size=3)


def as_requests(drawn) -> list[list[dict]]:
    out, n = [], 0
    for batch in drawn:
        out.append([])
        for proc, args in batch:
            out[-1].append({"id": f"r{n}", "proc": proc, "args": args})
            n += 1
    return out


class PlainContext:
    """RUN over a plain dictionary, any key allowed: the model knows nothing of sets."""

    def __init__(self, state: dict):
        self.state, self.writes = state, {}

    def read(self, table, key):
        value = self.writes.get((table, key), self.state.get((table, key)))
        return 0 if value is None else value

    def write(self, table, key, value):
        self.writes[(table, key)] = value

    def delete(self, table, key):
        self.writes[(table, key)] = None

    def abort(self, reason):
        raise Abort(reason)


def model(positioned, log_requests) -> tuple[dict, dict]:
    """Replay the decided requests one by one in (batch, txn) order; (outcomes, state)."""
    by_id = {r["id"]: r for batch in log_requests for r in batch}
    state, outcomes = {}, {}
    for _, _, record in positioned:
        request = by_id[record["id"]]
        if record["status"] == "rejected":  # only past the bound on restarts
            assert "times in a row" in record["error"], record
            outcomes[record["id"]] = ("rejected", None)
            continue
        ctx = PlainContext(state)
        try:
            result = REGISTRY.procedures[request["proc"]].run(ctx, dict(request["args"]))
        except Abort:
            outcomes[record["id"]] = ("aborted", None)
            continue
        for where, value in ctx.writes.items():
            if value is None:
                state.pop(where, None)
            else:
                state[where] = value
        outcomes[record["id"]] = ("committed", result)
    return outcomes, state


def check_against_model(run, log_requests) -> None:
    decided = [record["id"] for _, _, record in run["positioned"]]
    assert sorted(decided) == sorted(r["id"] for batch in log_requests for r in batch)  # one outcome each
    outcomes, state = model(run["positioned"], log_requests)
    assert {r["id"]: (r["status"], r["result"]) for _, _, r in run["positioned"]} == outcomes
    assert run["state"] == state


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs)
def test_every_log_order_scheduler_and_partition_count_decides_alike(drawn):
    log_requests = as_requests(drawn)
    first = None
    for scheduler, partitions in CONFIGS:
        run = run_dependent(log_requests, scheduler, partitions, REGISTRY)
        if first is None:
            first = run
            check_against_model(run, log_requests)
            assert_equals_serial_interpretation(run, REGISTRY)
            continue
        assert_same_run(run, first, (scheduler, partitions))


def steps_of(run) -> list[dict]:
    return [json.loads(message)["args"][OLLP_FIELD] for message in run["restarts"]]


def test_a_transfer_without_analyze_takes_one_pass_to_find_its_keys_then_runs():
    """The first turn reads a (its home, stored) and b (outside: read as 0), writes both:
    re-sequenced once with exactly those sets, signed, and committed at the next turn."""
    log = [
        [{"id": "p", "proc": "put", "args": {"keys": [1, 4], "value": 7}}],
        [{"id": "m", "proc": "move", "args": {"a": 1, "b": 4, "amount": 3}}],
    ]
    for scheduler, partitions in (("serial", 1), ("locking", 2)):
        run = run_dependent(log, scheduler, partitions, REGISTRY)
        [step] = steps_of(run)
        assert (step["restarts"], step["reads"], step["writes"]) == (0, [["gs", 1], ["gs", 4]], [["gs", 1], ["gs", 4]])
        assert "sig" in step
        assert [(r["id"], r["status"], r["batch"], r["restarts"]) for r in run["outcomes"]] == [
            ("p", "committed", 1, 0),
            ("m", "committed", 3, 0),
        ]
        assert run["state"] == {("gs", 1): 4, ("gs", 4): 10}


def test_a_run_that_reaches_a_new_key_is_re_sequenced_with_it_and_the_bound_ends_in_a_rejection():
    """chase's keys depend on what it reads. A put before each of its turns sends it
    somewhere new every time: each turn re-sequences it with the key it reached added
    (the sets only grow), and past MAX_RESTARTS it is rejected, saying why."""
    chase_request = {"id": "c", "proc": "chase", "args": {"key": 0, "hops": 1}}
    log = [[chase_request]] + [
        [{"id": f"p{i}", "proc": "put", "args": {"keys": [0], "value": i}}] for i in range(1, MAX_RESTARTS + 3)
    ]
    run = run_dependent(log, "serial", 1, REGISTRY, restarts_first=False)
    steps = steps_of(run)
    assert [s["restarts"] for s in steps] == list(range(MAX_RESTARTS + 1))
    assert steps[0]["reads"] == [["gs", 0]] and steps[0]["writes"] == [["gs", 0]]
    assert steps[-1]["writes"] == [["gs", k] for k in range(MAX_RESTARTS + 1)]
    [outcome] = [r for r in run["outcomes"] if r["id"] == "c"]
    assert outcome["status"] == "rejected"
    assert outcome["error"] == (
        f"chase: its run reached keys outside those found for it {MAX_RESTARTS + 1} "
        f"times in a row (limit {MAX_RESTARTS} restarts)"
    )
    assert_equals_serial_interpretation(run, REGISTRY)
    # Left alone, the same request finds its key in one pass and commits at its second turn.
    calm = run_dependent([[chase_request]], "vll", 2, REGISTRY)
    assert [(r["status"], r["result"], r["restarts"]) for r in calm["outcomes"]] == [("committed", 0, 0)]


def test_a_run_that_stays_within_its_home_decides_at_its_first_turn():
    """clear of one odd key reads only its home and writes nothing: no re-sequencing."""
    log = [
        [{"id": "p", "proc": "put", "args": {"keys": [2], "value": 3}}],
        [{"id": "x", "proc": "clear", "args": {"keys": [2]}}],
    ]
    run = run_dependent(log, "locking", 2, REGISTRY)
    assert run["restarts"] == [] and [r["status"] for r in run["outcomes"]] == ["committed", "committed"]


def test_sets_a_client_gives_are_checked_and_bad_ones_rejected():
    """A client may send the sets itself (no 'sig'): too few keys cost a restart, never a
    wrong result; a malformed record is rejected by the sequencer with the reason."""
    own = {"a": 1, "b": 2, "amount": 0, OLLP_FIELD: {"restarts": 0, "reads": [["gs", 1]], "writes": []}}
    run = run_dependent([[{"id": "m", "proc": "move", "args": own}]], "opchain", 2, REGISTRY)
    [step] = steps_of(run)
    assert (step["reads"], step["writes"]) == ([["gs", 1], ["gs", 2]], [["gs", 1], ["gs", 2]])
    assert [(r["status"], r["restarts"]) for r in run["outcomes"]] == [("committed", 1)]
    for record, reason in (
        ({"restarts": 0, "reads": [["gs", 1]]}, "'@ollp' must be an object with 'restarts', 'reads' and 'writes'"),
        ({"restarts": 0, "reads": [["gs"]], "writes": []}, "'@ollp.reads' must list keys as [table, key] pairs"),
        ({"restarts": 0, "reads": [], "writes": [["nope", 1]]}, "ANALYZE named unknown table 'nope'"),
        ({"restarts": 0, "reads": [["gs", 1.5]], "writes": []}, "'@ollp.reads': "),
    ):
        message = json.dumps({"id": "m", "proc": "move", "args": {"a": 1, "b": 2, "amount": 0, OLLP_FIELD: record}})
        request_id, proc, error = _entry(message.encode(), REGISTRY)
        assert proc is None and error.startswith("move: ") and reason in error, error


def test_a_step_found_in_log_order_is_still_decided_in_an_aria_batch():
    """A request re-sequenced before the namespace moved to --scheduler aria lands in an
    aria batch: its record is set aside and aria runs it within the batch."""
    [step] = run_dependent(
        [[{"id": "m", "proc": "move", "args": {"a": 1, "b": 2, "amount": 0}}]], "serial", 1, REGISTRY
    )["restarts"][:1]
    for partitions in (1, 2):
        run = run_dependent([[json.loads(step)]], "aria", partitions, REGISTRY, ordering=ARIA)
        assert [(r["id"], r["status"], r["restarts"]) for r in run["outcomes"]] == [("m", "committed", 0)]
        assert run["restarts"] == []
        assert_equals_serial_interpretation(run, REGISTRY)


@pytest.mark.slow
def test_ycsbt_without_analyze_through_ordo_run_under_locking_on_two_partitions(broker, namespace, tmp_path):
    """examples/ycsbt.py declares only a home key. `ordo run --scheduler locking` on two
    partitions answers every request once (each after its keys were found: two turns in
    the log), the state is the serial reading's, and a rebuild from scratch under another
    scheduler on one partition gives the same state."""
    from ordo.procedures.loading import load_registry
    from ordo.procedures.workloads import ycsbt

    ensure_topics(broker, namespace, request_partitions=2)
    data_dir = str(tmp_path / "d")
    requests = list(ycsbt.generate(600, seed=5, records=40, partitions=2, mp=0.5))
    client = Client(broker, namespace)
    engine = ordo_command(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--app",
        "examples.ycsbt:app",
        "--scheduler",
        "locking",
        "--partitions",
        "2",
        "--runtime",
        "local",
        "--max-txns",
        "100",
        "--quiet",
    )
    try:
        client.submit(requests)
        records = read_results(broker, f"{namespace}.results", len(requests), timeout=240)
    finally:
        assert stop(engine, timeout=60) == 0
        client.close()
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in requests)  # each once
    assert {r["status"] for r in records} == {"committed"}
    last_batch = max(r["batch"] for r in records)
    log = read_log(broker, namespace, last_batch)
    assert all(b.ordering is None for b in log)
    steps = [entry for b in log for entry in b.entries if OLLP_FIELD in entry[2]]
    assert len(steps) >= len(requests)  # every request's keys found by a turn of its own
    reference = SerialInterpreter(load_registry(["examples.ycsbt:app"])).apply(log)
    assert {r["id"]: r for r in records} == {o["id"]: o for o in reference.outcomes if o["status"] != "restarted"}
    state = dump_state(data_dir)
    assert state == reference_state(reference)
    assert sum(state.values()) == ycsbt.START * len(state)  # transfers move value, never make it
    rebuilt = str(tmp_path / "rebuilt")
    ordo_output(
        "recover",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        rebuilt,
        "--app",
        "examples.ycsbt:app",
        "--scheduler",
        "vll",
        "--partitions",
        "1",
        "--from-scratch",
        "--quiet",
        "--idle",
        "1",
        timeout=240,
    )
    assert dump_state(rebuilt) == state


def mixed_requests(count: int, seed: int) -> list[dict]:
    """The hypothesis test's mix, drawn with a seed: over KEYS keys, most requests contend."""
    draw = random.Random(seed)
    shapes = (
        lambda: ("put", {"keys": [draw.randrange(KEYS)], "value": draw.randint(-5, 12)}),
        lambda: ("add", {"key": draw.randrange(KEYS), "amount": draw.randint(0, 9)}),
        lambda: ("move", {"a": draw.randrange(KEYS), "b": draw.randrange(KEYS), "amount": draw.randint(0, 9)}),
        lambda: ("chase", {"key": draw.randrange(KEYS), "hops": draw.randint(1, 3)}),
        lambda: ("clear", {"keys": [draw.randrange(KEYS), draw.randrange(KEYS)]}),
    )
    out = []
    for n in range(count):
        proc, args = draw.choice(shapes)()
        out.append({"id": f"k{n}", "proc": proc, "args": args})
    return out


@pytest.mark.slow
def test_engine_killed_while_procedures_without_analyze_find_their_keys(broker, namespace, tmp_path, fault_report):
    """SIGKILL the engine twice while requests without ANALYZE are re-sequenced: replayed
    batches publish their steps again, the sequencer drops the repeats, and every request
    ends with one decision (a repeated record is identical), each step in the log once,
    and the decisions replayed in (batch, txn) order by the plain model give the same
    outcomes and state."""
    from kafka import KafkaProducer

    ensure_topics(broker, namespace, request_partitions=2)
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    data_dir = str(tmp_path / "data")
    app_spec = ("--app", "tests.found_keys_app:app")
    engine_args = ("--data-dir", data_dir, "--partitions", "2", "--runtime", "local", "--scheduler", "vll", *app_spec)
    requests = mixed_requests(1500, seed=4)
    sequencer = ordo_command("sequence", *kafka, *app_spec, "--max-txns", "40", "--partitions", "2")
    producer = KafkaProducer(bootstrap_servers=broker)
    try:
        for kill in range(2):
            engine = ordo_command("execute", *kafka, *engine_args)
            sent = [
                producer.send(f"{namespace}.requests", key=r["id"].encode(), value=json.dumps(r).encode())
                for r in requests[kill * 750 : (kill + 1) * 750]
            ]
            producer.flush()
            for future in sent:
                future.get(timeout=30)  # acknowledged by the broker
            time.sleep(1.5 + kill)
            assert engine.poll() is None
            engine.send_signal(signal.SIGKILL)
            engine.wait()
        engine = ordo_command("execute", *kafka, *engine_args)
        try:
            records = read_results(broker, f"{namespace}.results", len(requests), timeout=240)
        finally:
            assert stop(engine) == 0
    finally:
        producer.close()
        stop(sequencer)

    by_id: dict[str, dict] = {}
    for record in records:
        assert by_id.setdefault(record["id"], record) == record  # a repeat is the same decision
    assert set(by_id) == {r["id"] for r in requests}
    last_batch = max(r["batch"] for r in by_id.values())
    identities = [
        request_identity(e[0], e[2])
        for batch in read_log(broker, namespace, last_batch)
        for e in batch.entries
        if e[1] is not None
    ]
    assert len(identities) == len(set(identities))  # every step entered the log once
    steps = sum(1 for identity in identities if "\x00" in identity)
    positioned = sorted(((r["batch"], r["txn"], r) for r in by_id.values()), key=lambda p: p[:2])
    outcomes, state = model(positioned, [requests])
    assert {r["id"]: (r["status"], r["result"]) for r in by_id.values()} == outcomes
    assert dump_state(data_dir) == state
    fault_report(
        f"2 SIGKILLs of the engine (vll, 2 partitions) under {len(requests)} requests, "
        f"{steps} re-sequenced steps: each request decided once, each step in the log once, "
        f"outcomes and state equal to the plain model's"
    )
