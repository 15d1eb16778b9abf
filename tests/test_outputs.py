import json
import time

from ordo.scheduler.batch import Outcome
from ordo.scheduler.outputs import KafkaOutputs, change_records, outcome_record
from ordo.sequencer.topics import ensure_topics


def test_outcome_record_is_the_documented_json():
    record = json.loads(outcome_record(Outcome(3, "r-1", "aborted", None, "insufficient funds"), 17))
    assert record == {"id": "r-1", "status": "aborted", "batch": 17, "txn": 3, "restarts": 0, "result": None,
                      "error": "insufficient funds"}
    plain = json.loads(outcome_record(Outcome(4, "r-2", "committed", None, None, restarts=2), 17))
    assert plain == {"id": "r-2", "status": "committed", "batch": 17, "txn": 4, "restarts": 2, "result": None,
                     "error": None}


def test_change_data_is_split_into_parts_that_fit_a_message():
    changes = [[i, "micro", i, i * 7] for i in range(5000)] + [[5000, "micro", "k", None]]
    messages = change_records(4, 1, changes, max_bytes=10_000)
    assert len(messages) > 5
    decoded = [json.loads(value) for _, value in messages]
    assert [key for key, _ in messages] == [f"4:1:{part}".encode() for part in range(len(messages))]
    assert all(len(value) < 10_200 for _, value in messages)
    assert {(d["batch"], d["partition"], d["parts"]) for d in decoded} == {(4, 1, len(messages))}
    flat = [c for d in decoded for c in d["changes"]]
    assert flat[:2] == [{"txn": 0, "table": "micro", "key": 0, "value": 0},
                        {"txn": 1, "table": "micro", "key": 1, "value": 7}]
    assert flat[-1] == {"txn": 5000, "table": "micro", "key": "k", "value": None, "deleted": True}
    assert len(flat) == len(changes)


def test_a_batch_without_changes_still_has_one_part():
    [(key, value)] = change_records(9, 0, [])
    assert key == b"9:0:0" and json.loads(value) == {"batch": 9, "partition": 0, "part": 0, "parts": 1,
                                                     "changes": []}


def test_a_worker_waiting_for_acknowledgements_sends_at_once_whatever_the_linger(broker, namespace):
    """Outputs gather in the producer while a worker is busy; once it waits for them they
    leave at once. With a linger of two minutes, a wait that did not send would see nothing
    acknowledged within the test's minute."""
    topics = ensure_topics(broker, namespace)
    outputs = KafkaOutputs(broker, topics, extra={"linger.ms": 120_000})
    try:
        outputs.publish(1, 0, [Outcome(0, "r-1", "committed", None, None)], [[0, "kv", 1, 2]])
        assert not outputs.delivered(1)  # queued, lingering
        deadline = time.monotonic() + 60
        while not outputs.delivered(1) and time.monotonic() < deadline:
            outputs.wait(0.002)
        assert outputs.delivered(1)
    finally:
        outputs.close()
