"""What `ordo run` says about itself stays true: the lags are counted from where the
engine's readers and the sequencer stand (no lag left over from a killed sequencer or a
transaction marker), a partition worker or a sequencer that stops answering is named with
its pid, and SIGTERM stops the engine within a bound whatever its workers do."""

from __future__ import annotations

import os
import queue
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
from sequencer.kafka import kafka_config
from sequencer.lag import sequencer_group
from sequencer.topics import Topics, ensure_topics
from tests.helpers import ROOT, stop
from tests.test_metrics import scrape, value

pytestmark = pytest.mark.slow


class Engine:
    """`ordo run` as a process, its stderr lines collected as they come."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen([sys.executable, "-m", "ordo.cli", "run", *args], cwd=ROOT,
                                        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
                                        stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._new: queue.Queue = queue.Queue()
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
            assert self.process.poll() is None or time.monotonic() < deadline, self.text()
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r} within {timeout:.0f} s:\n{self.text()}")

    def progress(self) -> list[str]:
        return [line for line in self.lines if line.startswith("batch ")]

    def text(self) -> str:
        return "\n".join(self.lines)

    def sequencers(self) -> list[psutil.Process]:
        return [child for child in psutil.Process(self.process.pid).children()
                if "sequence" in child.cmdline()]


def _deposits(prefix: str, count: int) -> list[dict]:
    return [{"id": f"{prefix}{i}", "proc": "sl_deposit",
             "args": {"account": i, "asset": i, "account_amount": 5, "asset_amount": 5}} for i in range(count)]


def _note_stale_positions(broker: str, namespace: str) -> None:
    """What a sequencer killed before it noted the positions of its last batches leaves in
    its group: older positions, here the very first ones."""
    consumer = Consumer(kafka_config(broker, {"group.id": sequencer_group(namespace), "enable.auto.commit": False}))
    try:
        consumer.commit(offsets=[TopicPartition(Topics(namespace).requests, p, 0) for p in range(2)],
                        asynchronous=False)
    finally:
        consumer.close()


def test_after_a_sequencer_kill_and_restart_an_idle_engine_shows_no_lag(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=2)
    engine = Engine("--bootstrap-servers", broker, "--namespace", namespace, "--data-dir", str(tmp_path / "d"),
                    "--runtime", "local", "--metrics-port", "0")
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
            lags = (value(families, "ordo_log_lag_records", "ordo_log_lag_records"),
                    value(families, "ordo_requests_lag_messages", "ordo_requests_lag_messages"))
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
