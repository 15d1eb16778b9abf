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
    return subprocess.Popen(
        [sys.executable, "-m", "ordo.cli", "broker", "--port", str(port), "--data-dir", str(data_dir)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


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
        done = subprocess.run(
            [sys.executable, "-m", "ordo.cli", "broker", "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert (done.stdout + done.stderr).splitlines() == [
        f"ordo broker: port {port} on 127.0.0.1 is in use (another broker?): stop that process or choose another --port"
    ]


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


def _produce_kept(bootstrap: str, topic: str, count: int):
    """Produces `count` acknowledged records and returns the producer, still connected."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, value=str(i).encode())
    assert producer.flush(30) == 0
    return producer


def _read_kept(bootstrap: str, topic: str, count: int, timeout: float = 60) -> list[str]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kept", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            values += [m.value().decode() for m in consumer.consume(1000, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return values


@pytest.mark.parametrize("victims", ["launcher", "launcher-and-node"])
def test_a_killed_broker_starts_again_at_once_on_its_port_with_its_data(tmp_path, victims, fault_report):
    """A supervisor restarts a crashed `ordo broker` at once: neither the sockets its node
    left in TIME-WAIT nor a node still shutting down keep the new one off its port."""
    port, data_dir, topic = _free_port(), tmp_path / "kafka", "kept"
    first = _broker(port, data_dir)
    second = None
    try:
        assert first.stdout.readline().startswith(f"broker listening on 127.0.0.1:{port}")
        bootstrap = f"127.0.0.1:{port}"
        # A client still connected when the broker dies: the broker's side of its
        # connection is left in TIME-WAIT on the port.
        producer = _produce_kept(bootstrap, topic, 500)
        nodes = [child.pid for child in psutil.Process(first.pid).children(recursive=True)]
        first.kill()
        if victims == "launcher-and-node":
            for pid in nodes:
                os.kill(pid, signal.SIGKILL)
        first.wait(30)
        second = _broker(port, data_dir)
        said = []
        while not (line := second.stdout.readline()).startswith("broker listening") and line:
            said.append(line.strip())
        assert line.startswith(f"broker listening on 127.0.0.1:{port}"), (said, line, second.wait(30))
        assert all("is still stopping" in line for line in said), said
        kept = _read_kept(bootstrap, topic, 500)
        del producer
        assert kept == [str(i) for i in range(500)], f"{len(kept)} of 500 records after the restart"
        second.send_signal(signal.SIGINT)
        assert second.wait(60) == 0
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    fault_report(
        f"SIGKILL of the {victims.replace('-', ' ')} of `ordo broker --port {port}`, started again at "
        f"once on the same port and data directory: it served ({'; '.join(said) or 'no wait'}), "
        f"500 of 500 acknowledged records read back"
    )
