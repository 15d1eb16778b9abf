"""A log record is valid only where it was written, and a log is read only with the secret
it was written with. Copies are made as a client without the secret makes them: the exact
bytes of genuine records, read from a log with a plain consumer and produced again with a
plain producer."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ordo.client import Client
from ordo.embedded import SequencerThread
from ordo.log.records import SNAPSHOT_EVERY
from ordo.log.secret import forget_key
from ordo.log.reader import LogReader
from ordo.log.records import LogCursor
from ordo.sequencer.sequencer import SequencerConfig
from ordo.broker.topics import ensure_topics
from tests.helpers import read_results, stop
from tests.test_hardening_forgery import deposit_state, expected_state, start_engine
from tests.test_hardening_log import cli, deposits, ended, submit

pytestmark = pytest.mark.slow

SNAPSHOT, START, BATCH = 2, 0, 1  # record kinds, as a client reads them (the first msgpack item)


def raw_records(bootstrap: str, log_topic: str) -> list[tuple[int, int, bytes]]:
    """(offset, kind, bytes) of every record a plain committed reader sees on the log."""
    import msgpack

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "copier",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(log_topic, 0, 0)])
    found = []
    try:
        while True:
            message = consumer.poll(10)
            if message is None or (message.error() and message.error().code() == -191):  # end of the partition
                break
            unpacker = msgpack.Unpacker(strict_map_key=False)
            unpacker.feed(message.value())
            found.append((message.offset(), next(unpacker)[0], message.value()))
    finally:
        consumer.close()
    return found


def append_copies(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    """Produce byte copies with a plain producer; their offsets."""
    producer = Producer({"bootstrap.servers": bootstrap})
    offsets = []
    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=lambda error, message: offsets.append(message.offset()))
        producer.flush(10)
    return offsets


def accepted_ids(bootstrap: str, namespace: str, timeout: float = 60.0) -> list[str]:
    """The ids of every entry of every batch that every reader accepts, to the log's end."""
    reader = LogReader(bootstrap, f"{namespace}.log", LogCursor(), f"{namespace}.check", on_dropped=lambda *_: None)
    ids, idle = [], 0
    try:
        while idle < 10:
            batches = reader.poll(0.5, 1000)
            idle = 0 if batches else idle + 1
            ids += [entry[0] for batch, _ in batches for entry in batch.entries if entry[1] is not None]
    finally:
        reader.close()
    return ids


def sl_deposits(start: int, count: int) -> list[dict]:
    return [
        {
            "id": f"r{i}",
            "proc": "sl_deposit",
            "args": {"account": i % 5, "asset": 0, "account_amount": 1, "asset_amount": 1},
        }
        for i in range(start, start + count)
    ]


def test_copies_of_genuine_snapshots_do_not_move_a_restarting_sequencer_back(broker, namespace, fault_report):
    ensure_topics(broker, namespace)
    config = SequencerConfig(max_txns=2, dedupe_window=40)
    earlier = sl_deposits(0, 2 * (2 * SNAPSHOT_EVERY + 17))
    client = Client(broker, namespace)
    client.submit(earlier)
    first = SequencerThread(broker, namespace, config).start()
    first.wait_for(len(earlier))
    first.stop()
    first.sequencer.close()

    snapshots = [value for _, kind, value in raw_records(broker, f"{namespace}.log") if kind == SNAPSHOT]
    assert len(snapshots) >= 3  # the one after start-up, and one every SNAPSHOT_EVERY batches
    copied_at = append_copies(broker, f"{namespace}.log", [snapshots[0], snapshots[-1]])

    later = sl_deposits(10_000, 60)
    client.submit(later)
    client.close()
    restarted = SequencerThread(broker, namespace, config).start()
    try:
        restarted.wait_for(len(later))
    finally:
        restarted.stop()
        restarted.sequencer.close()
    ids = accepted_ids(broker, namespace)
    fault_report(
        f"byte copies of the first and the latest of {len(snapshots)} genuine snapshot records appended at "
        f"offsets {copied_at}, then the sequencer restarted; checked: each of {len(earlier)} earlier and "
        f"{len(later)} later requests accepted once, in order"
    )
    assert sorted(ids) == sorted(r["id"] for r in earlier + later), "a request lost or sequenced twice"
    assert ids[-len(later) :] == [r["id"] for r in later]


