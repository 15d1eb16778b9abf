"""Ordo as a Kafka citizen: a Node.js client written as a user writes one (KafkaJS from npm,
no codec plugin, tests/node/client.js) submits requests, reads their outcomes and an output
stream's tuples from what `ordo run` writes with its default settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT, stop

pytestmark = pytest.mark.slow
NODE_DIR = os.path.join(ROOT, "tests", "node")


@pytest.fixture(scope="module")
def node_client() -> str:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are not installed")
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "kafkajs")):
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
    return os.path.join(NODE_DIR, "client.js")


def test_a_kafkajs_client_submits_and_reads_outcomes_and_a_stream(broker, namespace, tmp_path, node_client):
    ensure_topics(broker, namespace, request_partitions=2)
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            str(tmp_path / "d"),
            "--app",
            "inventory:app",
            "--runtime",
            "local",
            "--partitions",
            "2",
            "--quiet",
        ],
        cwd=os.path.join(ROOT, "examples"),
        env=env,
    )
    steps = [
        [{"id": "js-deliver", "proc": "deliver", "args": {"batch": [{"warehouse": 1, "item": 7, "qty": 12}]}}],
        [
            {"id": "js-ship", "proc": "ship", "args": {"warehouse": 1, "item": 7, "qty": 5}},
            {"id": "js-bad", "proc": "ship", "args": {"warehouse": 1, "item": 7}},
        ],
    ]
    try:
        done = subprocess.run(
            ["node", node_client, broker, namespace, "low_stock", json.dumps(steps)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    finally:
        assert stop(engine) == 0
    read = json.loads(done.stdout.strip().splitlines()[-1])
    outcomes = read["outcomes"]
    assert (outcomes["js-deliver"]["status"], outcomes["js-deliver"]["result"]) == ("committed", 1)
    assert (outcomes["js-ship"]["status"], outcomes["js-ship"]["result"]) == ("committed", 7)
    assert outcomes["js-bad"]["status"] == "rejected" and "missing argument(s): qty" in outcomes["js-bad"]["error"]
    assert read["streamed"] == [{"warehouse": 1, "item": 7, "left": 7}]
