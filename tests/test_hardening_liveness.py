"""What `ordo run` says about itself stays true: the lags are counted from where the
engine's readers and the sequencer stand (no lag left over from a killed sequencer or a
transaction marker), a partition worker or a sequencer that stops answering is named with
its pid, and SIGTERM stops the engine within a bound whatever its workers do."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from confluent_kafka import Consumer, TopicPartition

from ordo.client import Client
from ordo.log.probe import ABSENT_GRACE
from ordo.broker.local import free_port, local_broker
from ordo.broker.clients import kafka_config
from ordo.broker.lag import sequencer_group
from ordo.broker.topics import Topics, ensure_topics
from tests.helpers import ROOT, read_results, stop
from tests.test_metrics import scrape, value
from tests.test_recovery_crash import Feeder, check_against_serial_run, traffic

pytestmark = pytest.mark.slow


class Engine:
    """`ordo run` as a process, started as the `ordo` command starts it, its stderr lines
    collected as they come."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ordo", "run", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 120, after: int = 0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines[after:]:
                found = re.search(pattern, line)
                if found:
                    return found
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r} within {timeout:.0f} s:\n{self.text()}")

    def progress(self) -> list[str]:
        return [line for line in self.lines if line.startswith("batch ")]

    def text(self) -> str:
        return "\n".join(self.lines)

    def sequencers(self) -> list[psutil.Process]:
        return [child for child in psutil.Process(self.process.pid).children() if "sequence" in child.cmdline()]


def _deposits(prefix: str, count: int) -> list[dict]:
    return [
        {
            "id": f"{prefix}{i}",
            "proc": "sl_deposit",
            "args": {"account": i, "asset": i, "account_amount": 5, "asset_amount": 5},
        }
        for i in range(count)
    ]


def _note_stale_positions(broker: str, namespace: str) -> None:
    """What a sequencer killed before it noted the positions of its last batches leaves in
    its group: older positions, here the very first ones."""
    consumer = Consumer(kafka_config(broker, {"group.id": sequencer_group(namespace), "enable.auto.commit": False}))
    try:
        consumer.commit(
            offsets=[TopicPartition(Topics(namespace).requests, p, 0) for p in range(2)], asynchronous=False
        )
    finally:
        consumer.close()


def test_after_a_sequencer_kill_and_restart_an_idle_engine_shows_no_lag(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=2)
    engine = Engine(
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "d"),
        "--runtime",
        "local",
        "--metrics-port",
        "0",
    )
    try:
        port = int(engine.wait_for(r"^metrics on http://127\.0\.0\.1:(\d+)/").group(1))
        engine.wait_for(r"^ordo serving: ")
        with Client(broker, namespace) as client:
            assert len(client.wait(client.submit(_deposits("d", 200)), timeout=120)) == 200
        [sequencer] = engine.sequencers()
        sequencer.send_signal(signal.SIGKILL)
        _note_stale_positions(broker, namespace)
        engine.wait_for(r"^sequencer exited with -9; restarting")
        engine.wait_for(r"^sequencer generation 2 resumes")

        deadline = time.monotonic() + 30
        while True:  # the restarted sequencer notes where it stands; the engine stands at the log's end
            families = scrape(port)
            lags = (
                value(families, "ordo_log_lag_records", "ordo_log_lag_records"),
                value(families, "ordo_requests_lag_messages", "ordo_requests_lag_messages"),
            )
            if lags == (0, 0):
                break
            assert time.monotonic() < deadline, (lags, engine.text())
            time.sleep(0.5)
        time.sleep(3)
        shown = len(engine.progress())
        assert engine.progress()[-1].endswith("| log lag 0 | requests lag 0"), engine.text()
        time.sleep(3)
        assert len(engine.progress()) == shown, "progress lines while idle"
    finally:
        assert stop(engine.process, 60) == 0, engine.text()


