"""The log is the source of truth, so an engine must never follow a log that is not the
one it applied, nor wait silently for one the broker lost: a broker restarted without its
data, a forged record, a replay with other procedures each stop with one clear line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer

from ordo.broker.local import free_port, local_broker
from ordo.broker.clients import kafka_config
from ordo.log.records import encode_start
from ordo.log.reader import log_identity
from ordo.broker.topics import Topics, ensure_topics
from tests.helpers import ROOT, dump_state, ordo, read_results, stop

pytestmark = pytest.mark.slow


def deposits(start: int, count: int) -> str:
    return "".join(
        json.dumps(
            {
                "id": f"d{i}",
                "proc": "sl_deposit",
                "args": {"account": i % 7, "asset": i % 3, "account_amount": 1, "asset_amount": 2},
            }
        )
        + "\n"
        for i in range(start, start + count)
    )


def cli(*args: str, input: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-m", "ordo.cli", *args],
        input=input,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )


def submit(bootstrap: str, namespace: str, lines: str) -> None:
    done = cli("submit", "--bootstrap-servers", bootstrap, "--namespace", namespace, "--file", "-", input=lines)
    assert done.returncode == 0, done.stderr


def ended(process: subprocess.Popen, timeout: float) -> int | None:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def test_a_broker_restarted_without_its_data_stops_the_engine_with_one_line_and_keeps_its_state(tmp_path):
    port = free_port()
    broker = local_broker(port=port)
    bootstrap = broker.start()
    data = str(tmp_path / "d")
    engine = ordo(
        "run",
        "--bootstrap-servers",
        bootstrap,
        "--namespace",
        "lost",
        "--data-dir",
        data,
        "--quiet",
        "--runtime",
        "local",
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)
        submit(bootstrap, "lost", deposits(0, 30))
        assert len({r["id"] for r in read_results(bootstrap, "lost.results", 30, timeout=60)}) == 30
        broker.stop()
        broker = local_broker(port=port)
        broker.start()  # same address, nothing in it: what a memory-only broker's restart is
        code = ended(engine, 90)
        assert code not in (None, 0), "the engine went on as if nothing had happened"
        lines = engine.stderr.read()
        assert "lost the log" in lines, lines
        before = dump_state(data)
        assert sum(v for (table, _), v in before.items() if table == "account") == 30

        # Started again on an empty broker: a new log appears, and the engine that applied
        # the old one refuses it instead of skipping its batches as "repeats".
        broker.stop()
        broker = local_broker(port=port)
        broker.start()
        again = ordo(
            "run",
            "--bootstrap-servers",
            bootstrap,
            "--namespace",
            "lost",
            "--data-dir",
            data,
            "--quiet",
            "--runtime",
            "local",
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(3)
            submit(bootstrap, "lost", deposits(100, 5))
            code = ended(again, 90)
            lines = again.stderr.read() if code is not None else ""
            assert code not in (None, 0), "the engine followed a log it never applied"
            assert "lost the log" in lines or "belongs to log" in lines, lines
        finally:
            stop(again)
        assert dump_state(data) == before
    finally:
        stop(engine)
        broker.stop()


def test_a_forged_start_record_stops_the_engine_instead_of_hiding_every_later_batch(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    data = str(tmp_path / "d")
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data,
        "--quiet",
        "--runtime",
        "local",
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)
        submit(broker, namespace, deposits(0, 10))
        read_results(broker, f"{namespace}.results", 10, timeout=60)
        producer = Producer(kafka_config(broker))
        log_id = log_identity(broker, f"{namespace}.log")
        producer.produce(f"{namespace}.log", encode_start(namespace, log_id, "forged"), partition=0)
        producer.produce(f"{namespace}.log", b"\x00garbage!", partition=0)  # unreadable: skipped alike
        producer.flush(10)
        for round_ in range(8):  # the live sequencer's batches now carry an older generation
            submit(broker, namespace, deposits(1000 + 10 * round_, 10))
            time.sleep(0.3)
        code = ended(engine, 60)
        lines = engine.stderr.read() if code is not None else ""
        assert code not in (None, 0), "the engine ignored later batches without a word"
        assert "did not come from a sequencer" in lines, lines
    finally:
        stop(engine)

    # The way out the message gives: restart the sequencer, and nothing is lost.
    again = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data,
        "--quiet",
        "--runtime",
        "local",
    )
    try:
        results = read_results(broker, f"{namespace}.results", 90, timeout=90)
        assert {r["id"] for r in results} == {f"d{i}" for i in range(10)} | {f"d{i}" for i in range(1000, 1080)}
    finally:
        assert stop(again) == 0
    accounts = sum(v for (table, _), v in dump_state(data).items() if table == "account")
    assert accounts == 90


def run_deposits(broker: str, namespace: str, data: str, count: int, *options: str) -> None:
    """`ordo run` on a new namespace until `count` deposits have their outcomes."""
    ensure_topics(broker, namespace)
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data,
        "--quiet",
        "--runtime",
        "local",
        *options,
    )
    try:
        time.sleep(3)
        submit(broker, namespace, deposits(0, count))
        read_results(broker, f"{namespace}.results", count, timeout=60)
    finally:
        assert stop(engine) == 0


def test_replay_with_other_procedures_is_refused_not_rejected_request_by_request(broker, namespace, tmp_path):
    run_deposits(
        broker, namespace, str(tmp_path / "d"), 5, "--procedures", "tests.hardening_procedures", "--workloads", "sl"
    )
    # The same log replayed by an engine without the module the sequencer had.
    done = cli(
        "recover",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "fresh"),
        "--idle",
        "3",
        "--no-kept-code",  # told to run only the code given (the log keeps the module's code)
    )
    assert done.returncode != 0, done.stderr
    assert "were sequenced with procedure set v1" in done.stderr, done.stderr
    assert "--app-version" in done.stderr and "every batch before 1 is applied" in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 3, done.stderr


def test_shards_holding_state_are_not_wiped_for_a_log_that_cannot_rebuild_them(broker, namespace, tmp_path):
    data = str(tmp_path / "d")
    run_deposits(broker, namespace, data, 12)
    before = dump_state(data)
    assert before

    # What the namespace looks like on a broker that lost it: its topics there, and empty.
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{namespace}.")]
    for future in admin.delete_topics(topics).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while any(t in admin.list_topics(timeout=10).topics for t in topics) and time.monotonic() < deadline:
        time.sleep(0.5)
    ensure_topics(broker, namespace)
    done = cli(
        "recover",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data,
        "--from-scratch",
        "--idle",
        "2",
    )
    assert done.returncode == 2, done.stderr
    assert "not rebuilding the shards from the log" in done.stderr and "holds no record" in done.stderr
    assert dump_state(data) == before


def test_a_transaction_on_the_log_that_never_ends_stops_a_reader_with_one_line(broker, namespace, monkeypatch, caplog):
    from ordo.log import reader as reader_module
    from ordo.log.records import LogCursor, LogError
    from ordo.log.reader import LogReader

    monkeypatch.setattr(reader_module, "WATCH_EVERY", 0.2)
    monkeypatch.setattr(reader_module, "HELD_LIMIT", 2.0)
    # New consumers on the way, each told the last stable offset: still the open transaction.
    monkeypatch.setattr(reader_module, "REFETCH_AFTER", 0.5)

    def transactional(name: str) -> Producer:
        producer = Producer(kafka_config(broker, {"transactional.id": f"{namespace}.{name}"}))
        producer.init_transactions(30)
        return producer

    def commit_start(log: str, token: str) -> None:
        writer.begin_transaction()
        writer.produce(log, encode_start(Topics.namespace_of_log(log), None, token), partition=0)
        writer.commit_transaction(30)

    def hold_back(log: str, holder: str) -> Producer:
        """A transaction that never ends (from a producer that is not a sequencer), then a
        committed record behind it. The holder is returned, so its transaction stays open."""
        producer = transactional(holder)
        producer.begin_transaction()
        producer.produce(log, b"open", partition=0)
        producer.flush(10)
        commit_start(log, f"behind {holder}")
        return producer

    def poll_until_stopped(reader: LogReader) -> str:
        with pytest.raises(LogError) as held:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                reader.poll(0.1)
        return str(held.value)

    log_topic, other_log = f"{namespace}.log", f"{namespace}-b.log"
    ensure_topics(broker, namespace)
    ensure_topics(broker, f"{namespace}-b")
    writer = transactional("writer")
    commit_start(log_topic, "first")
    reader = LogReader(broker, log_topic, LogCursor(), f"{namespace}.held")
    try:
        deadline = time.monotonic() + 4  # at the tail, past HELD_LIMIT: no alarm
        while time.monotonic() < deadline:
            reader.poll(0.1)
        assert reader.cursor.next_offset == 1
        holder = hold_back(log_topic, "foreign")
        message = poll_until_stopped(reader)
        assert "\n" not in message and "never ended" in message and log_topic in message
        assert "committed up to offset 1, and none past offset 2 came" in caplog.text  # a new consumer was told
        assert reader.cursor.next_offset == 1  # nothing past the open transaction was read
    finally:
        reader.close()

    # A reader that has read nothing yet, behind a log's very first transaction, stops alike.
    late = hold_back(other_log, "late")
    behind = LogReader(broker, other_log, LogCursor(), f"{namespace}.held-behind")
    try:
        assert "never ended" in poll_until_stopped(behind)
        assert behind.cursor.next_offset == 0
    finally:
        behind.close()
    del holder, late


def test_a_reader_whose_fetching_stalls_reads_on_with_a_new_consumer(broker, namespace, monkeypatch, caplog):
    """A consumer that stops fetching while the broker serves the log (seen after a broker
    bounce, and once through a new assignment) is replaced; a paused partition, which
    outlives a new assignment, stands in for it."""
    from confluent_kafka import TopicPartition

    from ordo.log import reader as reader_module
    from ordo.log.records import LogCursor
    from ordo.log.reader import LogReader

    monkeypatch.setattr(reader_module, "WATCH_EVERY", 0.2)
    monkeypatch.setattr(reader_module, "REFETCH_AFTER", 1.0)
    log_topic = f"{namespace}.log"
    ensure_topics(broker, namespace)
    writer = Producer(kafka_config(broker, {}))

    def append(token: str) -> None:
        writer.produce(log_topic, encode_start(namespace, None, token), partition=0)
        writer.flush(10)

    def read_up_to(reader: LogReader, offset: int, within: float) -> None:
        deadline = time.monotonic() + within
        while reader.cursor.next_offset < offset and time.monotonic() < deadline:
            reader.poll(0.1)

    append("first")
    reader = LogReader(broker, log_topic, LogCursor(), f"{namespace}.stalled")
    try:
        read_up_to(reader, 1, 30)
        assert reader.cursor.next_offset == 1
        stalled = reader._consumer
        assert stalled is not None
        stalled.pause([TopicPartition(log_topic, 0)])
        for i in range(3):
            append(f"later {i}")
        with caplog.at_level("INFO", logger="ordo.log"):
            read_up_to(reader, 4, 20)
        assert reader.cursor.next_offset == 4
        assert reader._consumer is not stalled
        assert "reading on from there with a new consumer" in caplog.text
        assert "committed up to offset 3" in caplog.text
    finally:
        reader.close()
