"""What a client reads back is as trustworthy as the broker's ACLs: where clients do not
authenticate, any client can write `<ns>.results`, and the client says so once per process,
before the first outcome it reads, unless the broker is on this machine's loopback
(docs/operations.md, 'What an outcome proves')."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from ordo.broker.clients import consumer_config
from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT

WARNING = "where clients do not authenticate"


def test_an_outcome_from_an_unauthenticated_broker_may_be_forged_and_loopback_goes_unwarned(
    broker, namespace, fault_report
):
    ensure_topics(broker, namespace, request_partitions=1)
    waiting = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "submit",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--proc",
            "sl_deposit",
            "--args",
            '{"account": 1, "asset": 1, "account_amount": 5, "asset_amount": 5}',
            "--id",
            "r-forged",
            "--wait",
            "--timeout",
            "60",
        ],
        cwd=ROOT,
        env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # No engine runs: the only outcome the client can get is the one forged below, written
    # once its request is on the broker (it notes where the outcomes end before it sends).
    _wait_for_request(broker, f"{namespace}.requests", b"r-forged", waiting)
    forger = Producer({"bootstrap.servers": broker})
    forger.produce(
        f"{namespace}.results",
        key=b"r-forged",
        value=json.dumps({"id": "r-forged", "status": "committed", "result": 12345}).encode(),
    )
    forger.flush(10)
    out, err = waiting.communicate(timeout=120)
    # The broker let the forgery through (no ACLs here), and the client cannot tell. The broker
    # is the test's own on 127.0.0.1, which only this machine reaches: no warning about it.
    assert broker.startswith("127.0.0.1:"), broker
    assert "12345" in out, (out, err)
    assert WARNING not in err, err
    fault_report(
        "a client without the log secret wrote a forged committed outcome to <ns>.results on a "
        "PLAINTEXT broker: ordo submit --wait printed it (on a broker beyond the loopback, with one "
        "warning line naming the missing ACLs)"
    )


def _wait_for_request(broker: str, topic: str, key: bytes, sender: subprocess.Popen) -> None:
    consumer = Consumer(consumer_config(broker, {"group.id": f"{topic}-watch", "enable.auto.commit": False}))
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sender.poll() is None:
            if any(m.error() is None and m.key() == key for m in consumer.consume(100, 0.5)):
                return
        raise AssertionError(f"no request {key!r} on {topic}: {sender.communicate()}")
    finally:
        consumer.close()


def test_a_client_that_authenticates_is_not_warned():
    from ordo import client

    remote = {"bootstrap.servers": "kafka1.example.com:9092"}
    client._warned_unauthenticated = False
    client.warn_if_unauthenticated({**remote, "security.protocol": "SASL_SSL"}, "ns.results")
    client.warn_if_unauthenticated(
        {**remote, "security.protocol": "ssl", "ssl.certificate.location": "/etc/c.pem"}, "ns.results"
    )
    assert client._warned_unauthenticated is False
    client.warn_if_unauthenticated(remote, "ns.results")
    assert client._warned_unauthenticated is True


def test_an_anonymous_client_of_a_remote_broker_is_warned_once_per_process_and_of_a_loopback_one_never():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            """
import logging
from ordo.client import warn_if_unauthenticated
logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
for servers in ["127.0.0.1:9092", "localhost:9092", "[::1]:9092", "127.0.0.1:9092,localhost:9093"]:
    warn_if_unauthenticated({"bootstrap.servers": servers}, "loop.results")
for servers in ["kafka1.example.com:9092", "10.0.0.7:9092", "127.0.0.1:9092,kafka2.example.com:9092"]:
    warn_if_unauthenticated({"bootstrap.servers": servers}, "far.results")
""",
        ],
        cwd=ROOT,
        env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if WARNING in line]
    assert len(warnings) == 1, done.stderr
    assert warnings[0].startswith("WARNING ordo.client: reading outcomes from far.results over PLAINTEXT")


def test_loopback_servers_are_told_from_others():
    from ordo.client import on_loopback

    for servers in ("127.0.0.1:9092", "localhost:9092", "LOCALHOST", "[::1]:9092", "127.0.0.5:1,localhost:2"):
        assert on_loopback(servers), servers
    for servers in (
        "",
        "10.0.0.7:9092",
        "kafka:9092",
        "127.0.0.1:9092,kafka:9092",
        "0.0.0.0:9092",
        "[2001:db8::1]:9092",
    ):
        assert not on_loopback(servers), servers
