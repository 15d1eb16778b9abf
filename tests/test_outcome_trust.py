"""What a client reads back is as trustworthy as the broker's ACLs: where clients do not
authenticate, any client can write `<ns>.results`, and the client says so once, before the
first outcome it reads (docs/operations.md, 'What an outcome proves')."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from confluent_kafka import Producer

from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT

WARNING = "where clients do not authenticate"


def test_ordo_submit_warns_once_that_an_outcome_from_an_unauthenticated_broker_may_be_forged(
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
    time.sleep(3)  # no engine runs: the only outcome the client can get is the one forged below
    forger = Producer({"bootstrap.servers": broker})
    forger.produce(
        f"{namespace}.results",
        key=b"r-forged",
        value=json.dumps({"id": "r-forged", "status": "committed", "result": 12345}).encode(),
    )
    forger.flush(10)
    out, err = waiting.communicate(timeout=120)
    # The broker let the forgery through (no ACLs here), and the client cannot tell: it said so.
    assert "12345" in out, (out, err)
    warnings = [line for line in err.splitlines() if WARNING in line]
    assert len(warnings) == 1, err
    assert f"{namespace}.results" in warnings[0] and "PLAINTEXT" in warnings[0] and "ACLs" in warnings[0]
    fault_report(
        "a client without the log secret wrote a forged committed outcome to <ns>.results on a "
        "PLAINTEXT broker: ordo submit --wait printed it, with one warning line naming the missing ACLs"
    )


def test_a_client_that_authenticates_is_not_warned():
    from ordo import client

    client._warned_unauthenticated = False
    client.warn_if_unauthenticated({"security.protocol": "SASL_SSL"}, "ns.results")
    client.warn_if_unauthenticated({"security.protocol": "ssl", "ssl.certificate.location": "/etc/c.pem"}, "ns.results")
    assert client._warned_unauthenticated is False
    client.warn_if_unauthenticated({}, "ns.results")
    assert client._warned_unauthenticated is True
