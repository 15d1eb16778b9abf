"""Live reads of the state as of one batch (scheduler/reads.py, ordo/live_reads.py), on a
real broker and real engines: never torn across partitions under a stream of transfers,
read-your-writes through `at_least`, bad reads answered with an error, and the log never
holding a read."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from ordo.client import Client
from ordo.live_reads import ReadFailed, ReadTimeout
from ordo.scheduler.reads import Read, Refused, parse_read
from ordo.storage.partitioning import Partitioner
from tests.helpers import ROOT, stop, topic_reader

ACCOUNTS = 24
OPENING = 100


def engine(broker: str, namespace: str, data_dir, scheduler: str, runtime: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    return subprocess.Popen(
        [
            sys.executable, "-m", "ordo.cli", "run", "--bootstrap-servers", broker, "--namespace", namespace,
            "--data-dir", str(data_dir), "--app", "bank:app", "--partitions", "2", "--scheduler", scheduler,
            "--runtime", runtime, "--quiet", "--max-delay-ms", "5",
        ],
        cwd=os.path.join(ROOT, "examples"),
        env=env,
    )  # fmt: skip


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    command = [sys.executable, "-m", "ordo.cli", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def open_accounts(client: Client) -> None:
    client.wait_for_topics()
    ids = [client.submit("deposit", {"account": a, "amount": OPENING}) for a in range(ACCOUNTS)]
    outcomes = client.wait(ids, timeout=120)
    assert all(o["status"] == "committed" for o in outcomes.values())


def transfers(client: Client, stop_at: threading.Event, sent: list) -> None:
    rng = random.Random(7)
    while not stop_at.is_set():
        requests = []
        for _ in range(20):
            src, dst = rng.sample(range(ACCOUNTS), 2)
            requests.append({"proc": "transfer", "args": {"src": src, "dst": dst, "amount": rng.randint(1, 30)}})
        sent.extend(client.submit_many(requests).sent)
        time.sleep(0.01)


def log_values(broker: str, namespace: str) -> list[bytes]:
    return topic_values(broker, f"{namespace}.log")


def topic_values(broker: str, topic: str) -> list[bytes]:
    consumer = topic_reader(broker, topic)
    values: list[bytes] = []
    while polled := consumer.poll(timeout_ms=3000):
        values.extend(record.value or b"" for records in polled.values() for record in records)
    consumer.close()
    assert values
    return values


# -- what a worker makes of a read ---------------------------------------------------------


def test_a_read_names_its_partitions_and_a_bad_read_is_refused_with_why():
    tables = {"account": object()}
    partitioner = Partitioner(2)
    read = parse_read(b'{"id": "r", "table": "account", "keys": [1, 2, 3, 4]}', 1000, tables, partitioner)
    assert isinstance(read, Read) and read.parts == (0, 1) and read.deadline == 11.0
    assert len(read.owners or []) == 4
    scan = parse_read(b'{"id": "s", "table": "account", "scan": {"limit": 5}}', 0, tables, partitioner)
    assert isinstance(scan, Read) and scan.parts == (0, 1) and scan.limit == 5
    for body, why in [
        (b'{"id": "x", "table": "nope", "keys": [1]}', "unknown table 'nope'"),
        (b'{"id": "x", "table": "account", "keys": [true]}', "a key must be an integer"),
        (b'{"id": "x", "table": "account", "keys": []}', "non-empty list"),
        (b'{"id": "x", "table": "account", "scan": {"limit": 100000}}', "1 to 10000 rows"),
        (b'{"id": "x", "table": "account"}', 'either "keys" or "scan"'),
        (b'{"id": "x", "table": "account", "keys": [1], "at_least": -1}', "non-negative integer"),
    ]:
        refused = parse_read(body, 0, tables, partitioner)
        assert isinstance(refused, Refused) and why in refused.error, (body, refused)
    assert parse_read(b"not json", 0, tables, partitioner) is None
    assert parse_read(b'{"table": "account"}', 0, tables, partitioner) is None


# -- on a running engine -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "scheduler,runtime",
    [("serial", "local"), ("locking", "local"), ("vll", "ray"), ("opchain", "local"), ("aria", "local")],
)
def test_reads_during_transfers_always_sum_to_the_total_and_see_their_own_writes(
    broker, namespace, tmp_path, scheduler, runtime, fault_report
):
    process = engine(broker, namespace, tmp_path / "d", scheduler, runtime)
    try:
        with Client(broker, namespace) as client:
            open_accounts(client)
            done, sent = threading.Event(), []
            writer = threading.Thread(target=transfers, args=(client, done, sent), daemon=True)
            writer.start()
            reads, batches, last = 0, set(), 0
            until = time.monotonic() + 6
            try:
                while time.monotonic() < until:
                    found = client.get_many("account", range(ACCOUNTS))
                    assert sum(found.values.values()) == ACCOUNTS * OPENING, f"a torn read at batch {found.batch}"
                    assert found.batch >= last, "a later read saw an earlier batch"
                    last = found.batch
                    scanned = client.scan("account", limit=ACCOUNTS)
                    assert sum(scanned.values.values()) == ACCOUNTS * OPENING and not scanned.more
                    assert list(scanned.values) == sorted(scanned.values)
                    batches.update((found.batch, scanned.batch))
                    reads += 2
            finally:
                done.set()
                writer.join(10)
            outcomes = client.wait(sent, timeout=120)
            assert len(outcomes) == len(sent)
            # Read your own write: a deposit's batch, asked for, shows it.
            deposit = client.submit("deposit", {"account": 3, "amount": 1})
            outcome = client.wait_one(deposit, timeout=60)
            seen = client.get("account", 3, at_least=outcome["batch"])
            assert seen.batch >= outcome["batch"] and seen.value == outcome["result"]
            linear = client.get_many("account", range(ACCOUNTS), consistency="linearizable")
            assert linear.batch >= outcome["batch"] and sum(linear.values.values()) == ACCOUNTS * OPENING + 1
    finally:
        assert stop(process, 60) == 0
    assert len(batches) >= 2, f"the reads saw only batches {sorted(batches)}: none while transfers were applied"
    assert not any(b"read-" in value for value in log_values(broker, namespace)), "a read reached the log"
    fault_report(f"{reads} reads beside {len(sent)} transfers, {len(batches)} batches, none torn")


@pytest.mark.slow
def test_a_bad_read_gets_its_error_and_the_engine_goes_on(broker, namespace, tmp_path):
    process = engine(broker, namespace, tmp_path / "d", "serial", "local")
    try:
        with Client(broker, namespace) as client:
            open_accounts(client)
            for bad, why in [
                (lambda: client.get("nope", 1), "unknown table 'nope'"),
                (lambda: client.scan("account", limit=10**6), "1 to 10000 rows"),
                (lambda: client.scan("account", prefix=[]), "non-empty list of key components"),
            ]:
                with pytest.raises(ReadFailed, match=why):
                    bad()
            with pytest.raises(ValueError, match="a key must be an integer"):
                client.get("account", 1.5)
            page = client.scan("account", limit=10)
            rest = client.scan("account", after=list(page.values)[-1], limit=100)
            assert page.more and not rest.more and len(page.values) + len(rest.values) == ACCOUNTS
            assert client.get("account", 10_000).value == 0  # never written: the table's default
            # Many reads in flight: those asked from answers' callbacks go out gathered in one
            # record, and each still gets its own answer.
            state, found, done = client.state_reader(), [], threading.Event()

            def ask(n: int) -> None:
                key = n % ACCOUNTS
                state.submit("account", keys=[key]).add_done_callback(lambda f: answered(f, n, key))

            def answered(future, n: int, key: int) -> None:
                found.append(future.result().values[key])
                if n + 64 < 2000:
                    ask(n + 64)
                if len(found) == 2000:
                    done.set()

            for n in range(64):
                ask(n)
            assert done.wait(90), f"{len(found)} of 2000 reads answered"
            assert found == [OPENING] * 2000
            assert any(value.startswith(b'{"reads"') for value in topic_values(broker, f"{namespace}.reads"))
            outcome = client.wait_one(client.submit("deposit", {"account": 1, "amount": 5}), timeout=60)
            assert outcome["status"] == "committed"
        kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
        got = cli("get", *kafka, "account", "1", "2", "--at-least", str(outcome["batch"]))
        assert got.returncode == 0, got.stderr
        lines = [json.loads(line) for line in got.stdout.splitlines()]
        assert lines == [
            {"table": "account", "key": 1, "value": OPENING + 5},
            {"table": "account", "key": 2, "value": OPENING},
        ]
        assert int(got.stderr.split("as of batch ")[1].split(";")[0]) >= outcome["batch"]
        scanned = cli("get", *kafka, "account", "--limit", "3")
        assert len(scanned.stdout.splitlines()) == 3 and "more follow" in scanned.stderr
        refused = cli("get", *kafka, "nope", "1")
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert refused.stderr.strip().count("\n") == 0 and "unknown table 'nope'" in refused.stderr
    finally:
        assert stop(process, 60) == 0


@pytest.mark.slow
def test_reads_during_an_engine_sigkill_fail_naming_the_partitions_and_resume_after_the_restart(
    broker, namespace, tmp_path, fault_report
):
    data = tmp_path / "d"
    process = engine(broker, namespace, data, "serial", "local")
    with Client(broker, namespace) as client:
        open_accounts(client)
        now = client.get("account", 1)
        assert now.value == OPENING
        # A batch that does not come: each partition answers, when the read's time is up, with how far it is.
        with pytest.raises(ReadFailed, match=rf"partition [01] had not applied batch {now.batch + 1000} within"):
            client.get_many("account", range(ACCOUNTS), at_least=now.batch + 1000, timeout=2)
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        with pytest.raises(ReadTimeout, match="no answer from the engine of"):
            client.get_many("account", range(ACCOUNTS), timeout=3)
        # A read asked while the engine is down is answered once it is back, within its timeout.
        waiting = client.state_reader().submit("account", keys=list(range(ACCOUNTS)), timeout=90)
        process = engine(broker, namespace, data, "serial", "local")
        try:
            found = waiting.result(100)
            assert sum(found.values.values()) == ACCOUNTS * OPENING
            outcome = client.wait_one(client.submit("deposit", {"account": 2, "amount": 7}), timeout=60)
            assert client.get("account", 2, at_least=outcome["batch"]).value == OPENING + 7
        finally:
            assert stop(process, 60) == 0
    fault_report("a read during the outage timed out; one sent then was answered after the restart")


@pytest.mark.slow
def test_reads_through_a_broker_bounce_fail_within_their_timeout_and_answer_again_after(tmp_path, fault_report):
    from ordo.broker.apache_kafka import KafkaCluster

    kafka = KafkaCluster(data_dir=str(tmp_path / "kafka"))
    bootstrap = kafka.start()
    process = engine(bootstrap, "bounce", tmp_path / "d", "serial", "local")
    try:
        with Client(bootstrap, "bounce") as client:
            open_accounts(client)
            assert sum(client.get_many("account", range(ACCOUNTS)).values.values()) == ACCOUNTS * OPENING
            kafka.nodes[0].stop()
            with pytest.raises(ReadTimeout):
                client.get_many("account", range(ACCOUNTS), timeout=3)
            kafka.restart_node(0)
            back, answered = time.monotonic(), None
            while answered is None and time.monotonic() - back < 120:
                try:
                    answered = client.get_many("account", range(ACCOUNTS), timeout=5)
                except ReadTimeout:
                    continue
            assert answered is not None, "no read was answered within 120 s of the broker's restart"
            assert sum(answered.values.values()) == ACCOUNTS * OPENING
            waited = time.monotonic() - back
        # A write after the bounce, from a client of its own, is read back as of its batch.
        with Client(bootstrap, "bounce") as client:
            outcome = client.wait_one(client.submit("deposit", {"account": 4, "amount": 3}), timeout=180)
            assert client.get("account", 4, at_least=outcome["batch"]).value == OPENING + 3
    finally:
        try:
            assert stop(process, 60) == 0
        finally:
            kafka.stop()
    fault_report(f"a read during the outage timed out; reads answered again {waited:.1f} s after the broker restarted")
