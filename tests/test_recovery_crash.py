"""Crash the engine again and again while requests keep flowing, restart it each time,
and compare everything it left behind with the plain serial interpretation of the log:
state digest, the outcome of every request (all copies identical), the change data of
every batch and partition (all copies identical), and every batch applied exactly once
to every shard (ORDO_TRACE_APPLIED counts it in the same WriteBatch)."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

import pytest

from ordo.client import Client
from ordo.state import digest
from ordo.procedures.workloads import micro, sl
from ordo.recovery.checkpoints import CheckpointStore
from ordo.recovery.checks import check_applied_once
from ordo.broker.topics import ensure_topics
from ordo.storage.keys import encode_key
from tests.helpers import ROOT, interpret_log, ordo, read_results, stop, topic_reader

pytestmark = pytest.mark.slow


def traffic(count: int, partitions: int, seed: int) -> list[dict]:
    """Contended counters (a batch applied twice would show) and transfers that abort."""
    requests = []
    for a, b in zip(
        micro.generate(count // 2, seed=seed, partitions=max(partitions, 2), keys=60, hot=3, mp=0.5),
        sl.generate(count // 2, seed=seed + 1, records=30, theta=0.9),
    ):
        requests += [a, b]
    return requests


class Feeder(threading.Thread):
    def __init__(self, broker: str, namespace: str, requests: list[dict], chunk: int, pause: float):
        super().__init__(daemon=True)
        self.client = Client(broker, namespace)
        self.requests, self.chunk, self.pause = requests, chunk, pause

    def run(self) -> None:
        for start in range(0, len(self.requests), self.chunk):
            self.client.submit(self.requests[start : start + self.chunk])
            time.sleep(self.pause)
        self.client.close()


def read_topic(bootstrap: str, topic: str) -> list[tuple[str, bytes]]:
    """Every record of a topic, read with kafka-python until it is quiet."""
    consumer = topic_reader(bootstrap, topic, consumer_timeout_ms=2000)
    records = [(message.key.decode(), message.value) for message in consumer]
    consumer.close()
    return records


def check_against_serial_run(broker: str, namespace: str, data_dir: str, requests: list[dict]) -> dict:
    results = read_results(broker, f"{namespace}.results", len(requests), timeout=60)
    copies = defaultdict(list)
    for record in results:
        copies[record["id"]].append(record)
    assert set(copies) == {r["id"] for r in requests}
    for request_id, outcomes in copies.items():
        assert all(o == outcomes[0] for o in outcomes), outcomes
    last_batch = max(r["batch"] for r in results)
    reference = interpret_log(broker, namespace, last_batch)
    assert {request_id: outcomes[-1] for request_id, outcomes in copies.items()} == {
        o["id"]: o for o in reference.outcomes
    }

    change_copies = defaultdict(set)
    change_records = read_topic(broker, f"{namespace}.changes")
    for key, value in change_records:
        change_copies[key].add(value)
    assert all(len(values) == 1 for values in change_copies.values()), "a replay re-emitted different change data"
    parts = {key: json.loads(next(iter(values))) for key, values in change_copies.items()}
    txns = {p["batch"]: p["txns"] for p in parts.values()}
    assert sorted(txns) == list(range(1, last_batch + 1))
    assert {(p["batch"], p["txn"]) for p in parts.values()} == {(b, t) for b, n in txns.items() for t in range(n)}
    changes = sorted(
        ((p["batch"], p["txn"], c["table"], c["key"], c["value"]) for p in parts.values() for c in p["changes"]),
        key=lambda c: (c[0], c[1], encode_key(c[2], c[3])),
    )
    assert changes == reference.changes

    assert digest(data_dir) == (reference.digest(), last_batch)
    check_applied_once(data_dir, last_batch)
    return {
        "batches": last_batch,
        "re-emitted outcomes": len(results) - len(copies),
        "re-emitted change records": len(change_records) - len(change_copies),
    }


def engine_log(tmp_path, name: str):
    return open(tmp_path / f"{name}.log", "w+")


def started(log_path, engine, timeout: float = 60) -> None:
    """Wait until `engine` said it resumes (its SIGTERM handler is in place by then)."""
    deadline = time.monotonic() + timeout
    while "resumes after batch" not in log_path.read_text():
        assert engine.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.1)


def crash_seed() -> tuple[int, random.Random]:
    """Random kill points, repeatable: ORDO_CRASH_SEED=<printed seed> replays a run."""
    seed = int(os.environ.get("ORDO_CRASH_SEED", time.time_ns() % 100_000))
    print(f"ORDO_CRASH_SEED={seed}")
    return seed, random.Random(seed)


def logs_text(tmp_path) -> str:
    return "".join(path.read_text() for path in sorted(tmp_path.glob("*.log")))


@pytest.mark.parametrize("partitions", [1, 2])
def test_engine_sigkilled_again_and_again_ends_as_if_it_never_crashed(
    broker, namespace, tmp_path, monkeypatch, partitions
):
    monkeypatch.setenv("ORDO_TRACE_APPLIED", "1")
    seed, rng = crash_seed()
    ensure_topics(broker, namespace, request_partitions=2)
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    data_dir = str(tmp_path / "data")
    engine_args = (
        "--data-dir",
        data_dir,
        "--partitions",
        str(partitions),
        "--runtime",
        "local",
        "--checkpoint-every",
        "3",
        "--keep-checkpoints",
        "2",
    )
    requests = traffic(6000, partitions, seed)
    sequencer = ordo("sequence", *kafka, "--max-txns", "40")
    feeder = Feeder(broker, namespace, requests, chunk=100, pause=0.1)
    feeder.start()
    kills = 0
    try:
        for kill in range(10):
            from_checkpoint = rng.random() < 0.3 and CheckpointStore(data_dir, partitions).latest() is not None
            with engine_log(tmp_path, f"engine-{kill}") as log:
                extra = ("--from-checkpoint",) if from_checkpoint else ()
                engine = ordo("execute", *kafka, *engine_args, *extra, stderr=log)
                time.sleep(rng.uniform(0.5, 3.0))  # start-up, restore, replay, steady state: all get hit
                assert engine.poll() is None, logs_text(tmp_path)
                engine.send_signal(signal.SIGKILL)
                engine.wait()
                kills += 1
        feeder.join()
        with engine_log(tmp_path, "engine-final") as log:
            engine = ordo("execute", *kafka, *engine_args, stderr=log)
            try:
                read_results(broker, f"{namespace}.results", len(requests), timeout=120)
                # Every result may be in before this engine is up (an earlier one finished the
                # work): the clean stop under test is that of a started engine.
                started(tmp_path / "engine-final.log", engine)
            finally:
                assert stop(engine) == 0, logs_text(tmp_path)
        # And the CLI recovery path: restore the newest checkpoint, replay to the head, exit.
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ordo.cli",
                "recover",
                *kafka,
                "--data-dir",
                data_dir,
                "--runtime",
                "local",
                "--from-checkpoint",
                "--idle",
                "2",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "restored every shard from the checkpoint of batch" in done.stderr
    finally:
        stop(sequencer)
    assert kills == 10
    summary = check_against_serial_run(broker, namespace, data_dir, requests)
    text = logs_text(tmp_path)
    print(
        summary,
        {
            "restores": text.count("restored every shard"),
            "rebuilds": text.count("wiped the shards"),
            "disagreements": text.count("shards stopped at different batches"),
            "unfinished checkpoints cleaned": len(re.findall(r"removed .*checkpoints.*by a crash", text)),
        },
    )


def test_a_killed_ray_worker_stops_the_engine_and_a_restart_recovers(broker, namespace, tmp_path, monkeypatch):
    monkeypatch.setenv("ORDO_TRACE_APPLIED", "1")
    seed, rng = crash_seed()
    ensure_topics(broker, namespace, request_partitions=2)
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    data_dir = str(tmp_path / "data")
    engine_args = ("--data-dir", data_dir, "--partitions", "2", "--runtime", "ray", "--checkpoint-every", "3")
    requests = traffic(6000, 2, seed)
    # Half the traffic per round, sent once the workers are up (Ray takes a while to start
    # here). The kill lands while requests still arrive: an idle engine would only notice
    # the dead worker with the next batch.
    rounds = [requests[: len(requests) // 2], requests[len(requests) // 2 :]]
    victims = rng.sample([0, 1], 2)
    sequencer = ordo("sequence", *kafka, "--max-txns", "40")
    try:
        for round_, victim in enumerate(victims):
            with engine_log(tmp_path, f"engine-{round_}") as log:
                engine = ordo("execute", *kafka, *engine_args, "--quiet", stdout=log, stderr=log)
                pid = wait_for_worker_pid(tmp_path / f"engine-{round_}.log", victim, engine)
                feeder = Feeder(broker, namespace, rounds[round_], chunk=100, pause=0.08)
                feeder.start()
                time.sleep(rng.uniform(0.3, 1.5))
                os.kill(pid, signal.SIGKILL)
                assert engine.wait(120) == 2
                feeder.join()
            text = (tmp_path / f"engine-{round_}.log").read_text()
            assert f"ordo execute: partition worker(s) [{victim}] died" in text, text
            assert "restart the engine to recover" in text and "Traceback" not in text
        with engine_log(tmp_path, "engine-final") as log:
            engine = ordo("execute", *kafka, *engine_args, "--quiet", stdout=log, stderr=log)
            try:
                read_results(broker, f"{namespace}.results", len(requests), timeout=180)
            finally:
                assert stop(engine, timeout=60) == 0, logs_text(tmp_path)
    finally:
        stop(sequencer)
    summary = check_against_serial_run(broker, namespace, data_dir, requests)
    text = logs_text(tmp_path)
    print(
        summary,
        {
            "restores": text.count("restored every shard"),
            "rebuilds": text.count("wiped the shards"),
            "disagreements": text.count("shards stopped at different batches"),
        },
    )


def wait_for_worker_pid(log_path, partition: int, engine, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(rf"^partition {partition}: pid (\d+)", log_path.read_text(), re.M)
        if match:
            return int(match.group(1))
        assert engine.poll() is None, log_path.read_text()
        time.sleep(0.2)
    raise AssertionError(f"no pid for partition {partition}: {log_path.read_text()}")
