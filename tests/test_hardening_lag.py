"""Requests waiting for the sequencer are visible: broker/lag.py counts them from the
broker, and the engine's progress line shows them while they wait, then falls quiet."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from ordo.client import Client
from ordo.embedded import SequencerThread
from ordo.broker.lag import lag, requests_lag
from ordo.sequencer.sequencer import SequencerConfig
from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT, stop


def test_lag_sums_what_lies_past_the_committed_offsets():
    assert lag({0: 10, 1: 5}, {0: 4, 1: 5}) == 6
    assert lag({0: 10, 1: 5}, {0: -1001}) == 15  # nothing committed yet: from the beginning
    assert lag({0: 3}, {0: 7}) == 0
    assert lag({}, {}) == 0


def _requests(prefix: str, count: int) -> list[dict]:
    return [{"id": f"{prefix}-{i}", "proc": "micro_rmw", "args": {"keys": [i]}} for i in range(count)]


def test_requests_lag_counts_waiting_requests_until_the_sequencer_takes_them(broker, namespace):
    ensure_topics(broker, namespace, request_partitions=2)
    deadline = time.monotonic() + 30
    while (nothing_yet := requests_lag(broker, namespace)) is None and time.monotonic() < deadline:
        time.sleep(0.5)  # a new broker's group coordinator answers "not coordinator" for a moment
    assert nothing_yet == 0
    with Client(broker, namespace) as client:
        for round in range(3):  # three producer batches per partition
            client.submit(_requests(f"r{round}", 10))
    waiting = requests_lag(broker, namespace)
    assert waiting is not None and 1 <= waiting <= 30
    sequencer = SequencerThread(broker, namespace, SequencerConfig()).start()
    try:
        sequencer.wait_for(30)
        deadline = time.monotonic() + 30
        while requests_lag(broker, namespace) != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert requests_lag(broker, namespace) == 0
    finally:
        sequencer.stop()
    assert requests_lag(broker, "no-such-namespace") is None


def _settled_lag(bootstrap: str, namespace: str, timeout: float = 30) -> int | None:
    deadline = time.monotonic() + timeout
    while (waiting := requests_lag(bootstrap, namespace)) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return waiting


def test_steps_published_again_and_dropped_do_not_count_as_waiting(broker, namespace, fault_report):
    from ordo.procedures.ollp import OLLP_FIELD
    from ordo.log.steps import restart_request

    def step(restarts: int) -> tuple[str, bytes]:
        record = json.loads(
            restart_request(
                "t1",
                {
                    "proc": "alias_deposit",
                    "args": {"alias": "a", "amount": 3, OLLP_FIELD: {"restarts": restarts, "assumed": [None]}},
                },
            )
        )
        return "t1", json.dumps(record).encode()

    ensure_topics(broker, namespace, request_partitions=1)
    first = {"id": "t1", "proc": "alias_deposit", "args": {"alias": "a", "amount": 3}}
    with Client(broker, namespace) as client:
        client.submit([("t1", json.dumps(first).encode()), step(0), step(1)])
    sequencer = SequencerThread(broker, namespace, SequencerConfig()).start()
    try:
        sequencer.wait_for(3)
        assert _settled_lag(broker, namespace) == 0
        # What a replay (ordo recover, a second engine) does: the same steps published again,
        # in producer batches of their own. The sequencer drops every one.
        republished = 0
        with Client(broker, namespace) as client:
            for _ in range(5):
                client.submit([step(0), step(1)])
                republished += 2
        time.sleep(1)
        assert sequencer.sequencer.stats.sequenced == 3, "a step published again never enters the log"
        assert _settled_lag(broker, namespace) == 0
    finally:
        sequencer.stop()
    # A restarted sequencer reads them again from the log's positions, drops them again, and
    # shows them taken.
    again = SequencerThread(broker, namespace, SequencerConfig()).start()
    try:
        assert _settled_lag(broker, namespace) == 0
        assert again.sequencer.stats.sequenced == 0
    finally:
        again.stop()
    fault_report(
        f"{republished} steps published again after they were sequenced (then a sequencer restart): "
        f"none entered the log, the requests lag went to 0 both times"
    )


def _progress(path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith("batch ")]


@pytest.mark.slow
def test_progress_line_shows_requests_waiting_and_is_quiet_when_idle(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    log = tmp_path / "engine.err"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ORDO_")},
        "PYTHONPATH": ROOT,
        "PYTHONUNBUFFERED": "1",
    }
    with open(log, "w") as err:
        # The engine alone: no sequencer takes the requests, so they wait.
        engine = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ordo.cli",
                "execute",
                "--bootstrap-servers",
                broker,
                "--namespace",
                namespace,
                "--data-dir",
                str(tmp_path / "d"),
                "--runtime",
                "local",
            ],
            cwd=ROOT,
            env=env,
            stderr=err,
        )
    sequencer = None
    try:
        deadline = time.monotonic() + 60
        while "resumes after batch" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.5)
        assert _progress(log) == [], "a progress line while idle"
        with Client(broker, namespace) as client:
            client.submit(_requests("a", 10))
            client.submit(_requests("b", 10))
        deadline = time.monotonic() + 30
        waiting = []
        while not waiting and time.monotonic() < deadline:
            waiting = [int(n) for line in _progress(log) for n in re.findall(r"requests lag (\d+)", line)]
            time.sleep(0.2)
        assert waiting and max(waiting) >= 1, log.read_text()
        assert all("batch 0 |" in line for line in _progress(log)), "batches ran without a sequencer"

        sequencer = SequencerThread(broker, namespace, SequencerConfig()).start()
        sequencer.wait_for(20)
        deadline = time.monotonic() + 30
        while not any(line.endswith("requests lag 0") for line in _progress(log)) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # everything done: the line falls quiet
        settled = len(_progress(log))
        time.sleep(3)
        assert len(_progress(log)) == settled, "progress lines while idle"
        assert "requests lag 0" in _progress(log)[-1]
    finally:
        if sequencer is not None:
            sequencer.stop()
        stop(engine, 60)
