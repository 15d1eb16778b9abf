import json
import logging
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from ordo.scheduler.batch import Outcome
from ordo.scheduler.outputs import KafkaOutputs, change_records, outcome_message, outcome_record
from ordo.broker.clients import consumer_config, kafka_config
from ordo.broker.topics import ensure_topics


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


def _everything_on(broker: str, topic: str) -> list[tuple[bytes, bytes]]:
    """(key, value) of every record of `topic`, in order, repeats included."""
    consumer = Consumer(consumer_config(broker, {"group.id": f"{topic}-read", "enable.auto.commit": False}))
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        records, position = [], 0
        deadline = time.monotonic() + 30
        while position < end and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                if message.error() is None:
                    records.append((message.key(), message.value()))
                    position = message.offset() + 1
        return records
    finally:
        consumer.close()


def test_a_producer_that_stopped_delivering_is_replaced_and_only_what_did_not_arrive_goes_again(
    broker, namespace, caplog
):
    """Outputs wait for a broker that is away, however long; but a producer that has
    delivered nothing for a while as the broker answers is replaced, and of its unacknowledged
    outputs the new one sends those the broker does not hold, in their order: each output
    once. The stalled producer here is one whose broker never answers; what it wrote without
    an acknowledgement is the first outcome, written beside it."""
    topics = ensure_topics(broker, namespace)
    outputs = KafkaOutputs(broker, topics, stall_after=1.0)
    outputs._producer.flush(5)
    outputs._producer = Producer(kafka_config("127.0.0.1:9", {"enable.idempotence": True, "message.timeout.ms": 0}))
    first = [Outcome(0, "r-1", "committed", None, None), Outcome(1, "r-2", "aborted", None, "no")]
    second = [Outcome(0, "r-3", "committed", None, None)]
    try:
        outputs.publish(1, 2, first, [[0, "kv", 1, 2]], [])
        outputs.publish(2, 1, second, [[0, "kv", 3, 4]], [])
        _, key, value = outcome_message(first[0], 1, topics)
        beside = Producer(kafka_config(broker))
        beside.produce(topics.results, key=key, value=value)
        assert beside.flush(30) == 0
        deadline = time.monotonic() + 90
        with caplog.at_level(logging.WARNING, logger="ordo.scheduler.outputs"):
            while not outputs.delivered(2) and time.monotonic() < deadline:
                outputs.wait(0.01)
        assert outputs.delivered(2)
        assert "1 unacknowledged output(s) had reached the broker, 5 go again" in caplog.text
    finally:
        outputs.close()
    results = _everything_on(broker, topics.results)
    assert [json.loads(v)["id"] for _, v in results] == ["r-1", "r-2", "r-3"]
    assert [k for k, _ in _everything_on(broker, topics.changes)] == [b"1.0.0", b"1.1.0", b"2.0.0"]


def test_outputs_wait_for_a_broker_that_is_away_without_replacing_their_producer(namespace, caplog):
    """No acknowledgement because no broker answers is an outage, not a stalled producer:
    the outputs keep waiting in it."""
    from ordo.broker.topics import Topics

    outputs = KafkaOutputs("127.0.0.1:9", Topics(namespace), stall_after=0.2)
    try:
        outputs.publish(1, 1, [Outcome(0, "r-1", "committed", None, None)], [], [])
        with caplog.at_level(logging.WARNING, logger="ordo.scheduler.outputs"):
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                outputs.wait(0.05)
        assert not outputs.delivered(1)
        assert "replaced" not in caplog.text
    finally:
        outputs._producer.purge()
