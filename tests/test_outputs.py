import json
import time

from ordo.scheduler.batch import Outcome
from ordo.scheduler.outputs import KafkaOutputs, change_records, outcome_record
from ordo.sequencer.topics import ensure_topics


def test_outcome_record_is_the_documented_json():
    record = json.loads(outcome_record(Outcome(3, "r-1", "aborted", None, "insufficient funds"), 17))
    assert record == {
        "id": "r-1",
        "status": "aborted",
        "batch": 17,
        "txn": 3,
        "restarts": 0,
        "result": None,
        "error": "insufficient funds",
    }
    plain = json.loads(outcome_record(Outcome(4, "r-2", "committed", None, None, restarts=2), 17))
    assert plain == {
        "id": "r-2",
        "status": "committed",
        "batch": 17,
        "txn": 4,
        "restarts": 2,
        "result": None,
        "error": None,
    }


def test_change_data_is_split_into_parts_that_fit_a_message():
    changes = [[3, "micro", i, i * 7] for i in range(5000)] + [[3, "micro", "k", None], [4, "micro", 1, 1]]
    messages = change_records(7, 5, [3, 4], changes, max_bytes=10_000)
    *parts, last = messages
    assert len(parts) > 5
    assert [key for key, _ in messages] == [f"7.3.{part}".encode() for part in range(len(parts))] + [b"7.4.0"]
    assert all(len(value) < 10_200 for _, value in messages)
    decoded = [json.loads(value) for _, value in parts]
    assert {(d["batch"], d["txn"], d["txns"], d["parts"]) for d in decoded} == {(7, 3, 5, len(parts))}
    assert [d["part"] for d in decoded] == list(range(len(parts)))
    flat = [c for d in decoded for c in d["changes"]]
    assert flat[:2] == [{"table": "micro", "key": 0, "value": 0}, {"table": "micro", "key": 1, "value": 7}]
    assert flat[-1] == {"table": "micro", "key": "k", "value": None, "deleted": True}
    assert len(flat) == 5001
    assert json.loads(last[1]) == {
        "batch": 7,
        "txn": 4,
        "txns": 5,
        "part": 0,
        "parts": 1,
        "changes": [{"table": "micro", "key": 1, "value": 1}],
    }


def test_every_transaction_reported_has_a_record_even_without_changes():
    assert change_records(9, 3, [0, 2], []) == [
        (b"9.0.0", b'{"batch":9,"txn":0,"txns":3,"part":0,"parts":1,"changes":[]}'),
        (b"9.2.0", b'{"batch":9,"txn":2,"txns":3,"part":0,"parts":1,"changes":[]}'),
    ]


def test_a_worker_waiting_for_acknowledgements_sends_at_once_whatever_the_linger(broker, namespace):
    """Outputs gather in the producer while a worker is busy; once it waits for them they
    leave at once. With a linger of two minutes, a wait that did not send would see nothing
    acknowledged within the test's minute."""
    topics = ensure_topics(broker, namespace)
    outputs = KafkaOutputs(broker, topics, extra={"linger.ms": 120_000})
    try:
        outputs.publish(1, 1, [Outcome(0, "r-1", "committed", None, None)], [[0, "kv", 1, 2]], [])
        assert not outputs.delivered(1)  # queued, lingering
        deadline = time.monotonic() + 60
        while not outputs.delivered(1) and time.monotonic() < deadline:
            outputs.wait(0.002)
        assert outputs.delivered(1)
    finally:
        outputs.close()


def test_a_partition_that_reports_nothing_of_a_batch_has_it_delivered_at_once(broker, namespace):
    """A transaction's change data goes out with its outcome, so a partition that reports
    none of a batch's transactions (the other one runs them all) sends nothing for it and
    must not wait for an acknowledgement that never comes."""
    topics = ensure_topics(broker, namespace)
    outputs = KafkaOutputs(broker, topics)
    try:
        outputs.publish(1, 1, [], [], [])
        assert outputs.delivered(1)
    finally:
        outputs.close()
