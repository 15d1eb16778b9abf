"""The lake end to end, through the real CLI: an app with tables, input and output streams
and windows runs 5,000 transactions on `ordo run` (2 partitions); `ordo spark changes` lands
its change data in Delta Lake, is SIGKILLed twice in the middle of a micro-batch and
restarted; the engine is rebuilt at another partition count, which publishes every change
record again. The lake is then read without Spark (delta-rs and DuckDB): its state tables
equal `ordo dump`, its change log holds every change on the topic once, and the state it
gives as of an engine batch equals the serial reading of the log up to that batch."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from ordo.client import Client
from ordo.procedures.registry import default_registry
from ordo.spark_jobs import lake
from tests.helpers import ROOT, dump_state, interpret_log, ordo, ordo_output, reference_state, stop, topic_reader

pytestmark = [pytest.mark.slow]

APP = "tests.every_kind_procedures"
TRANSACTIONS = 5_000


def _requests(count: int, seed: int) -> list[dict]:
    """Plain and dependent transactions, and batches on the input stream that feed a
    dataflow with windows and an output stream."""
    rng = random.Random(seed)
    requests = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.45:
            proc, args = "kind_restock", {"item": rng.randrange(4), "qty": rng.randint(1, 100)}
        elif kind < 0.55:
            proc, args = "kind_name_item", {"name": f"n{rng.randrange(20)}", "item": rng.randrange(4)}
        else:
            batch = [{"item": rng.randrange(4), "qty": rng.randint(1, 100)} for _ in range(rng.randint(1, 3))]
            proc, args = "kind_receive", {"batch": batch}
        requests.append({"id": f"t-{i}", "proc": proc, "args": args})
    return requests


def _spark_changes(broker: str, namespace: str, output: str, checkpoint: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    return subprocess.Popen(
        [sys.executable, "-m", "ordo.cli", "spark", "changes", "--bootstrap-servers", broker, "--namespace", namespace]
        + ["--output", output, "--checkpoint", checkpoint, "--master", "local[2]", *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill_mid_micro_batch(job: subprocess.Popen, after_micro_batches: int, timeout: float = 600) -> str:
    """SIGKILL the job while it writes a micro-batch, once it has written some; returns the
    progress line it was killed at. Generous: on a busy 2-core machine a micro-batch of
    Spark stages can take minutes."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(job.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert job.poll() is None, f"the job ended before it was killed: {lines[-5:]}"
        for line in reversed(lines):
            if line.startswith("ordo-changes: "):
                written = int(line.split(" micro-batch(es) written")[0].rsplit(", ", 1)[1])
                if written >= after_micro_batches and "; now " in line:
                    job.send_signal(signal.SIGKILL)
                    job.wait(30)
                    return line
                break
        time.sleep(0.05)
    job.kill()
    raise AssertionError(f"no micro-batch in progress seen: {lines[-5:]}")


def _topic_changes(bootstrap: str, topic: str) -> list[tuple]:
    """Every change on the topic, once per (batch, txn, part) record, read with kafka-python."""
    consumer = topic_reader(bootstrap, topic, consumer_timeout_ms=3000, isolation_level="read_committed")
    records = {}
    for message in consumer:
        record = json.loads(message.value)
        records[record["batch"], record["txn"], record["part"]] = record
    consumer.close()
    canonical = lambda v: None if v is None else json.dumps(v, separators=(",", ":"), sort_keys=True)  # noqa: E731
    return sorted(
        (b, t, p, seq, c["table"], canonical(c["key"]), canonical(c.get("value")), bool(c.get("deleted")))
        for (b, t, p), record in records.items()
        for seq, c in enumerate(record["changes"])
    )


def _lake_changes(output: str) -> list[tuple]:
    """The change log read by delta-rs, no Spark."""
    rows = (
        lake.delta_dataset(lake.changelog_path(output))
        .to_table(columns=["batch", "txn", "part", "seq", "table", "key", "value", "deleted"])
        .to_pylist()
    )
    return sorted(tuple(r.values()) for r in rows)


def _comparable(state: dict) -> dict:
    return {(table, json.dumps(key, sort_keys=True)): value for (table, key), value in state.items()}


def _lake_state(output: str, tables) -> dict:
    state = {}
    for table in tables:
        for key, value in lake.read_table(output, table).items():
            state[table, json.dumps(list(key) if isinstance(key, tuple) else key, sort_keys=True)] = value
    return state


def test_the_lake_lands_every_change_once_through_kills_and_a_rebuild(broker, namespace, tmp_path):
    data, output, checkpoint = str(tmp_path / "data"), str(tmp_path / "lake"), str(tmp_path / "ck")
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    engine = ordo(
        "run", *kafka, "--data-dir", data, "--procedures", APP, "--partitions", "2", "--max-txns", "100", "--quiet"
    )
    try:
        requests = _requests(TRANSACTIONS, seed=42)
        with Client(broker, namespace) as client:
            client.wait_for_topics(timeout=120)
            client.submit(requests)
            outcomes = client.wait([r["id"] for r in requests], timeout=300)
        assert len(outcomes) == TRANSACTIONS
        assert sum(o["status"] == "committed" for o in outcomes.values()) > TRANSACTIONS // 2
    finally:
        assert stop(engine, timeout=60) == 0
    live = _comparable(dump_state(data))
    assert any(t.startswith("window.") for t, _ in live) and any(t.startswith("stream.") for t, _ in live)

    # Two runs killed in the middle of a micro-batch, a few hundred records at a time.
    small = ("--max-records-per-batch", "400", "--progress-seconds", "0.2", "--optimize-every", "2", "--no-report")
    killed_at = [
        _kill_mid_micro_batch(_spark_changes(broker, namespace, output, checkpoint, *small), n) for n in (1, 2)
    ]

    # The engine rebuilt at one partition publishes every change record again.
    rebuild = ("recover", *kafka, "--data-dir", str(tmp_path / "rebuilt"), "--procedures", APP, "--partitions", "1")
    rebuild += ("--publish",)
    ordo_output(*rebuild, "--idle", "0", "--quiet", timeout=600)
    rebuilt = _comparable(dump_state(str(tmp_path / "rebuilt")))
    assert rebuilt == live

    job = _spark_changes(broker, namespace, output, checkpoint, "--once", "--progress-seconds", "0")
    out, err = job.communicate(timeout=900)
    assert job.returncode == 0, err[-2000:]
    assert "record(s) the lake held already passed over" in out, out

    tables = {t for t, _ in live}
    assert _lake_state(output, tables) == live, f"killed at: {killed_at}"
    topic = _topic_changes(broker, f"{namespace}.changes")
    assert _lake_changes(output) == topic  # every change once
    last_batch = max(row[0] for row in topic)
    assert last_batch >= 30

    # As of an engine batch: the change log's state equals the serial reading up to it.
    registry = default_registry([APP])
    for batch in (last_batch // 3, last_batch):
        reference = _comparable(reference_state(interpret_log(broker, namespace, batch, registry)))
        at = {}
        for table in {t for t, _ in reference} | tables:
            for key, value in lake.state_at(output, table, batch).items():
                at[table, json.dumps(list(key) if isinstance(key, tuple) else key, sort_keys=True)] = value
        assert at == reference, f"state as of batch {batch}"
