"""alias end to end: an external Kafka client (kafka-python) produces deposits and
transfers by alias while bindings change under them; `ordo run` on 2 partitions
re-sequences the transactions whose bindings changed before their turn. Every request
gets one outcome, restarts happen, and replaying the decided requests one by one in
(batch, txn) order gives the same statuses and the same state. Rebuilding the state from
the log publishes every re-sequencing again, and the sequencer drops them all."""

import json
import random

import pytest
from kafka import KafkaProducer

from ordo.embedded import SequencerThread, read_log
from ordo.procedures.ollp import OLLP_FIELD
from ordo.sequencer.sequencer import SequencerConfig
from ordo.broker.topics import ensure_topics
from tests.helpers import ordo, ordo_output, read_results, stop
from tests.test_ollp import model

pytestmark = pytest.mark.slow


def _requests(count: int, seed: int) -> list[dict]:
    """Binds of every alias, then deposits and transfers over few aliases, most rebinding."""
    rng = random.Random(seed)
    aliases = [f"a{i}" for i in range(8)]
    out = [{"id": f"bind-{a}", "proc": "alias_bind", "args": {"alias": a, "account": i}} for i, a in enumerate(aliases)]
    for i in range(count):
        draw = rng.random()
        if draw < 0.3:
            args = {"alias": rng.choice(aliases), "account": rng.randrange(12)}
            out.append({"id": f"r{i}", "proc": "alias_bind", "args": args})
        elif draw < 0.55:
            args = {"alias": rng.choice(aliases + ["never-bound"]), "amount": rng.randint(1, 100)}
            out.append({"id": f"r{i}", "proc": "alias_deposit", "args": args})
        else:
            args = {"src": rng.choice(aliases), "dst": rng.choice(aliases), "amount": rng.randint(1, 80)}
            out.append({"id": f"r{i}", "proc": "alias_transfer", "args": args})
    return out


def test_alias_from_an_external_client_on_two_partitions(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=2)
    data_dir = str(tmp_path / "data")
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--scheduler",
        "locking",
        "--partitions",
        "2",
        "--runtime",
        "local",
        "--max-txns",
        "50",
        "--quiet",
    )
    requests = _requests(1500, seed=5)
    try:
        producer = KafkaProducer(bootstrap_servers=broker)
        for request in requests:
            producer.send(f"{namespace}.requests", key=request["id"].encode(), value=json.dumps(request).encode())
        producer.flush()
        producer.close()
        records = read_results(broker, f"{namespace}.results", len(requests), timeout=240)
    finally:
        assert stop(engine) == 0
    by_id = {}
    for record in records:
        assert record["id"] not in by_id, f"two outcomes for {record['id']}"
        by_id[record["id"]] = record
    assert set(by_id) == {r["id"] for r in requests}
    restarted = [r for r in by_id.values() if r["restarts"] > 0]
    assert restarted, "no binding changed under a transaction"
    assert {r["status"] for r in by_id.values()} <= {"committed", "aborted", "rejected"}

    positioned = sorted(((r["batch"], r["txn"], r) for r in by_id.values()), key=lambda p: p[:2])
    assert len({p[:2] for p in positioned}) == len(positioned)  # one position per decision
    statuses, state = model(positioned, [requests])
    assert {r["id"]: r["status"] for r in by_id.values()} == statuses
    dumped = {
        (r["table"], r["key"]): r["value"]
        for r in map(json.loads, ordo_output("dump", "--data-dir", data_dir).splitlines())
    }
    assert dumped == state

    # Rebuilding from the log re-executes every step and publishes every re-sequencing
    # again; a sequencer started afterwards drops them all: the log does not grow.
    last_batch = max(r["batch"] for r in records)
    log_steps = [
        e
        for batch in read_log(broker, namespace, last_batch)
        for e in batch.entries
        if isinstance(e[2], dict) and OLLP_FIELD in e[2]
    ]
    dependent = [r["id"] for r in requests if r["proc"] != "alias_bind"]
    assert len(log_steps) == sum(1 + by_id[i]["restarts"] for i in dependent)  # reconnaissance + restarts
    assert len(_steps_on(broker, f"{namespace}.requests")) == len(log_steps)
    rebuilt = str(tmp_path / "rebuilt")
    ordo_output(
        "recover",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        rebuilt,
        "--scheduler",
        "vll",
        "--partitions",
        "2",
        "--runtime",
        "local",
        "--from-scratch",
        "--quiet",
        "--idle",
        "1",
        "--publish",  # the rebuild publishes the same steps again
        timeout=240,
    )
    assert ordo_output("digest", "--data-dir", rebuilt) == ordo_output("digest", "--data-dir", data_dir)
    published = _steps_on(broker, f"{namespace}.requests")
    assert sorted(published) == sorted(2 * [json.dumps(e[2], sort_keys=True) for e in log_steps])
    # One new request on each request partition, behind the re-published steps: once both
    # are in the log the sequencer has read every step, and it appended nothing else.
    sequencer = SequencerThread(broker, namespace, SequencerConfig(partitions=2)).start()
    try:
        producer = KafkaProducer(bootstrap_servers=broker)
        for p in (0, 1):
            sentinel = {"id": f"after-{p}", "proc": "alias_bind", "args": {"alias": "z", "account": p}}
            producer.send(
                f"{namespace}.requests", key=sentinel["id"].encode(), value=json.dumps(sentinel).encode(), partition=p
            )
        producer.flush()
        producer.close()
        sequencer.wait_for(2, timeout=60)
    finally:
        sequencer.stop()
    later = [
        e for batch in read_log(broker, namespace, last_batch + 1) if batch.batch_id > last_batch for e in batch.entries
    ]
    assert sorted(e[0] for e in later) == ["after-0", "after-1"]


def _steps_on(bootstrap: str, topic: str) -> list[str]:
    """The arguments of every re-sequencing on a requests topic (read with kafka-python)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
        group_id=None,
    )
    try:
        bodies = [json.loads(message.value) for message in consumer]
    finally:
        consumer.close()
    return [json.dumps(b["args"], sort_keys=True) for b in bodies if OLLP_FIELD in b["args"]]