def records_of_another_namespace(broker: str, namespace: str) -> tuple[bytes, bytes]:
    """A genuine start record and batch of another namespace of the same user and secret,
    whose sequencer ran as 2 of 2."""
    other = f"{namespace}-other"
    ensure_topics(broker, other, request_partitions=2)
    client = Client(broker, other)
    client.submit([{**request, "id": f"o{i}"} for i, request in enumerate(sl_deposits(0, 6))])
    client.close()
    sequencer = SequencerThread(broker, other, SequencerConfig(sequencers=2, index=1)).start()
    try:
        sequencer.wait_for(1)
    finally:
        sequencer.stop()
        sequencer.sequencer.close()
    records = raw_records(broker, f"{other}.log")
    start = next(value for _, kind, value in records if kind == START)
    batch = next(value for _, kind, value in records if kind == BATCH)
    return start, batch


@pytest.mark.parametrize("copied", ["start", "batch"])
def test_a_genuine_record_of_another_namespace_is_passed_over_like_a_forgery(
    broker, namespace, tmp_path, copied, fault_report
):
    start, batch = records_of_another_namespace(broker, namespace)
    ensure_topics(broker, namespace)
    data = str(tmp_path / "d")
    engine = start_engine(broker, namespace, data)
    try:
        submit(broker, namespace, deposits(0, 10))
        read_results(broker, f"{namespace}.results", 10, timeout=90)
        (copied_at,) = append_copies(broker, f"{namespace}.log", [start if copied == "start" else batch])
        for round_ in range(6):
            submit(broker, namespace, deposits(100 + 10 * round_, 10))
        results = read_results(broker, f"{namespace}.results", 70, timeout=90)
        assert engine.poll() is None, "the engine stopped"
    finally:
        stop(engine)
        lines = engine.stderr.read()
    ids = [r["id"] for r in results]
    expected = [*range(10), *range(100, 160)]
    fault_report(
        f"a genuine {copied} record of another namespace (its sequencer 2 of 2, same secret) copied to "
        f"offset {copied_at}; checked: {len(expected)} requests answered once, state equal to the "
        f"requests', the record passed over and named"
    )
    assert sorted(ids) == sorted(f"d{i}" for i in expected), "requests lost or answered twice"
    assert deposit_state(data) == expected_state(expected)
    assert f"passed over the record at offset {copied_at} of {namespace}.log: not signed" in lines, lines


def test_a_log_secret_that_does_not_match_stops_in_one_line_and_writes_nothing(
    broker, namespace, tmp_path, monkeypatch, fault_report
):
    ensure_topics(broker, namespace)
    data = str(tmp_path / "d")
    monkeypatch.delenv("ORDO_LOG_SECRET", raising=False)
    monkeypatch.delenv("ORDO_LOG_SECRET_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home-a"))
    engine = start_engine(broker, namespace, data)
    try:
        submit(broker, namespace, deposits(0, 10))
        read_results(broker, f"{namespace}.results", 10, timeout=90)
    finally:
        assert stop(engine) == 0
    before = len(raw_records(broker, f"{namespace}.log"))

    # The secret file is not where the next start looks (another HOME, a container without
    # the volume): a new secret is made there.
    moved = tmp_path / "home-b" / "ordo" / "log-secret"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home-b"))
    engine = start_engine(broker, namespace, data)
    code = ended(engine, 120)
    lines = engine.stderr.read() if code is not None else ""
    stop(engine)
    after = len(raw_records(broker, f"{namespace}.log"))
    fault_report(
        f"the log secret file moved away before a restart of ordo run ({before} log records); checked: "
        f"exit {code}, one line naming the secret file, the log unchanged ({after} records)"
    )
    assert code == 2, lines
    errors = [line for line in lines.splitlines() if line.strip() and not line.startswith("ordo running:")]
    assert len(errors) == 1 and "Traceback" not in lines, lines
    assert f"the file {moved} (this user's, made 20" in errors[0] and "ORDO_LOG_SECRET" in errors[0], lines
    assert after == before, "records were written under the wrong secret"

    # A sequencer alone (`ordo sequence`) and an engine alone (`ordo execute`) say the same.
    for command, where in [("sequence", []), ("execute", ["--data-dir", data, "--runtime", "local"])]:
        done = cli(command, "--bootstrap-servers", broker, "--namespace", namespace, *where, timeout=120)
        errors = [line for line in done.stderr.splitlines() if line.startswith("ordo ") or "Traceback" in line]
        assert done.returncode == 2 and len(errors) == 1, done.stderr
        assert "is not the secret this log was written with" in errors[0] and str(moved) in errors[0], done.stderr
    assert len(raw_records(broker, f"{namespace}.log")) == before


