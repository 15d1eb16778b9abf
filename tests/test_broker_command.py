"""`ordo broker` (Apache Kafka) in the foreground: a busy port is one line, Ctrl-C stops it
with nothing left running, and a SIGKILL of the command takes its Kafka node with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _broker(port: int, data_dir) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ordo.cli", "broker", "--port", str(port), "--data-dir",
                             str(data_dir)], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_gone(pids: list[int], port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive and not _listening(port):
            return
        time.sleep(0.5)
    raise AssertionError(f"still running: {alive}, port {port} listening: {_listening(port)}")


def test_a_busy_port_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "ordo.cli", "broker", "--port", str(port)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert (done.stdout + done.stderr).splitlines() == [
        f"ordo broker: port {port} on 127.0.0.1 is in use (another broker?): stop that process or choose another --port"]


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_the_broker_leaves_nothing_running_when_it_is_stopped(tmp_path, how):
    port = _free_port()
    broker = _broker(port, tmp_path / "kafka")
    try:
        line = broker.stdout.readline()
        assert line.startswith(f"broker listening on 127.0.0.1:{port} (Apache Kafka"), line
        nodes = [child.pid for child in psutil.Process(broker.pid).children(recursive=True)]
        assert nodes and _listening(port)
        broker.send_signal(how)
        code = broker.wait(60)
        assert code == (0 if how == signal.SIGINT else -signal.SIGKILL)
        _wait_gone(nodes, port)
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
