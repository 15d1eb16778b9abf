"""Source topics, hardened: a source topic deleted and created again is read from its
beginning as a new topic whose records' ids no earlier incarnation's can be, whether
Ordo ran through the recreation or was stopped; a client cannot take the id of a source
record (or of an engine's OLLP step) and so suppress it."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ordo.embedded import read_log
from ordo.log.records import LogCursor, encode_batch, encode_entry, encode_start
from ordo.sequencer.sources import record_id
from ordo.broker.topics import ensure_topics, wait_for_leaders
from ordo.sequencer.wire import encode_request, id_problem, source_id_problem
from tests.helpers import dump_state, ordo as ordo_cli, read_results, stop

APP = "tests.source_app:app"


def _create(broker: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker})
    (future,) = admin.create_topics([NewTopic(topic, partitions, 1)]).values()
    future.result(30)
    wait_for_leaders(admin, [topic])


def _delete(broker: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker})
    (future,) = admin.delete_topics([topic]).values()
    future.result(30)
    deadline = time.monotonic() + 60
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} is still listed after its deletion"
        time.sleep(0.2)


def _orders(broker: str, topic: str, count: int, partitions: int, sku_base: int) -> dict[str, int]:
    """`count` good orders, order i to partition i % partitions: {(partition, offset): qty}
    keyed as (partition, offset)."""
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 5})
    placed: dict[tuple[int, int], tuple[str, int]] = {}

    def delivered(error, message, sku, qty):
        assert error is None, error
        placed[(message.partition(), message.offset())] = (sku, qty)

    for i in range(count):
        sku, qty = f"s{(sku_base + i) % 5}", 1 + i % 3
        producer.produce(
            topic,
            value=json.dumps({"sku": sku, "qty": qty}).encode(),
            partition=i % partitions,
            on_delivery=lambda error, message, sku=sku, qty=qty: delivered(error, message, sku, qty),
        )
    assert producer.flush(30) == 0
    assert len(placed) == count
    return placed


def _run(broker: str, namespace: str, data_dir: str, said) -> object:
    return ordo_cli(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--runtime",
        "local",
        "--app",
        APP,
        "--max-txns",
        "40",
        "--quiet",
        stderr=said,
    )


@pytest.mark.slow
def test_a_recreated_source_topic_is_read_from_its_beginning_as_a_new_topic(broker, namespace, tmp_path, monkeypatch):
    """Incarnation 1 read; deleted and created again with more records while `ordo run`
    runs (its consumer would go on at the old offset: records 0..old-1 of the new topic
    lost, the rest taken as the old one's); then again while Ordo is stopped. Every record
    of every incarnation is one request, under an id of its own incarnation."""
    topic = f"{namespace}-orders"
    monkeypatch.setenv("ORDO_TEST_ORDERS_TOPIC", topic)
    partitions = 2
    _create(broker, topic, partitions)
    ensure_topics(broker, namespace)
    expected: dict[str, tuple[str, int]] = {}
    first = _orders(broker, topic, 60, partitions, 0)
    expected.update({record_id(topic, p, o): order for (p, o), order in first.items()})
    data_dir = str(tmp_path / "d")
    said = open(tmp_path / "run.err", "w")
    engine = _run(broker, namespace, data_dir, said)
    try:
        read_results(broker, f"{namespace}.results", len(expected), timeout=180)
        # Recreated while it runs, with more records than the old topic held.
        _delete(broker, topic)
        _create(broker, topic, partitions)
        second = _orders(broker, topic, 150, partitions, 1)
        expected.update({record_id(topic, p, o, 2): order for (p, o), order in second.items()})
        read_results(broker, f"{namespace}.results", len(expected), timeout=180)
        assert engine.poll() is None, "ordo run stopped"
        stop(engine)
        # Recreated while it is stopped, with more records again.
        _delete(broker, topic)
        _create(broker, topic, partitions)
        third = _orders(broker, topic, 250, partitions, 2)
        expected.update({record_id(topic, p, o, 3): order for (p, o), order in third.items()})
        engine = _run(broker, namespace, data_dir, said)
        records = read_results(broker, f"{namespace}.results", len(expected), timeout=180)
        time.sleep(2)  # a record answered twice would show now
        records = read_results(broker, f"{namespace}.results", len(expected), timeout=60)
    finally:
        stop(engine)
        said.close()
    errors = (tmp_path / "run.err").read_text()
    assert "Traceback" not in errors, errors
    assert f"source topic {topic} was deleted and created again while this sequencer read it" in errors, errors
    assert f"source topic {topic} was deleted and created again since the log read partition" in errors, errors
    outcomes = Counter((record["id"], record["status"]) for record in records)
    answered = {request_id for request_id, _ in outcomes}
    assert answered == set(expected), (
        f"missing {sorted(set(expected) - answered)[:5]}, extra {sorted(answered - set(expected))[:5]}"
    )
    assert all(status == "committed" and n == 1 for (_, status), n in outcomes.items()), outcomes.most_common(3)
    last_batch = max(record["batch"] for record in records)
    in_log = Counter(entry[0] for batch in read_log(broker, namespace, last_batch) for entry in batch.entries)
    assert set(in_log) == set(expected) and max(in_log.values()) == 1, "a record entered the log twice"
    sums = Counter()
    for sku, qty in expected.values():
        sums[sku] += qty
    assert dump_state(data_dir) == {("ordered", sku): qty for sku, qty in sums.items()}


@pytest.mark.slow
def test_a_client_cannot_take_a_source_records_id(broker, namespace, tmp_path, monkeypatch):
    """A client sends a request under the id the record at topic:0:5 will get; it is no
    request (answered under its position), and the record is applied once."""
    topic = f"{namespace}-orders"
    monkeypatch.setenv("ORDO_TEST_ORDERS_TOPIC", topic)
    _create(broker, topic, 1)
    ensure_topics(broker, namespace)
    taken = record_id(topic, 0, 5)
    client = Producer({"bootstrap.servers": broker})
    client.produce(
        f"{namespace}.requests",
        key=taken.encode(),
        value=encode_request(taken, "place_order", {"sku": "stolen", "qty": 100}),
        partition=0,
    )
    assert client.flush(30) == 0
    data_dir = str(tmp_path / "d")
    said = open(tmp_path / "run.err", "w")
    engine = _run(broker, namespace, data_dir, said)
    try:
        (answer,) = read_results(broker, f"{namespace}.results", 1, timeout=180)
        orders = _orders(broker, topic, 10, 1, 0)
        records = read_results(broker, f"{namespace}.results", 11, timeout=180)
    finally:
        stop(engine)
        said.close()
    assert answer["id"] == "@0:0" and answer["status"] == "rejected", answer
    assert "form of a source record's id" in answer["error"], answer
    by_id = Counter((record["id"], record["status"]) for record in records)
    assert by_id[(taken, "committed")] == 1 and sum(n for (i, _), n in by_id.items() if i == taken) == 1, by_id
    sums = Counter()
    for sku, qty in orders.values():
        sums[sku] += qty
    assert dump_state(data_dir) == {("ordered", sku): qty for sku, qty in sums.items()}


def test_ids_the_engine_derives_are_not_a_clients():
    for derived in ("orders:0:5", "orders#2:0:5", "shop.orders-eu_1:12:0", "a\x000", "r-1\x001"):
        assert id_problem(derived) is not None, derived
    for own in ("orders-0-5", "orders:0", "order:x:5", "req-1", "orders:0:5:extra", "#2:0:5"):
        assert id_problem(own) is None, own
    # A source's own id mapping may give the source form (the app chose it), never a NUL.
    assert source_id_problem("orders:0:5") is None and source_id_problem("a\x000") is not None
    assert record_id("orders", 1, 40) == "orders:1:40" and record_id("orders", 1, 40, 3) == "orders#3:1:40"


def test_a_batch_carries_the_incarnation_of_each_source_position():
    cursor = LogCursor(namespace="shop")
    cursor.accept(encode_start("shop", None, "s1"), 0)
    entry = encode_entry([record_id("orders", 1, 8, 2), "place_order", {"sku": "a", "qty": 1}])
    offsets = {0: (0, 3), "orders:1": (5, 9, 2, "topic-id-b"), "legacy:0": (0, 4)}
    assert cursor.accept(encode_batch(1, 0, 1000, offsets, [entry], log_id="s1", namespace="shop"), 1) is not None
    assert cursor.source_offsets == {"orders:1": 9, "legacy:0": 4}
    assert cursor.source_ids == {"orders:1": [2, "topic-id-b"]}  # a position from before ids has none
    kept = json.loads(json.dumps(cursor.to_dict()))
    assert LogCursor.from_dict(kept, "shop") == cursor


@pytest.mark.slow
def test_records_deleted_before_they_were_read_are_named_as_deleted_not_as_a_recreation(
    broker, namespace, tmp_path, monkeypatch
):
    """Records the source topic deletes (retention, here `delete_records`, which moves the
    partition's start as retention does) while Ordo is stopped: the sequencer stops in one
    line that says where the partition now begins, and `ordo run` with it."""
    from confluent_kafka import TopicPartition

    topic = f"{namespace}-orders"
    monkeypatch.setenv("ORDO_TEST_ORDERS_TOPIC", topic)
    _create(broker, topic, 1)
    ensure_topics(broker, namespace)
    _orders(broker, topic, 10, 1, 0)
    data_dir = str(tmp_path / "d")
    said = open(tmp_path / "run.err", "w")
    engine = _run(broker, namespace, data_dir, said)
    try:
        read_results(broker, f"{namespace}.results", 10, timeout=180)
    finally:
        stop(engine)
    _orders(broker, topic, 20, 1, 0)  # offsets 10-29, never read
    admin = AdminClient({"bootstrap.servers": broker})
    (deleted,) = admin.delete_records([TopicPartition(topic, 0, 25)]).values()
    deleted.result(30)
    engine = _run(broker, namespace, data_dir, said)
    try:
        assert engine.wait(180) != 0
    finally:
        stop(engine)
        said.close()
    errors = (tmp_path / "run.err").read_text()
    assert (
        f"source topic {topic} partition 0 no longer holds the records after offset 10 that the log consumed up to "
        f"(it now begins at offset 25: deleted by retention before they were read)" in errors
    ), errors
    assert "created again" not in errors, errors


@pytest.mark.slow
def test_a_compacted_source_topic_is_read_across_its_gaps(broker, namespace, tmp_path, monkeypatch):
    """Compaction keeps the offsets of the records it leaves and removes the others: the
    sequencer reads across the gaps, each remaining record one request under its own
    offset, and records written after it as well."""
    from confluent_kafka import Consumer, TopicPartition

    topic = f"{namespace}-orders"
    monkeypatch.setenv("ORDO_TEST_ORDERS_TOPIC", topic)
    admin = AdminClient({"bootstrap.servers": broker})
    compacted = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.001",
        "delete.retention.ms": "100",
        "min.compaction.lag.ms": "0",
    }
    (future,) = admin.create_topics([NewTopic(topic, 1, 1, config=compacted)]).values()
    future.result(30)
    wait_for_leaders(admin, [topic])
    producer = Producer({"bootstrap.servers": broker})

    def order(key: str, sku: str, qty: int) -> None:
        producer.produce(topic, key=key.encode(), value=json.dumps({"sku": sku, "qty": qty}).encode())

    for i in range(10):  # kept: no later record has their key
        order(f"u{i}", f"s{i % 5}", 1)
    for i in range(90):  # of each key the newest one is kept
        order(f"k{i % 5}", f"s{i % 5}", 1 + i % 3)
    producer.flush(30)

    def remaining() -> dict[int, bytes]:
        """The key of each record the topic still holds, by offset."""
        consumer = Consumer({"bootstrap.servers": broker, "group.id": f"look-{time.monotonic()}"})
        consumer.assign([TopicPartition(topic, 0, 0)])
        found, quiet_until = {}, time.monotonic() + 3
        while time.monotonic() < quiet_until:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                found[message.offset()] = message.key()
        consumer.close()
        return found

    def superseded(left: dict[int, bytes]) -> int:
        return len(left) - len(set(left.values()))

    # Compaction only removes a record that a newer one with its key supersedes. Once no key
    # is left twice the cleaner is done: every record still there is read by the engine.
    deadline, rolls = time.monotonic() + 120, 0
    left = remaining()
    while superseded(left):  # the log cleaner takes a rolled segment within about 15 s
        assert time.monotonic() < deadline, "the broker did not compact the topic"
        rolls += 1  # a record after segment.ms rolls the segment the cleaner may take; its own key keeps it
        order(f"roll{rolls}", "s9", 1)
        producer.flush(10)
        time.sleep(2)
        left = remaining()
    assert max(left) - min(left) + 1 > len(left), "no gap to read across"
    ensure_topics(broker, namespace)
    data_dir = str(tmp_path / "d")
    said = open(tmp_path / "run.err", "w")
    engine = _run(broker, namespace, data_dir, said)
    try:
        read_results(broker, f"{namespace}.results", len(left), timeout=180)
        for i in range(10):
            order(f"new{i}", "s0", 1)
        producer.flush(30)
        records = read_results(broker, f"{namespace}.results", len(left) + 10, timeout=180)
        assert engine.poll() is None, "ordo run stopped"
    finally:
        stop(engine)
        said.close()
    errors = (tmp_path / "run.err").read_text()
    assert "Traceback" not in errors, errors
    ids = Counter(record["id"] for record in records)
    assert max(ids.values()) == 1, ids.most_common(2)
    assert {record_id(topic, 0, offset) for offset in left} <= set(ids)
    assert len(ids) == len(left) + 10
    assert all(record["status"] == "committed" for record in records)


@pytest.mark.slow
def test_a_source_topic_deleted_while_ordo_runs_stops_nothing_else(broker, namespace, tmp_path, monkeypatch):
    """Deleted and not made again: what the log holds of it stays, and the requests of
    `<ns>.requests` go on being answered; started again, the app's missing source is one line."""
    from ordo.client import Client

    topic = f"{namespace}-orders"
    monkeypatch.setenv("ORDO_TEST_ORDERS_TOPIC", topic)
    _create(broker, topic, 1)
    ensure_topics(broker, namespace)
    placed = _orders(broker, topic, 20, 1, 0)
    data_dir = str(tmp_path / "d")
    said = open(tmp_path / "run.err", "w")
    engine = _run(broker, namespace, data_dir, said)
    try:
        read_results(broker, f"{namespace}.results", len(placed), timeout=180)
        _delete(broker, topic)
        time.sleep(5)
        with Client(broker, namespace) as client:
            for k in range(5):
                done = client.wait_one(client.submit("place_order", {"sku": f"c{k}", "qty": 1}), timeout=120)
                assert done["status"] == "committed", done
        assert engine.poll() is None, "ordo run stopped"
    finally:
        stop(engine)
        said.close()
    errors = (tmp_path / "run.err").read_text()
    assert "Traceback" not in errors, errors
    assert dump_state(data_dir)[("ordered", "c0")] == 1
