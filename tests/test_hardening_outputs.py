"""A refused output stops the engine with one line and its batch is not applied; once the
cause is gone, a restart publishes what was refused and applies the batch: nothing lost.

The refusal here is the engine's producer refusing a change-data record larger than the
message size it was given (`ORDO_KAFKA_MESSAGE_MAX_BYTES`, the engine's own setting): the
local broker does not enforce a topic's max.message.bytes (docs/local-broker.md), and a
refusal before sending takes the same path as one from the broker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, dump_state, read_results, reference_state, sequence_requests, stop, topic_reader

pytestmark = pytest.mark.slow


def _engine(broker: str, namespace: str, data_dir: str, log, **env: str) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ORDO_")}
    return subprocess.Popen(
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
            data_dir,
            "--runtime",
            "local",
            "--quiet",
            "--checkpoint-every",
            "0",
        ],
        cwd=ROOT,
        env={**environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1", **env},
        stderr=log,
    )


def _applied(data_dir: str) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "ordo.cli", "digest", "--data-dir", data_dir],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return int(re.search(r"applied through batch (\d+)", done.stderr).group(1))


def test_a_refused_output_stops_the_engine_unapplied_and_a_restart_loses_nothing(broker, namespace, tmp_path):
    small = [{"id": f"s-{i}", "proc": "micro_rmw", "args": {"keys": [i]}} for i in range(3)]
    wide = [
        {"id": f"w-{i}", "proc": "micro_rmw", "args": {"keys": list(range(100 + 64 * i, 164 + 64 * i))}}
        for i in range(3)
    ]
    # One request partition keeps them in order: batch 1 the small ones, batch 2 the wide
    # ones, each of whose change data (64 changes) is one record of about 2.4 KB.
    last_batch, reference = sequence_requests(broker, namespace, small + wide, max_txns=3, request_partitions=1)
    assert last_batch == 2
    after_first = {key: value for key, value in reference_state(reference).items() if key[1] in range(3)}
    data_dir = str(tmp_path / "d")

    with open(tmp_path / "first.err", "w+") as log:
        engine = _engine(broker, namespace, data_dir, log, ORDO_KAFKA_MESSAGE_MAX_BYTES="2000")
        try:
            code = engine.wait(120)
        finally:
            stop(engine)
        log.seek(0)
        lines = [line for line in log.read().splitlines() if line.strip()]
    assert code == 2
    refused = [line for line in lines if "batch 2" in line and "cannot be sent" in line]
    assert len(refused) == 1 and refused == lines[-1:], lines
    assert "changes" in refused[0] and "restart" in refused[0]
    # Batch 1 is applied only if its own outputs were acknowledged before batch 2 was
    # refused (the worker pipelines): either way nothing of batch 2 reached the shard.
    applied = _applied(data_dir)
    assert applied in (0, 1), "the batch with the refused output was applied"
    assert dump_state(data_dir) == (after_first if applied == 1 else {})

    with open(tmp_path / "second.err", "w") as log:
        engine = _engine(broker, namespace, data_dir, log)
        try:
            results = read_results(broker, f"{namespace}.results", expected=6, timeout=120)
            deadline = time.monotonic() + 60
            while _applied(data_dir) < last_batch and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            assert stop(engine, 60) == 0
    assert {r["id"] for r in results} == {r["id"] for r in small + wide}
    assert {r["status"] for r in results} == {"committed"}
    assert _applied(data_dir) == last_batch
    assert dump_state(data_dir) == reference_state(reference)
    changes = _change_records(broker, f"{namespace}.changes")
    batch_two = [c for c in changes if c["batch"] == 2]
    assert [(c["txn"], c["txns"], c["part"], c["parts"]) for c in batch_two] == [(t, 3, 0, 1) for t in range(3)]
    assert [len(c["changes"]) for c in batch_two] == [64, 64, 64]


def _change_records(bootstrap: str, topic: str) -> list[dict]:
    consumer = topic_reader(bootstrap, topic, consumer_timeout_ms=2000)
    records = {message.key: json.loads(message.value) for message in consumer}  # last per key: replays repeat
    consumer.close()
    return sorted(records.values(), key=lambda c: (c["batch"], c["txn"], c["part"]))
