"""Stops that stop: `ordo run` ends within seconds of SIGTERM whatever its broker does, and
a SIGTERM at any moment of its start-up is a clean stop in one line; nothing is lost (the
log is the truth, and the shards are crash-safe)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ordo.broker.local import free_port, local_broker
from tests.helpers import ROOT, stop
from tests.test_hardening_liveness import Engine
from tests.test_recovery_crash import Feeder, check_against_serial_run, traffic

pytestmark = pytest.mark.slow

# Far above the few seconds a stop takes, far below the 30 s it took with the broker gone:
# the machine running the tests is shared.
STOP_BOUND_S = 20.0


def _stop_lines(engine: Engine, signalled_at: int) -> list[str]:
    """What the engine said once it was asked to stop, progress lines aside."""
    return [line for line in engine.lines[signalled_at:] if not line.startswith("batch ")]


@pytest.mark.parametrize("signalled", ["as the broker goes", "once the broker is said to be away"])
def test_sigterm_stops_ordo_run_within_seconds_with_its_broker_gone_and_nothing_is_lost(
    tmp_path, monkeypatch, signalled
):
    monkeypatch.setenv("ORDO_TRACE_APPLIED", "1")  # for check_against_serial_run
    port = free_port()
    kafka_dir, data_dir = str(tmp_path / "kafka"), str(tmp_path / "d")
    broker = local_broker(port=port, data_dir=kafka_dir)
    bootstrap = broker.start()
    namespace = "gone"
    args = ("--bootstrap-servers", bootstrap, "--namespace", namespace, "--data-dir", data_dir, "--runtime", "local")
    requests = traffic(1200, 1, seed=3)
    engine = Engine(*args, "--quiet")
    try:
        engine.wait_for(r"^ordo serving: ")
        feeder = Feeder(bootstrap, namespace, requests, chunk=100, pause=0.1)
        feeder.start()
        feeder.join(120)  # every request is the broker's: the rest is in flight as it goes
        broker.stop()
        if signalled != "as the broker goes":
            engine.wait_for(r"does not answer; waiting for it", timeout=60)
        signalled_at = len(engine.lines)
        asked = time.monotonic()
        engine.process.send_signal(signal.SIGTERM)
        code = engine.process.wait(60)
        took = time.monotonic() - asked
        time.sleep(0.5)  # the last lines
        print(f"SIGTERM with the broker gone ({signalled}): stopped in {took:.1f} s")
        assert code == 0, engine.text()
        assert took < STOP_BOUND_S, engine.text()
        assert "Traceback" not in engine.text(), engine.text()
        assert len(_stop_lines(engine, signalled_at)) <= 1, engine.text()
    finally:
        stop(engine.process, 60)
        broker.stop()

    # The broker back on its data, the engine again: every request answered once, the state
    # that of a serial reading of the log.
    broker = local_broker(port=port, data_dir=kafka_dir)
    broker.start()
    again = Engine(*args, "--quiet")
    try:
        check_against_serial_run(bootstrap, namespace, data_dir, requests)
    finally:
        assert stop(again.process, 60) == 0, again.text()
        broker.stop()


def test_the_engine_stopped_first_then_the_broker_stops_both_at_once(tmp_path):
    """The README's stop lines, `kill %2; wait %2; kill %1`: the engine, then its broker."""
    port = free_port()
    broker = local_broker(port=port)
    bootstrap = broker.start()
    engine = Engine("--bootstrap-servers", bootstrap, "--namespace", "order", "--data-dir", str(tmp_path / "d"))
    try:
        engine.wait_for(r"^ordo serving: ")
        asked = time.monotonic()
        engine.process.send_signal(signal.SIGTERM)
        assert engine.process.wait(60) == 0, engine.text()
        took = time.monotonic() - asked
        print(f"SIGTERM with the broker up: stopped in {took:.1f} s")
        assert took < STOP_BOUND_S and "Traceback" not in engine.text(), engine.text()
        assert engine.lines[-1].startswith("stopped after batch "), engine.text()
    finally:
        stop(engine.process, 60)
        broker.stop()


def _ordo_run(*args: str) -> subprocess.Popen:
    """`ordo run` as the `ordo` command starts (its stop signals taken before its imports)."""
    return subprocess.Popen(
        [sys.executable, "-m", "ordo", "run", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )


STOP_LINES = ("ordo run: stopped by SIGTERM before it began", "stopped after batch ", "ordo run: stopped ")


@pytest.mark.parametrize("after_s", [0.3, 1.0, 2.0, 3.5, 6.0])
def test_a_sigterm_at_any_moment_of_the_start_up_stops_ordo_run_cleanly(broker, namespace, tmp_path, after_s):
    """During the imports (0.3 s, 1 s), the broker's check and the topics, the engine's
    start and its recovery: status 0, one line of its own, never the default action."""
    engine = _ordo_run(
        "--bootstrap-servers", broker, "--namespace", namespace, "--data-dir", str(tmp_path / "d"), "--runtime", "local"
    )
    time.sleep(after_s)
    asked = time.monotonic()
    engine.send_signal(signal.SIGTERM)
    err = engine.communicate(timeout=60)[1]
    took = time.monotonic() - asked
    print(f"SIGTERM {after_s} s into the start-up: status {engine.returncode} in {took:.1f} s")
    assert engine.returncode == 0, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(STOP_LINES), err
    assert took < STOP_BOUND_S, err


def test_a_sigterm_while_ordo_run_waits_for_its_broker_stops_it_at_once(tmp_path):
    engine = _ordo_run(
        "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d"), "--wait-for-broker", "120"
    )
    time.sleep(3)
    asked = time.monotonic()
    engine.send_signal(signal.SIGTERM)
    err = engine.communicate(timeout=60)[1]
    assert engine.returncode == 0 and err.strip().splitlines() == ["ordo run: stopped by SIGTERM before it began"], err
    assert time.monotonic() - asked < STOP_BOUND_S, err
