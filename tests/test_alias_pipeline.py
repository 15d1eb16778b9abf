"""alias end to end: an external Kafka client (kafka-python) produces deposits and
transfers by alias while bindings change under them; `ordo run` on 2 partitions
re-sequences the transactions whose bindings changed before their turn. Every request
gets one outcome, restarts happen, and replaying the decided requests one by one in
(batch, txn) order gives the same statuses and the same state."""

import json
import random

import pytest
from kafka import KafkaProducer

from sequencer.topics import ensure_topics
from tests.helpers import ordo, ordo_output, read_results, stop
from tests.test_ollp import model

pytestmark = pytest.mark.slow


def _requests(count: int, seed: int) -> list[dict]:
    """Binds of every alias, then deposits and transfers over few aliases, most rebinding."""
    rng = random.Random(seed)
    aliases = [f"a{i}" for i in range(8)]
    out = [{"id": f"bind-{a}", "proc": "alias_bind", "args": {"alias": a, "account": i}}
           for i, a in enumerate(aliases)]
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
    engine = ordo("run", "--bootstrap-servers", broker, "--namespace", namespace, "--data-dir", data_dir,
                  "--scheduler", "locking", "--partitions", "2", "--runtime", "local", "--max-txns", "50",
                  "--quiet")
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
    dumped = {(r["table"], r["key"]): r["value"]
              for r in map(json.loads, ordo_output("dump", "--data-dir", data_dir).splitlines())}
    assert dumped == state
