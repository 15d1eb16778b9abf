"""voter as BENCHMARKS.md defines it: the final state equals an independent serial reading
of the contract (written here from the benchmark's text, not from the workload module),
in-process under every scheduler and partition count, and end to end from an external
kafka-python client through the sequencer and an engine SIGKILLed and restarted, then
replayed by every other scheduler and partition count, read back with `ordo dump`."""

from __future__ import annotations

import json
import random
import signal
import time

import pytest

from ordo.testing import TestEngine
from ordo.procedures.registry import default_registry
from ordo.broker.topics import ensure_topics
from tests.helpers import dump_state, ordo, ordo_output, read_results, stop, topic_reader

VOTER_TABLES = ("voter_count", "voter_phone", "voter_contestant", "voter_board")
INT64 = (-(2**63), 2**63 - 1)


def contract_state(requests: list[dict]) -> tuple[dict, dict]:
    """The contract read serially: (state of the four tables, {id: (status, result, error)})."""
    running = set(range(1, 26))
    phone_vote: dict[int, int] = {}
    votes = {c: 0 for c in range(1, 26)}
    n = 0
    window: list[int] = []  # contestants of validated votes n-99..n after a slide
    staged: list[int] = []
    board: dict[str, list[int]] = {}
    outcomes = {}

    def top3():
        return sorted(running, key=lambda c: (-votes[c], c))[:3]

    def bottom3():
        return sorted(running, key=lambda c: (votes[c], -c))[:3]

    def trending3():
        seen = {c: window.count(c) for c in running if c in window}
        return sorted(seen, key=lambda c: (-seen[c], c))[:3]

    for request in requests:
        args = request.get("args")
        ok = (
            type(args) is dict
            and set(args) == {"phone", "contestant"}
            and type(args["phone"]) is int
            and 2_000_000_000 <= args["phone"] <= 9_999_999_999
            and type(args["contestant"]) is int
            and INT64[0] <= args["contestant"] <= INT64[1]
        )
        if not ok:
            outcomes[request["id"]] = ("rejected", None, None)
            continue
        phone, contestant = args["phone"], args["contestant"]
        if not 1 <= contestant <= 25:
            outcomes[request["id"]] = ("aborted", None, "unknown contestant")
            continue
        if contestant not in running:
            outcomes[request["id"]] = ("aborted", None, "contestant removed")
            continue
        if phone in phone_vote and phone_vote[phone] in running:
            outcomes[request["id"]] = ("aborted", None, "phone already voted")
            continue
        phone_vote[phone] = contestant
        n += 1
        outcomes[request["id"]] = ("committed", n, None)
        votes[contestant] += 1
        staged.append(contestant)
        if n % 10 == 0:
            window = (window + staged)[-100:]
            staged = []
            board["trending3"] = trending3()
        board["top3"], board["bottom3"] = top3(), bottom3()
        if n % 1000 == 0 and len(running) > 1:
            weakest = min(running, key=lambda c: (votes[c], -c))
            running.discard(weakest)
            board["top3"], board["bottom3"], board["trending3"] = top3(), bottom3(), trending3()
    state = {}
    for c in range(1, 26):
        if c not in running:
            state[("voter_contestant", c)] = "removed"
        elif votes[c]:
            state[("voter_count", c)] = votes[c]
    for phone, contestant in phone_vote.items():
        state[("voter_phone", phone)] = contestant
    for name, ids in board.items():
        state[("voter_board", name)] = ids
    return state, outcomes


def vote_stream(count: int, phones: int, seed: int) -> list[dict]:
    """Votes with repeat voters, invalid contestants and bad arguments."""
    rng = random.Random(seed)
    favourites = [rng.randint(1, 25) for _ in range(6)]
    requests = []
    for i in range(count):
        phone = 2_000_000_000 + rng.randrange(phones)
        roll = rng.random()
        if roll < 0.03:
            contestant = rng.choice([0, 26, 99, -4])
        elif roll < 0.5:
            contestant = rng.choice(favourites)
        else:
            contestant = rng.randint(1, 25)
        args: dict = {"phone": phone, "contestant": contestant}
        if roll > 0.985:
            args = rng.choice(
                [
                    {"phone": phone, "contestant": str(contestant)},
                    {"phone": 12345, "contestant": 3},
                    {"phone": phone},
                    {"phone": phone, "contestant": 3, "extra": 1},
                    {"phone": True, "contestant": 3},
                ]
            )
        requests.append({"id": f"v{seed}-{i}", "proc": "voter_vote", "args": args})
    return requests


def wait_for_outcomes(bootstrap: str, topic: str, count: int, timeout: float = 120) -> None:
    """Return as soon as `count` outcome records are on `topic`."""
    consumer = topic_reader(bootstrap, topic)
    seen, deadline = 0, time.monotonic() + timeout
    try:
        while seen < count and time.monotonic() < deadline:
            seen += sum(len(batch) for batch in consumer.poll(timeout_ms=50, max_records=50).values())
    finally:
        consumer.close()