def test_the_log_secret_is_rotated_with_the_earlier_one_kept_for_reading(
    broker, namespace, tmp_path, monkeypatch, fault_report
):
    ensure_topics(broker, namespace)
    data = str(tmp_path / "d")
    secret = tmp_path / "log-secret"
    old, new = "a" * 32, "b" * 32
    secret.write_text(old + "\n")
    monkeypatch.delenv("ORDO_LOG_SECRET", raising=False)
    monkeypatch.setenv("ORDO_LOG_SECRET_FILE", str(secret))
    engine = start_engine(broker, namespace, data)
    try:
        submit(broker, namespace, deposits(0, 10))
        read_results(broker, f"{namespace}.results", 10, timeout=90)
    finally:
        assert stop(engine) == 0

    secret.write_text(f"{new}\n{old}\n")  # the new secret signs; the old one still reads what it signed
    engine = start_engine(broker, namespace, data)
    try:
        submit(broker, namespace, deposits(10, 10))
        results = read_results(broker, f"{namespace}.results", 20, timeout=90)
    finally:
        assert stop(engine) == 0
    # From a fresh data directory (a replay from the log's head) with both secrets: the same.
    fresh = str(tmp_path / "fresh")
    replayed = cli(
        "recover", "--bootstrap-servers", broker, "--namespace", namespace, "--data-dir", fresh, "--idle", "0"
    )
    # Without the old secret, the log's head is refused in one line.
    secret.write_text(new + "\n")
    refused = cli(
        "recover",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "fresh-2"),
        "--idle",
        "0",
    )
    forget_key()
    fault_report(
        "the log secret rotated between two runs (new one signing, old one kept for reading); checked: "
        "20 requests answered once, the state, a replay from the head with both, a refusal with the new alone"
    )
    assert sorted(r["id"] for r in results) == sorted(f"d{i}" for i in range(20))
    assert deposit_state(data) == expected_state(range(20))
    assert replayed.returncode == 0, replayed.stderr
    assert deposit_state(fresh) == expected_state(range(20))
    assert refused.returncode == 2 and "the log began under an earlier secret" in refused.stderr, refused.stderr


def test_copied_start_records_of_the_live_sequencer_and_an_earlier_count_are_passed_over(
    broker, namespace, tmp_path, fault_report
):
    ensure_topics(broker, namespace, request_partitions=2)
    for config in (SequencerConfig(), SequencerConfig(sequencers=2, index=1)):  # as 2 sequencers once
        earlier = SequencerThread(broker, namespace, config).start()
        earlier.stop()
        earlier.sequencer.close()
    data = str(tmp_path / "d")
    engine = start_engine(broker, namespace, data)
    try:
        submit(broker, namespace, deposits(0, 10))
        read_results(broker, f"{namespace}.results", 10, timeout=90)
        starts = [value for _, kind, value in raw_records(broker, f"{namespace}.log") if kind == START]
        live, earlier_count = starts[-1], starts[-2]  # the running sequencer's, sequencer 1 of 2's
        copied_at = append_copies(broker, f"{namespace}.log", [live, earlier_count, live])
        submit(broker, namespace, deposits(100, 40))
        answered = {r["id"] for r in read_results(broker, f"{namespace}.results", 50, timeout=90)}
        assert len(answered) == 50 and engine.poll() is None, "the namespace stalled or stopped at a copy"
    finally:
        stop(engine)
    lines = engine.stderr.read()
    for offset in copied_at:
        assert (
            f"passed over the record at offset {offset} of {namespace}.log: a copy of an earlier start record" in lines
        ), lines
    assert "Traceback" not in lines, lines

    again = start_engine(broker, namespace, data)  # a restart reads past the copies too
    try:
        submit(broker, namespace, deposits(200, 40))
        results = read_results(broker, f"{namespace}.results", 90, timeout=90)
    finally:
        assert stop(again) == 0
    expected = [*range(10), *range(100, 140), *range(200, 240)]
    fault_report(
        f"byte copies of the live sequencer's start record and of sequencer 1 of 2's (an earlier count) "
        f"appended at offsets {copied_at}; checked: each passed over and named, the engine never "
        f"stopped, and after a restart {len(expected)} requests answered once, state equal to the requests'"
    )
    assert sorted(r["id"] for r in results) == sorted(f"d{i}" for i in expected)
    assert deposit_state(data) == expected_state(expected)


