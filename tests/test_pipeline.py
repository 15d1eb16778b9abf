"""The real path end to end: an external Kafka client produces requests, `ordo run`
sequences and executes them, outcomes come back on <ns>.results, and the stored state
equals a plain serial interpretation of the log."""

import json
import time

import pytest
from kafka import KafkaProducer

from ordo.procedures.workloads import micro, sl
from ordo.broker.topics import ensure_topics
from tests.helpers import dump_state, interpret_log, ordo, ordo_output, read_results, reference_state, stop

pytestmark = pytest.mark.slow


def test_external_client_to_state_equals_serial_interpretation(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=3)
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
        "serial",
        "--max-txns",
        "300",
        "--quiet",
    )
    try:
        requests = list(sl.generate(1500, seed=11)) + list(micro.generate(1500, seed=12, keys=500, hot=10))
        producer = KafkaProducer(bootstrap_servers=broker)
        for request in requests:
            producer.send(f"{namespace}.requests", key=request["id"].encode(), value=json.dumps(request).encode())
        producer.flush()
        producer.close()
        records = read_results(broker, f"{namespace}.results", len(requests))
    finally:
        assert stop(engine) == 0
    by_id = {}
    for record in records:
        assert record["id"] not in by_id, f"two outcomes for {record['id']}"
        by_id[record["id"]] = record
    assert set(by_id) == {r["id"] for r in requests}
    statuses = {r["status"] for r in by_id.values()}
    assert statuses == {"committed", "aborted"}  # sl transfers from empty accounts abort

    last_batch = max(r["batch"] for r in records)
    reference = interpret_log(broker, namespace, last_batch)
    assert {o["id"]: o for o in reference.outcomes} == by_id
    assert dump_state(data_dir) == reference_state(reference)
    assert ordo_output("digest", "--data-dir", data_dir).strip() == f"{reference.digest():032x}"


def test_bad_input_gets_one_clear_outcome_and_later_requests_still_commit(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "d"),
        "--max-request-bytes",
        "2000",
        "--quiet",
        "--procedures",
        "tests.faulty_procedures",
        "--workloads",
        "sl",
    )
    deposit = {"account": 1, "asset": 1, "account_amount": 5, "asset_amount": 5}
    bad = [
        (b"bad-json", b'{"id": "bad-json", "proc": '),
        (b"no-proc", json.dumps({"id": "no-proc", "args": {}}).encode()),
        (b"no-args", json.dumps({"id": "no-args", "proc": "sl_deposit"}).encode()),
        (b"no-id", json.dumps({"proc": "sl_deposit", "args": deposit}).encode()),
        (b"unknown", json.dumps({"id": "unknown", "proc": "rm_rf", "args": {}}).encode()),
        (
            b"wrong-type",
            json.dumps({"id": "wrong-type", "proc": "sl_deposit", "args": {**deposit, "account": "one"}}).encode(),
        ),
        (
            b"too-big",
            json.dumps({"id": "too-big", "proc": "sl_deposit", "args": {**deposit, "pad": "x" * 5000}}).encode(),
        ),
        (b"raises", json.dumps({"id": "raises", "proc": "faulty_divide", "args": {"key": 1, "by": 0}}).encode()),
        (b"divides", json.dumps({"id": "divides", "proc": "faulty_divide", "args": {"key": 2, "by": 4}}).encode()),
        (b"first", json.dumps({"id": "first", "proc": "sl_deposit", "args": deposit}).encode()),
        (b"first", json.dumps({"id": "first", "proc": "sl_deposit", "args": deposit}).encode()),
        (b"later", json.dumps({"id": "later", "proc": "sl_deposit", "args": deposit}).encode()),
    ]
    try:
        producer = KafkaProducer(bootstrap_servers=broker, max_request_size=10_000_000)
        sent = [producer.send(f"{namespace}.requests", key=key, value=value) for key, value in bad]
        producer.flush()
        # A message that is not a readable request is answered under its position, whatever its key says.
        position = {
            key.decode(): f"@{m.partition}:{m.offset}"
            for (key, _), m in zip(bad, (future.get(timeout=30) for future in sent))
        }
        records = read_results(broker, f"{namespace}.results", len(bad) - 1)
    finally:
        assert stop(engine) == 0
    outcomes = {}
    for record in records:
        outcomes.setdefault(record["id"], []).append(record)
    expect = {
        "bad-json": ("rejected", "invalid JSON"),
        "no-proc": ("rejected", "missing field(s): proc"),
        "no-args": ("rejected", "missing field(s): args"),
        "no-id": ("rejected", "missing or invalid 'id'"),
        "unknown": ("rejected", "unknown procedure 'rm_rf'"),
        "wrong-type": ("rejected", "argument 'account': expected integer, got string"),
        "too-big": ("rejected", "request too large"),
        "raises": ("aborted", "faulty_divide raised ZeroDivisionError: integer division or modulo by zero"),
    }
    for name, (status, error) in expect.items():
        unreadable = name in ("bad-json", "no-proc", "no-args", "no-id", "too-big")
        [outcome] = outcomes.pop(position[name] if unreadable else name)
        assert outcome["status"] == status and error in outcome["error"], outcome
    first = sorted((o["status"], o["error"] or "") for o in outcomes["first"])
    assert first == [("committed", ""), ("rejected", "duplicate request id 'first'")]
    assert [(o["status"], o["result"]) for o in outcomes["divides"]] == [("committed", 25)]
    assert [o["status"] for o in outcomes["later"]] == ["committed"]


def test_submit_wait_gen_dump_and_digest_from_the_cli(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    data_dir = str(tmp_path / "d")
    engine = ordo("run", "--bootstrap-servers", broker, "--namespace", namespace, "--data-dir", data_dir, "--quiet")
    try:
        requests = tmp_path / "r.jsonl"
        requests.write_text(
            ordo_output("gen", "micro", "--count", "50", "--seed", "3", "--knob", "keys=100", "--knob", "hot=5")
        )
        assert len(requests.read_text().splitlines()) == 50
        ordo_output(
            "submit", "--bootstrap-servers", broker, "--namespace", namespace, "--file", str(requests), "--wait"
        )
        single = ordo_output(
            "submit",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--proc",
            "micro_rmw",
            "--args",
            '{"keys": [1000]}',
            "--id",
            "one",
            "--wait",
        )
        assert json.loads(single)["status"] == "committed"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = dump_state(data_dir)  # read while the engine runs
            if state.get(("micro", 1000)) == 1:
                break
            time.sleep(0.2)
    finally:
        assert stop(engine) == 0
    state = dump_state(data_dir)
    assert state[("micro", 1000)] == 1
    assert sum(state.values()) == 50 * 10 + 1
    assert len(ordo_output("digest", "--data-dir", data_dir).strip()) == 32
