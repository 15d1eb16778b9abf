"""The client API and `ordo submit --wait`: a client reads only the outcomes of its own
requests, from every partition of <ns>.results; duplicates, lines without a usable id and
lines the broker never took are reported as they are, and nothing waits for the latter."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from ordo.client import AsyncClient, Client
from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT, ordo, stop, topic_reader

pytestmark = pytest.mark.slow


def deposit(request_id: str, account: int = 1) -> dict:
    return {
        "id": request_id,
        "proc": "sl_deposit",
        "args": {"account": account, "asset": 1, "account_amount": 1, "asset_amount": 1},
    }


@pytest.fixture
def engine(broker, namespace, tmp_path):
    """An engine on a namespace whose <ns>.results has two partitions."""
    admin = AdminClient({"bootstrap.servers": broker})
    for future in admin.create_topics([NewTopic(f"{namespace}.results", 2, 1)]).values():
        future.result(30)
    ensure_topics(broker, namespace)
    process = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "data"),
        "--quiet",
        "--runtime",
        "local",
    )
    yield
    assert stop(process) == 0


def submit(broker: str, namespace: str, path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "submit",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--file",
            str(path),
            "--wait",
            *extra,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_lines(path, lines: list) -> None:
    path.write_bytes(
        b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)
    )


def test_submit_wait_prints_only_its_own_outcomes_from_every_results_partition(broker, namespace, engine, tmp_path):
    requests = tmp_path / "r.jsonl"
    write_lines(requests, [deposit(f"a{i}", i) for i in range(12)])
    first = submit(broker, namespace, requests)
    assert first.returncode == 0, first.stderr
    outcomes = [json.loads(line) for line in first.stdout.splitlines()]
    first_batches = {o["batch"] for o in outcomes}
    assert sorted(o["id"] for o in outcomes) == sorted(f"a{i}" for i in range(12))
    assert {o["status"] for o in outcomes} == {"committed"}
    assert first.stderr.strip().endswith("12 committed")

    # The outcomes really are spread over both partitions of <ns>.results.
    consumer = topic_reader(broker, f"{namespace}.results", consumer_timeout_ms=2000)
    assert {message.partition for message in consumer} == {0, 1}
    consumer.close()

    # The same ids again: the answers to this submission (the sequencer's verdict on each
    # copy), not the outcomes of the first one.
    again = submit(broker, namespace, requests)
    assert again.returncode == 1, again.stderr  # every copy was rejected
    outcomes = [json.loads(line) for line in again.stdout.splitlines()]
    assert sorted(o["id"] for o in outcomes) == sorted(f"a{i}" for i in range(12))
    assert min(o["batch"] for o in outcomes) > max(first_batches)
    assert [o["error"] for o in outcomes] == [f"duplicate request id '{o['id']}'" for o in outcomes]
    assert again.stderr.strip().endswith("12 rejected")


def test_submit_wait_reports_duplicates_lines_without_id_and_lines_not_sent(broker, namespace, engine, tmp_path):
    requests = tmp_path / "r.jsonl"
    write_lines(
        requests,
        [
            deposit("x"),
            deposit("x"),
            b"not json",
            {"proc": "sl_deposit", "args": {}},
            json.dumps({**deposit("huge"), "pad": "p" * 2_000_000}).encode(),
            b"",
            deposit("y"),
        ],
    )
    started = time.monotonic()
    done = submit(broker, namespace, requests, "--timeout", "90")
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr  # a line was not sent
    assert elapsed < 60, "waited for a line it never sent"
    notes = done.stderr
    assert "line 5: not sent:" in notes and "huge" not in done.stdout
    assert "line 3 is not a request with a usable 'id': the engine answers it as @" in notes
    assert "line 4 is not a request with a usable 'id': the engine answers it as @" in notes
    assert "id 'x' sent 2 times" in notes
    assert "submitted 5 request(s)" in notes
    outcomes = [json.loads(line) for line in done.stdout.splitlines()]
    by_id: dict[str, list] = {}
    for outcome in outcomes:
        by_id.setdefault(outcome["id"], []).append(outcome)
    assert sorted(o["status"] for o in by_id.pop("x")) == ["committed", "rejected"]
    assert [o["status"] for o in by_id.pop("y")] == ["committed"]
    positional = sorted(by_id.items())
    assert len(positional) == 2 and all(i.startswith("@") for i, _ in positional)
    errors = sorted(o[0]["error"] for _, o in positional)
    assert errors[0].startswith("invalid JSON") and errors[1] == "missing or invalid 'id' (non-empty string)"
    assert notes.strip().splitlines()[-1] == "2 committed, 1 not sent, 3 rejected"


def test_a_message_claiming_an_existing_id_gets_no_second_outcome_under_it(broker, namespace, engine):
    """Malformed messages keyed (or with a body id) of a request that committed are answered
    under their positions, each once; the committed request keeps its one outcome."""
    with Client(broker, namespace) as client:
        client.submit("sl_deposit", deposit("owned")["args"], request_id="owned")
        assert client.wait_one("owned", timeout=60)["status"] == "committed"
        malformed = [
            ("owned", b'{"id": "owned", "proc": "sl_deposit"}'),
            ("owned", b"{not json"),
            ("owned", b'{"id": "owned", "proc": "sl_deposit", "args": {}, "extra": 1}'),
            ("@0:0", json.dumps(deposit("@0:0")).encode()),
        ]
        submission = client.submit_many([*malformed, deposit("after")])
        assert submission.by_position == [0, 1, 2, 3]
        found = client.collect(submission.sent, timeout=60)
        assert [found[i][0]["status"] for i in submission.sent] == ["rejected"] * 4 + ["committed"]
        assert [found[i][0]["error"].split(":")[0] for i in submission.sent[:4]] == [
            "missing field(s)",
            "invalid JSON",
            "unknown field(s)",
            "'id' must not start with '@' (outcomes named by position use it)",
        ]
    every = topic_reader(broker, f"{namespace}.results", consumer_timeout_ms=3000)
    ids = [json.loads(message.value)["id"] for message in every]
    every.close()
    assert ids.count("owned") == 1 and ids.count("after") == 1
    assert sorted(i for i in ids if i.startswith("@")) == sorted(submission.sent[:4])


def test_a_record_nested_too_deep_to_parse_is_unreadable_not_a_crash(broker, namespace):
    """Anyone who can write <ns>.results can put anything there: `submit --wait` reads a
    record it cannot parse as unreadable and goes on waiting for its own outcomes."""
    from kafka import KafkaProducer

    ensure_topics(broker, namespace)
    waiting = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "submit",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--proc",
            "sl_deposit",
            "--args",
            "{}",
            "--id",
            "lonely",
            "--wait",
            "--timeout",
            "15",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _has_records(broker, f"{namespace}.requests"):  # it has sent, so it reads from here on
            assert waiting.poll() is None and time.monotonic() < deadline, waiting.communicate()
            time.sleep(0.2)
        producer = KafkaProducer(bootstrap_servers=broker)
        producer.send(
            f"{namespace}.results",
            key=b"lonely",
            value=b'{"id": "lonely", "result": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        ).get(timeout=30)
        producer.close()
        _, stderr = waiting.communicate(timeout=60)
    finally:
        stop(waiting)
    assert "Traceback" not in stderr and "recursion" not in stderr, stderr[-2000:]
    assert waiting.returncode == 1 and stderr.strip().endswith("1 no outcome yet"), stderr[-2000:]


def _has_records(broker: str, topic: str) -> bool:
    consumer = topic_reader(broker, topic, consumer_timeout_ms=500)
    try:
        return any(True for _ in consumer)
    finally:
        consumer.close()


def test_submit_wait_fails_when_a_request_was_rejected_and_names_the_procedure_meant(
    broker, namespace, engine, tmp_path
):
    requests = tmp_path / "r.jsonl"
    write_lines(requests, [deposit("ok"), {"id": "typo", "proc": "sl_deposti", "args": {}}])
    done = submit(broker, namespace, requests)
    assert done.returncode == 1, done.stderr
    outcomes = {o["id"]: o for o in map(json.loads, done.stdout.splitlines())}
    assert outcomes["typo"]["error"] == "unknown procedure 'sl_deposti' (did you mean 'sl_deposit'?)"
    assert done.stderr.strip().splitlines()[-1] == "1 committed, 1 rejected"
    write_lines(requests, [deposit("fine", 2)])
    assert submit(broker, namespace, requests).returncode == 0


def test_client_submits_waits_and_streams_its_outcomes(broker, namespace, engine):
    with Client(broker, namespace) as client:
        one = client.submit("sl_deposit", deposit("c0")["args"], request_id="c0")
        assert one == "c0"
        assert client.wait_one("c0", timeout=60)["status"] == "committed"
        named = client.submit(proc="sl_deposit", args=deposit("k0", 3)["args"], request_id="k0")  # as documented
        assert client.wait_one(named, timeout=60)["status"] == "committed"
        submission = client.submit_many([deposit("c1"), deposit("c1"), b"[1, 2]"])
        assert submission.ids[:2] == ["c1", "c1"] and submission.ids[2].startswith("@")
        assert submission.duplicates() == {"c1": 2} and submission.by_position == [2]
        found = client.collect(submission.sent, timeout=60)
        assert sorted(o["status"] for o in found["c1"]) == ["committed", "rejected"]
        assert found[submission.ids[2]][0]["error"] == "request must be a JSON object"
        streamed = [o["id"] for o in client.stream(idle=2)]
        assert sorted(streamed) == sorted(["c0", "k0", "c1", "c1", submission.ids[2]])
        with pytest.raises(TimeoutError, match="no outcome for 'never'"):
            client.wait_one("never", timeout=1)

    async def use_async() -> dict:
        client = AsyncClient(broker, namespace)
        request_id = await client.submit("sl_deposit", deposit("c2")["args"], request_id="c2")
        outcome = await client.wait_one(request_id, timeout=60)
        await client.close()
        return outcome

    assert asyncio.run(use_async())["status"] == "committed"


def test_waits_one_after_another_and_at_once_each_see_every_outcome_since_the_first_request(broker, namespace, engine):
    """A client keeps its outcome readers between waits: each wait still reads from the
    client's first request, so an outcome an earlier wait read past is found again, and
    waits from several threads at once each get a reader of their own."""
    with Client(broker, namespace) as client:
        ids = [client.submit("sl_deposit", deposit(f"w{i}", i)["args"], request_id=f"w{i}") for i in range(8)]
        assert client.wait_one(ids[-1], timeout=60)["id"] == ids[-1]
        for request_id in ids[:4]:
            assert client.wait_one(request_id, timeout=60)["id"] == request_id
        found: dict[str, dict] = {}

        def wait(request_id: str) -> None:
            found[request_id] = client.wait_one(request_id, timeout=60)

        threads = [threading.Thread(target=wait, args=(request_id,)) for request_id in ids[4:]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert {request_id: outcome["id"] for request_id, outcome in found.items()} == {i: i for i in ids[4:]}
        assert [o["id"] for o in client.stream(idle=2)].count(ids[0]) == 1


def test_an_outcome_reader_that_fetches_nothing_more_reads_on_with_a_new_consumer(broker, namespace, caplog):
    """A reader kept through a broker restart has been seen to fetch nothing more while its
    partition holds records (broker/fetch_stall.py). Here the reader's partitions are
    paused, a consumer that fetches nothing as that one did: the client finds the outcome
    past its position and reads on with a new consumer."""
    from confluent_kafka import Producer

    ensure_topics(broker, namespace)
    stalled = []

    class StallingClient(Client):
        def _bounded_reader(self, from_beginning, timeout):
            consumer, starts = super()._bounded_reader(from_beginning, timeout)
            if not stalled:
                consumer.pause(consumer.assignment())
                stalled.append(consumer)
            return consumer, starts

    producer = Producer({"bootstrap.servers": broker})
    outcome = {"id": "r-stalled", "status": "committed", "result": 5, "error": None, "batch": 1, "txn": 0}
    producer.produce(f"{namespace}.results", key=b"r-stalled", value=json.dumps(outcome).encode())
    assert producer.flush(10) == 0
    del producer
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="ordo.client"), StallingClient(broker, namespace) as client:
        found = client.outcomes(["r-stalled"], timeout=60)
    assert stalled and found == {"r-stalled": outcome}
    assert time.monotonic() - started >= 10  # the reader was given REFETCH_AFTER first
    assert "fetched nothing for 10 s with records past its position: reading on with a new consumer" in caplog.text
