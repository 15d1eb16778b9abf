"""Dependent transactions across engine crashes: the engine is SIGKILLed while alias
transfers are re-sequenced under changing bindings. Replayed batches publish their
re-sequencings again, the sequencer drops the repeats, and in the end every request has
one decision (repeated records are identical), each step entered the log once, and the
decisions replayed in (batch, txn) order give the same statuses and state."""

import json
import signal
import time

import pytest
from kafka import KafkaProducer

from ordo.embedded import read_log
from ordo.procedures.ollp import OLLP_FIELD, request_identity
from ordo.broker.topics import ensure_topics
from tests.helpers import ordo, ordo_output, read_results, stop
from tests.test_alias_pipeline import _requests
from tests.test_ollp import model

pytestmark = pytest.mark.slow


def test_engine_killed_while_transactions_are_re_sequenced(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=2)
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    data_dir = str(tmp_path / "data")
    engine_args = ("--data-dir", data_dir, "--partitions", "2", "--runtime", "local", "--scheduler", "vll")
    requests = _requests(3000, seed=9)
    sequencer = ordo("sequence", *kafka, "--max-txns", "40", "--partitions", "2")
    producer = KafkaProducer(bootstrap_servers=broker)
    try:
        for kill in range(3):
            engine = ordo("execute", *kafka, *engine_args)
            sent = [
                producer.send(f"{namespace}.requests", key=r["id"].encode(), value=json.dumps(r).encode())
                for r in (requests[kill * 1000 : (kill + 1) * 1000] if kill < 2 else requests[2000:])
            ]
            producer.flush()
            for future in sent:
                future.get(timeout=30)  # acknowledged by the broker
            time.sleep(1.5 + kill)
            assert engine.poll() is None
            engine.send_signal(signal.SIGKILL)
            engine.wait()
        engine = ordo("execute", *kafka, *engine_args)
        try:
            records = read_results(broker, f"{namespace}.results", len(requests), timeout=120)
        finally:
            assert stop(engine) == 0
    finally:
        producer.close()
        stop(sequencer)

    by_id: dict[str, dict] = {}
    for record in records:
        assert by_id.setdefault(record["id"], record) == record  # a repeat is the same decision
    assert set(by_id) == {r["id"] for r in requests}
    assert any(r["restarts"] > 0 for r in by_id.values())
    last_batch = max(r["batch"] for r in by_id.values())
    identities = [
        request_identity(e[0], e[2])
        for batch in read_log(broker, namespace, last_batch)
        for e in batch.entries
        if e[1] is not None
    ]
    assert len(identities) == len(set(identities))  # every step entered the log once
    steps = sum(1 for e in identities if "\x00" in e)
    dependent = [r["id"] for r in requests if r["proc"] != "alias_bind"]
    assert steps == sum(1 + by_id[i]["restarts"] for i in dependent)
    assert all(OLLP_FIELD not in r["args"] for r in requests)

    positioned = sorted(((r["batch"], r["txn"], r) for r in by_id.values()), key=lambda p: p[:2])
    statuses, state = model(positioned, [requests])
    assert {r["id"]: r["status"] for r in by_id.values()} == statuses
    dumped = {
        (r["table"], r["key"]): r["value"]
        for r in map(json.loads, ordo_output("dump", "--data-dir", data_dir).splitlines())
    }
    assert dumped == state