def _gone(processes: list[psutil.Process], timeout: float = 30) -> list[psutil.Process]:
    """Those of `processes` still running after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_a_stopped_partition_worker_is_named_and_sigterm_still_stops_the_engine(
    broker, namespace, tmp_path, monkeypatch
):
    monkeypatch.setenv("ORDO_TRACE_APPLIED", "1")  # for check_against_serial_run
    seed = 7
    ensure_topics(broker, namespace, request_partitions=2)
    data_dir = str(tmp_path / "d")
    args = (
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--partitions",
        "2",
        "--runtime",
        "ray",
        "--checkpoint-every",
        "5",
    )
    requests = traffic(2000, 2, seed)
    engine = Engine(*args, "--metrics-port", "0")
    pid = None
    try:
        pid = int(engine.wait_for(r"^partition 1: pid (\d+)").group(1))
        port = int(engine.wait_for(r"^metrics on http://127\.0\.0\.1:(\d+)/").group(1))
        engine.wait_for(r"^ordo serving: ")
        feeder = Feeder(broker, namespace, requests, chunk=100, pause=0.05)
        feeder.start()
        time.sleep(1.0)  # under load
        os.kill(pid, signal.SIGSTOP)
        engine.wait_for(rf"^batch .* \| partition 1 \(pid {pid}\) has not answered for \d+ s$", timeout=60)
        silent = value(
            scrape(port), "ordo_unanswered_seconds", "ordo_unanswered_seconds", process="partition 1", pid=str(pid)
        )
        assert silent >= 5
        feeder.join()
        processes = psutil.Process(engine.process.pid).children(recursive=True)
        assert any(p.pid == pid for p in processes)
        asked = time.monotonic()
        engine.process.send_signal(signal.SIGTERM)
        assert engine.process.wait(60) == 2
        took = time.monotonic() - asked
        assert took < 60
        print(f"SIGTERM stopped the engine in {took:.1f} s")
        said = [line for line in engine.lines if line.startswith("ordo run: ")]
        assert len(said) == 1 and f"partition 1 (pid {pid}) has not answered for" in said[0], engine.text()
        assert "restart the engine" in said[0] and "Traceback" not in engine.text()
        assert _gone(processes) == [], "processes left behind"
    finally:
        stop(engine.process, 60)
        if pid is not None and psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)

    # Started again, the engine recovers and ends as if the worker had never stopped.
    again = Engine(*args, "--quiet")
    try:
        read_results(broker, f"{namespace}.results", len(requests), timeout=180)
    finally:
        assert stop(again.process, 60) == 0, again.text()
    check_against_serial_run(broker, namespace, data_dir, requests)


def _unanswered_seconds(port: int, pid: int, until, timeout: float) -> float:
    """ordo_unanswered_seconds of the sequencer `pid` once `until` holds for it, or as last
    scraped when `timeout` ran out (0 while it was not listed)."""
    deadline = time.monotonic() + timeout
    while True:
        listed = [
            s.value
            for s in scrape(port)["ordo_unanswered_seconds"]
            if s.labels.get("process") == "sequencer" and s.labels.get("pid") == str(pid)
        ]
        seconds = listed[0] if listed else 0.0
        if until(seconds) or time.monotonic() >= deadline:
            return seconds
        time.sleep(0.2)


def test_a_stopped_sequencer_is_named_then_replaced(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=2)
    engine = Engine(
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "d"),
        "--runtime",
        "local",
        "--metrics-port",
        "0",
    )
    requests = traffic(1500, 1, 11)
    try:
        port = int(engine.wait_for(r"^metrics on http://127\.0\.0\.1:(\d+)/").group(1))
        engine.wait_for(r"^ordo serving: ")
        feeder = Feeder(broker, namespace, requests, chunk=100, pause=0.1)
        feeder.start()
        time.sleep(1.0)
        [sequencer] = engine.sequencers()
        sequencer.suspend()  # SIGSTOP
        engine.wait_for(rf"^batch .* \| sequencer \(pid {sequencer.pid}\) has not answered for \d+ s$", timeout=30)
        # The line and the metric come from one count of the silence, read at different
        # moments: on a busy machine the heartbeats the sequencer sent before its stop may be
        # read after the line was printed, so the metric is looked at until it lists the
        # silence, which it must before the engine kills the sequencer (SEQUENCER_SILENT_LIMIT).
        silent = _unanswered_seconds(port, sequencer.pid, until=lambda seconds: seconds >= 5, timeout=25)
        assert silent >= 5, engine.text()
        engine.wait_for(rf"^sequencer \(pid {sequencer.pid}\) has not answered for \d+ s; killing it$", timeout=60)
        engine.wait_for(r"^sequencer exited with -9; restarting$")
        assert _gone([sequencer]) == []
        feeder.join()
        results = read_results(broker, f"{namespace}.results", len(requests), timeout=120)
    finally:
        assert stop(engine.process, 60) == 0, engine.text()
    outcomes: dict[str, set] = {}
    for record in results:
        outcomes.setdefault(record["id"], set()).add(json.dumps(record, sort_keys=True))
    assert set(outcomes) == {r["id"] for r in requests}
    assert all(len(copies) == 1 for copies in outcomes.values())


def test_a_broker_restarted_without_its_data_is_said_within_seconds(tmp_path):
    port = free_port()
    broker = local_broker(port=port)
    bootstrap = broker.start()
    engine = Engine(
        "--bootstrap-servers",
        bootstrap,
        "--namespace",
        "gone",
        "--data-dir",
        str(tmp_path / "d"),
        "--runtime",
        "local",
        "--quiet",
    )
    try:
        engine.wait_for(r"^ordo serving: ")
        with Client(bootstrap, "gone") as client:
            assert len(client.wait(client.submit(_deposits("d", 30)), timeout=60)) == 30
        broker.stop()
        broker = local_broker(port=port)
        broker.start()  # same address, nothing in it: another cluster
        back = time.monotonic()
        code = engine.process.wait(60)
        took = time.monotonic() - back
        print(f"the engine stopped {took:.1f} s after the broker came back")
        assert code == 2, engine.text()
        # Said from the other cluster id at once, not from the grace a durable broker that is
        # starting again gets to serve what it had (a wall-clock margin would only measure
        # how busy the machine is: the path taken is what shows).
        assert "is another one now (cluster id" in engine.text(), engine.text()
        assert took < ABSENT_GRACE, engine.text()
        assert "the broker lost the log" in engine.text() and "Traceback" not in engine.text()
    finally:
        stop(engine.process, 60)
        broker.stop()


def test_the_log_watch_asked_now_sees_another_cluster_before_its_next_round(tmp_path):
    """An engine whose outputs a broker refuses (a topic it never had) asks the log's watch
    at once whether the broker lost the log, so the loss is what it says; the watch's own
    rounds may be seconds apart."""
    from ordo.log.probe import LogWatch

    port = free_port()
    broker = local_broker(port=port)
    bootstrap = broker.start()
    ensure_topics(bootstrap, "watched")
    watch = LogWatch(bootstrap, Topics("watched").log, "watched.probe", every=3600)
    try:
        assert watch.answered.wait(30) and watch.cluster is not None
        broker.stop()
        broker = local_broker(port=port)
        broker.start()  # same address, another cluster
        assert watch.lost_cluster() is None  # the next round is an hour away
        asked = time.monotonic()
        watch.ask_now(30)
        assert time.monotonic() - asked < 30
        assert "the broker lost the log" in (watch.lost_cluster() or ""), watch.other_cluster
    finally:
        watch.close()
        broker.stop()


def test_a_record_probe_looks_at_one_record_and_fetches_no_more(broker, namespace):
    """A probe asks whether the broker still holds one record; a consumer left assigned after
    the look would go on fetching every later record of the log, and queue them, until the
    next look (one fetch per batch for each reader's watch and the sequencer's)."""
    from confluent_kafka import Producer

    from ordo.log.probe import RecordProbe, fingerprint

    topics = ensure_topics(broker, namespace)
    producer = Producer(kafka_config(broker))
    for n in range(3):
        producer.produce(topics.log, f"record {n}".encode(), partition=0)
    assert producer.flush(30) == 0
    probe = RecordProbe(broker, topics.log, f"{namespace}.probe")
    try:
        assert probe.holds(1, fingerprint(b"record 1")) is True
        assert probe.holds(2, fingerprint(b"another")) is False
        assert probe._consumer.assignment() == []
    finally:
        probe.close()