def voter_part(state: dict) -> dict:
    return {key: value for key, value in state.items() if key[0] in VOTER_TABLES}


@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("scheduler", ["serial", "locking", "vll", "opchain"])
def test_in_process_engine_keeps_the_contract(scheduler, partitions):
    requests = vote_stream(2600, phones=1800, seed=3)
    expected, outcomes = contract_state(requests)
    assert ("voter_contestant", 0) not in expected
    assert any(key[0] == "voter_contestant" for key in expected), "the stream must cross n = 1000"
    with TestEngine(default_registry(), scheduler, partitions) as engine:
        got = engine.run(requests, batch_size=150)
        assert voter_part(engine.state()) == expected
    for outcome in got:
        status, result, error = outcomes[outcome["id"]]
        assert outcome["status"] == status
        if status != "rejected":
            assert (outcome["result"], outcome["error"]) == (result, error)


def test_external_client_sigkill_restart_and_every_scheduler_agree(broker, namespace, tmp_path):
    from kafka import KafkaProducer

    requests = vote_stream(2300, phones=1500, seed=11)
    ensure_topics(broker, namespace, request_partitions=1)
    producer = KafkaProducer(bootstrap_servers=broker)
    for request in requests:
        producer.send(f"{namespace}.requests", key=request["id"].encode(), value=json.dumps(request).encode())
    producer.send(f"{namespace}.requests", key=b"v-bad-json", value=b'{"id": "v-bad-json", "proc": "voter_vote", ')
    producer.flush()
    producer.close()
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    sequencer = ordo("sequence", *kafka, "--max-txns", "50")
    data_dir = str(tmp_path / "data")
    engine_args = ("--data-dir", data_dir, "--partitions", "1", "--runtime", "local", "--quiet")
    try:
        engine = ordo("execute", *kafka, *engine_args)
        wait_for_outcomes(broker, f"{namespace}.results", 200)  # then killed in mid-stream
        assert engine.poll() is None
        engine.send_signal(signal.SIGKILL)
        engine.wait()
        decided_before = len({r["id"] for r in read_results(broker, f"{namespace}.results", 1)})
        engine = ordo("execute", *kafka, *engine_args)
        try:
            records = read_results(broker, f"{namespace}.results", len(requests) + 1, timeout=180)
        finally:
            assert stop(engine) == 0
    finally:
        stop(sequencer)
    decided = {}
    for record in records:
        decided.setdefault(record["id"], record)
    # A message that is not a request is answered under its position, not its key (docs/client.md).
    [bad] = [r for i, r in decided.items() if i.startswith("@")]
    assert bad["status"] == "rejected" and bad["error"].startswith("invalid JSON")
    assert decided_before < len(decided), "the engine was killed only after it had decided every vote"
    in_log_order = sorted(
        (r for r in decided.values() if not r["id"].startswith("@")), key=lambda r: (r["batch"], r["txn"])
    )
    by_id = {r["id"]: r for r in requests}
    expected, outcomes = contract_state([by_id[r["id"]] for r in in_log_order])
    assert any(key[0] == "voter_contestant" for key in expected)
    for record in in_log_order:
        status, result, error = outcomes[record["id"]]
        assert record["status"] == status, record
        if status != "rejected":
            assert (record["result"], record["error"]) == (result, error), record
    assert voter_part(dump_state(data_dir)) == expected
    for scheduler, partitions in [
        ("serial", 2),
        ("locking", 1),
        ("locking", 2),
        ("vll", 1),
        ("vll", 2),
        ("opchain", 1),
        ("opchain", 2),
    ]:
        other = str(tmp_path / f"{scheduler}-{partitions}")
        ordo_output(
            "recover",
            *kafka,
            "--data-dir",
            other,
            "--scheduler",
            scheduler,
            "--partitions",
            str(partitions),
            "--runtime",
            "local",
            "--quiet",
            "--idle",
            "2",
            timeout=300,
        )
        assert voter_part(dump_state(other)) == expected, (scheduler, partitions)


def test_bench_voter_reports_votes_per_second_beside_s_store_and_postgresql(tmp_path):
    out = tmp_path / "voter.json"
    text = ordo_output("bench", "voter", "--txns", "1500", "--baseline", "--json", str(out), timeout=300)
    report = json.loads(out.read_text())
    e2e = report["end_to_end"]
    assert e2e["votes_per_s"] > 0 and e2e["ratio_to_s_store"] == round(e2e["votes_per_s"] / 2200, 2)
    assert "x S-Store's 2,200 batches/s" in text and "top3" in text
    assert len(report["leaderboards"]["top3"]) == 3
    # The baseline runs the same dataflow in the same (log) order: the same votes count.
    if "error" not in report["baseline"]:
        assert report["baseline"]["statuses"].get("committed") == e2e["outcomes"]["committed"]
        assert report["baseline"]["votes_per_s"] > 0
