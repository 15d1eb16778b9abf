"""Shared test helpers: processes of the real CLI, reading topics, serial interpretation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from ordo.embedded import read_log
from ordo.procedures.registry import default_registry
from ordo.scheduler.reference import SerialInterpreter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ordo(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    return subprocess.Popen([sys.executable, "-m", "ordo.cli", *args], cwd=ROOT, env=env, **kwargs)


def ordo_output(*args: str, timeout: float = 120) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-m", "ordo.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def stop(process: subprocess.Popen, timeout: float = 30) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError("process did not stop on SIGTERM")
    return process.returncode


def topic_reader(bootstrap: str, topic: str, timeout: float = 60, **config):
    """A kafka-python consumer (shares no code with Ordo) on every partition of `topic`,
    from its beginning, once the topic exists, reading committed records only (the engine
    writes its outputs in Kafka transactions, and an aborted one's records are not outputs).
    It never creates the topic: a reader that asked for a topic the engine had not made yet
    would have the broker make it with its own defaults, and records keyed to partitions it
    did not read would be missed."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        allow_auto_create_topics=False,
        **{"auto_offset_reset": "earliest", "isolation_level": "read_committed", **config},
    )
    deadline = time.monotonic() + timeout
    while not (partitions := consumer.partitions_for_topic(topic)):
        if time.monotonic() > deadline:
            consumer.close()
            raise TimeoutError(f"topic {topic} does not exist after {timeout:.0f} s")
        time.sleep(0.2)
    consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
    consumer.seek_to_beginning()
    return consumer


def read_results(bootstrap: str, topic: str, expected: int, timeout: float = 120) -> list[dict]:
    """Every record of a results topic until at least `expected` distinct ids have arrived."""
    consumer = topic_reader(bootstrap, topic, consumer_timeout_ms=1000)
    records, ids = [], set()
    deadline = time.monotonic() + timeout
    while len(ids) < expected and time.monotonic() < deadline:
        for message in consumer:
            record = json.loads(message.value)
            assert message.key.decode() == record["id"]
            records.append(record)
            ids.add(record["id"])
    consumer.close()
    return records


def interpret_log(bootstrap: str, namespace: str, until_batch: int, registry=None) -> SerialInterpreter:
    return SerialInterpreter(registry or default_registry()).apply(read_log(bootstrap, namespace, until_batch))


def dump_state(data_dir: str) -> dict:
    """Every stored record, the engine's own tables (stream.*, window.*) included."""
    lines = ordo_output("dump", "--data-dir", data_dir, "--internal").splitlines()
    return {(r["table"], r["key"]): r["value"] for r in map(json.loads, lines)}


def reference_state(interpreter: SerialInterpreter) -> dict:
    from ordo.storage.keys import decode_key

    return {decode_key(k): v for k, v in interpreter.state.items()}


def sequence_requests(
    bootstrap: str,
    namespace: str,
    requests: list,
    max_txns: int = 100,
    request_partitions: int = 2,
    partitions: int = 1,
) -> tuple[int, SerialInterpreter]:
    """Put `requests` through a real sequencer into a fresh namespace's log, routed for
    `partitions`; return the last batch id and the plain serial interpretation of that log."""
    from ordo.client import Client
    from ordo.embedded import SequencerThread
    from ordo.sequencer.sequencer import SequencerConfig
    from ordo.broker.topics import ensure_topics

    ensure_topics(bootstrap, namespace, request_partitions=request_partitions)
    client = Client(bootstrap, namespace)
    client.submit(requests)
    client.close()
    sequencer = SequencerThread(bootstrap, namespace, SequencerConfig(max_txns=max_txns, partitions=partitions)).start()
    sequencer.wait_for(len(requests))
    last_batch = sequencer.sequencer.next_batch - 1
    sequencer.stop()
    return last_batch, interpret_log(bootstrap, namespace, last_batch)


def run_engine(
    bootstrap: str,
    namespace: str,
    last_batch: int,
    data_dir,
    scheduler: str,
    partitions: int,
    runtime: str = "local",
    **options,
):
    """Execute a namespace's log through `last_batch` with outputs kept in memory; return
    (outputs, (digest, applied batch))."""
    from ordo.state import digest
    from ordo.scheduler.coordinator import Coordinator
    from ordo.scheduler.outputs import CollectedOutputs

    outputs = CollectedOutputs()
    coordinator = Coordinator(
        bootstrap, namespace, str(data_dir), scheduler, partitions, runtime=runtime, outputs=outputs, **options
    )
    coordinator.run(until_batch=last_batch)
    return outputs, digest(str(data_dir))


def assert_same_as_reference(outputs, state_digest, last_batch: int, reference: SerialInterpreter) -> None:
    assert outputs.outcomes == reference.outcomes
    assert outputs.changes == reference.changes
    assert state_digest == (reference.digest(), last_batch)


def mixed_log(
    bootstrap: str, namespace: str, count: int, seed: int, partitions: int, max_txns: int, **sl_knobs
) -> tuple[int, SerialInterpreter]:
    """Multi-partition micro traffic interleaved with sl (whose transfers abort), sequenced
    into a fresh namespace's log: the last batch id and the serial interpretation."""
    from ordo.procedures.workloads import micro, sl

    requests = []
    for a, b in zip(
        micro.generate(count, seed=seed, partitions=partitions, keys=100, hot=4, mp=0.5),
        sl.generate(count, seed=seed + 1, records=40, **sl_knobs),
    ):
        requests += [a, b]
    return sequence_requests(bootstrap, namespace, requests, max_txns=max_txns)