def test_a_rotation_done_for_the_sequencer_but_not_the_engine_is_said_in_one_line(
    broker, namespace, tmp_path, monkeypatch, fault_report
):
    """The sequencer signs with a new secret, the engine still has only the old one: the
    engine says once why nothing of the log runs (the rotation half done) instead of one
    warning per record; given the new secret, it answers every request that waited."""
    import subprocess
    import threading
    import time

    from tests.helpers import ordo

    ensure_topics(broker, namespace)
    data = str(tmp_path / "d")
    old, new = "a" * 32, "b" * 32
    monkeypatch.delenv("ORDO_LOG_SECRET_FILE", raising=False)
    where = ("--bootstrap-servers", broker, "--namespace", namespace)
    engine_args = ("execute", *where, "--data-dir", data, "--runtime", "local", "--quiet")

    def started(*args: str, **secrets: str) -> tuple[subprocess.Popen, list[str]]:
        for name in ("ORDO_LOG_SECRET", "ORDO_LOG_SECRET_PREVIOUS"):
            monkeypatch.delenv(name, raising=False)
        for name, value in secrets.items():
            monkeypatch.setenv(name, value)
        process = ordo(*args, stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
        return process, lines

    sequencer, _ = started("sequence", *where, "--quiet", ORDO_LOG_SECRET=old)
    engine, lines = started(*engine_args, ORDO_LOG_SECRET=old)
    try:
        submit(broker, namespace, deposits(0, 5))
        read_results(broker, f"{namespace}.results", 5, timeout=90)
        assert stop(sequencer) == 0
        # The sequencer is rotated (the new secret signs, the old one reads); the engine is not.
        sequencer, _ = started("sequence", *where, "--quiet", ORDO_LOG_SECRET=new, ORDO_LOG_SECRET_PREVIOUS=old)
        for start in range(5, 45, 10):
            submit(broker, namespace, deposits(start, 10))
        deadline = time.monotonic() + 90
        while not any("no record of" in line for line in lines) and time.monotonic() < deadline:
            assert engine.poll() is None, "the engine stopped"
            time.sleep(0.5)
    finally:
        stop(engine)
    said = [line for line in lines if "no record of" in line]
    passed_over = [line for line in lines if "passed over the record" in line]
    try:
        assert len(said) == 1, lines
        assert f"{namespace}.log" in said[0] and "ORDO_LOG_SECRET_PREVIOUS" in said[0], said
        assert "rotated" in said[0] and "nothing is lost" in said[0], said
        assert len(passed_over) <= 3, passed_over  # not one warning per record
        # With the new secret (and the old one for reading), every request that waited is answered.
        engine, lines = started(*engine_args, ORDO_LOG_SECRET=new, ORDO_LOG_SECRET_PREVIOUS=old)
        results = read_results(broker, f"{namespace}.results", 45, timeout=120)
        assert sorted({r["id"] for r in results}) == sorted(f"d{i}" for i in range(45))
    finally:
        stop(engine)
        stop(sequencer)
        forget_key()
    fault_report(
        "the sequencer rotated to a new log secret, the engine not: one line naming the half-done rotation "
        f"({len(passed_over)} per-record warnings), then every one of 45 requests answered once given the secret"
    )
