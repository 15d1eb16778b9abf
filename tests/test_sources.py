"""Existing topics as sources: records a plain Kafka producer writes to a topic of the
app's become requests of its procedure, each answered once, through SIGKILLs of the
sequencer and of the whole `ordo run`; bad records are rejected, naming what was wrong;
the mapping is part of the procedure set's identity."""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

import ordo
from ordo.embedded import read_log
from ordo.procedures.fingerprint import changes, describe, set_id
from ordo.broker.lag import requests_lag
from ordo.sequencer.sources import record_id
from ordo.broker.topics import ensure_topics, wait_for_leaders
from tests.helpers import dump_state, ordo as ordo_cli, read_results, stop
from tests.test_hardening_process import sequencer_child

pytestmark = pytest.mark.slow

APP = "tests.source_app:app"


def _order(i: int) -> tuple[bytes, str | None]:
    """The value of order i and the words its rejection must hold (None: a good order)."""
    kind = i % 10
    if kind == 3:
        return b"{not json", "the value is not JSON"
    if kind == 6:
        return json.dumps({"sku": f"s{i % 7}"}).encode(), "field 'qty' missing"
    if kind == 8:
        return json.dumps({"sku": f"s{i % 7}", "qty": "two"}).encode(), "argument 'qty'"
    return json.dumps({"sku": f"s{i % 7}", "qty": 1 + i % 3, "note": "n" * (i % 5)}).encode(), None


def _create(broker: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker})
    (future,) = admin.create_topics([NewTopic(topic, partitions, 1)]).values()
    future.result(30)
    wait_for_leaders(admin, [topic])


def _lag(broker: str, namespace: str, sources: list[str]) -> int:
    """The requests lag, once the broker tells it (a new group's coordinator may not answer at once)."""
    deadline = time.monotonic() + 60
    while (lag := requests_lag(broker, namespace, sources=sources)) is None:
        assert time.monotonic() < deadline, "the broker does not tell the requests lag"
        time.sleep(0.5)
    return lag


class OrdersProducer:
    """A plain confluent-kafka producer, nothing of Ordo's: order i goes to partition i % 2
    (unless told another), and where each landed is kept for the record's id."""

    def __init__(self, broker: str, topic: str):
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": broker, "linger.ms": 5})
        self.placed: dict[int, tuple[int, int]] = {}  # order -> (partition, offset)

    def send(self, orders: range, partition: int | None = None) -> None:
        for i in orders:
            value, _ = _order(i)
            self.producer.produce(
                self.topic,
                value=value,
                key=f"order-{i}".encode(),
                partition=i % 2 if partition is None else partition,
                headers=[("origin", b"shop-frontend")],
                on_delivery=lambda error, message, i=i: self._placed(i, error, message),
            )
        assert self.producer.flush(30) == 0

    def _placed(self, i: int, error, message) -> None:
        assert error is None, error
        self.placed[i] = (message.partition(), message.offset())


def test_a_topic_of_a_plain_producer_is_answered_once_through_sigkills(
    broker, namespace, tmp_path, monkeypatch, fault_report
):
    topic = f"{namespace}-orders"
    monkeypatch.setenv("ORDO_TEST_ORDERS_TOPIC", topic)
    _create(broker, topic, 2)
    ensure_topics(broker, namespace)
    count = 630
    orders = OrdersProducer(broker, topic)
    orders.send(range(0, 200))
    assert _lag(broker, namespace, [topic]) > 0  # unread source records count as waiting
    assert _lag(broker, namespace, []) == 0
    data_dir = str(tmp_path / "d")
    said = open(tmp_path / "run.err", "w")

    def run() -> subprocess.Popen:
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

    engine = run()
    # Orders 200-399 come while sequencers are killed, 400-599 while ordo run is down.
    feeder = threading.Thread(
        target=lambda: [(orders.send(range(start, start + 5)), time.sleep(0.2)) for start in range(200, 400, 5)]
    )
    kills = []
    try:
        feeder.start()
        killed = None
        for _ in range(2):  # the sequencer, twice: ordo run starts it again
            child = sequencer_child(engine, other_than=killed)
            time.sleep(1.5)
            child.send_signal(signal.SIGKILL)
            killed = child.pid
            kills.append(f"sequencer pid {child.pid}")
        sequencer_child(engine, other_than=killed)
        time.sleep(1.0)
        engine.send_signal(signal.SIGKILL)  # then the whole ordo run, its sequencer with it
        engine.wait(30)
        kills.append(f"ordo run pid {engine.pid}")
        feeder.join(120)
        orders.send(range(400, 600))
        engine = run()
        deadline = time.monotonic() + 120
        while _lag(broker, namespace, [topic]) != 0:  # its sequencer has started and read everything
            assert time.monotonic() < deadline and engine.poll() is None, "the orders are not read"
            time.sleep(0.5)
        # A third partition added while it runs: orders 600-629 there, from a producer that sees it.
        admin = AdminClient({"bootstrap.servers": broker})
        (grown,) = admin.create_partitions([NewPartitions(topic, 3)]).values()
        grown.result(30)
        wait_for_leaders(admin, [topic])
        more = OrdersProducer(broker, topic)
        more.send(range(600, count), partition=2)
        orders.placed.update(more.placed)
        records = read_results(broker, f"{namespace}.results", count, timeout=240)
        deadline = time.monotonic() + 60
        while _lag(broker, namespace, [topic]) != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        lag = _lag(broker, namespace, [topic])
    finally:
        stop(engine)
        said.close()
    errors = (tmp_path / "run.err").read_text()
    assert "Traceback" not in errors, errors
    assert f"reads the new partition(s) {topic}:2 of its source topics too" in errors, errors

    expected_ids = {record_id(topic, *orders.placed[i]): i for i in range(count)}
    outcomes = defaultdict(set)
    for record in records:
        outcomes[record["id"]].add((record["status"], record["error"]))
    assert set(outcomes) == set(expected_ids), f"{len(set(outcomes) & set(expected_ids))} of {count} answered"
    assert all(len(copies) == 1 for copies in outcomes.values()), "an order answered two ways"
    ordered = Counter()
    for request_id, i in expected_ids.items():
        ((status, error),) = outcomes[request_id]
        value, why = _order(i)
        if why is None:
            assert status == "committed", (request_id, status, error)
            order = json.loads(value)
            ordered[order["sku"]] += order["qty"]
        else:
            assert status == "rejected" and why in error, (request_id, status, error)
    last_batch = max(record["batch"] for record in records)
    in_log = Counter(entry[0] for batch in read_log(broker, namespace, last_batch) for entry in batch.entries)
    assert set(in_log) == set(expected_ids) and max(in_log.values()) == 1, "an order entered the log twice"
    assert dump_state(data_dir) == {("ordered", sku): qty for sku, qty in ordered.items()}
    assert lag == 0
    rejected = count - sum(1 for i in range(count) if _order(i)[1] is None)
    fault_report(
        f"SIGKILLed {', '.join(kills)} while a plain producer wrote {count} orders ({rejected} bad) to "
        f"{topic} (2 partitions, a third added while ordo run ran); checked: each order entered the log "
        f"once and has one outcome, bad ones rejected naming the field, state equal to the good orders' "
        f"sums, requests lag 0"
    )


def test_a_mapping_sees_the_whole_record_and_its_id_failures_are_answered_under_the_place(broker, namespace):
    """Records of a real topic, consumed by a plain consumer, through the sequencer's mapping."""
    from confluent_kafka import Consumer

    from ordo.sequencer.sources import SourceReading
    from ordo.broker.topics import Topics

    topic = f"{namespace}-payments"
    _create(broker, topic, 1)
    app = ordo.App(
        "pay",
        sources=[
            ordo.Source(
                topic,
                proc="place_order",
                id=lambda rec: rec.key.decode(),
                args=lambda rec: {
                    "sku": rec.json()["sku"],
                    "qty": rec.json()["qty"] * (2 if rec.header("promo") == b"double" else 1),
                },
            )
        ],
    )
    app.table("ordered", default=0)

    @app.procedure(args={"sku": ordo.Str(), "qty": ordo.Int()}, keys=[("ordered", "sku")])
    def place_order(ctx, args):
        ctx.write("ordered", args["sku"], ctx.read("ordered", args["sku"]) + args["qty"])

    sent = [
        (b"pay-1", b'{"sku": "a", "qty": 2}', [("promo", b"double")]),
        (None, b'{"sku": "a", "qty": 2}', []),
        (b"@pay-3", b'{"sku": "a", "qty": 2}', []),
        (b"pay-4", b'{"sku": "b", "qty": 1.5}', []),
    ]
    producer = Producer({"bootstrap.servers": broker})
    for key, value, headers in sent:
        producer.produce(topic, key=key, value=value, headers=headers, partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": broker,
            "group.id": f"{namespace}-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    messages, deadline = [], time.monotonic() + 60
    while len(messages) < len(sent) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            messages.append(message)
    consumer.close()
    reading = SourceReading(broker, Topics(namespace), app.registry())
    entries = [reading.entry(message, 64 * 1024, None)[0] for message in messages]
    assert entries == [
        ["pay-1", "place_order", {"sku": "a", "qty": 4}],
        [
            record_id(topic, 0, 1),
            None,
            f"source {topic}: its id failed: AttributeError: 'NoneType' object has no attribute 'decode'",
        ],
        [
            record_id(topic, 0, 2),
            None,
            f"source {topic}: its id gives '@pay-3': 'id' must not start with '@' (outcomes named by position use it)",
        ],
        ["pay-4", None, "place_order: argument 'qty': expected integer, got number"],
    ]


def test_a_missing_source_topic_is_said_in_one_line(broker, namespace, tmp_path, monkeypatch):
    topic = f"{namespace}-absent"
    monkeypatch.setenv("ORDO_TEST_ORDERS_TOPIC", topic)
    engine = ordo_cli(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "d"),
        "--runtime",
        "local",
        "--app",
        APP,
        "--quiet",
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        code = engine.wait(120)
    finally:
        stop(engine)
    said = engine.stderr.read().strip().splitlines()
    assert code != 0
    assert said[-1].endswith(
        f"source topic(s) {topic} do not exist: create them (or correct the app's sources) and start again"
    ), said
    assert not any("Traceback" in line for line in said), said


SHOP = """
import ordo
MAPPING

app = ordo.App("shop", sources=[ordo.Source("orders", proc="place_order", args=order_args)])
app.table("ordered", default=0)


@app.procedure(args={"sku": ordo.Str(), "qty": ordo.Int()}, keys=[("ordered", "sku")])
def place_order(ctx, args):
    ctx.write("ordered", args["sku"], ctx.read("ordered", args["sku"]) + args["qty"])
"""
ORDER_ARGS = """
def order_args(record):
    return {"sku": record.json()["sku"], "qty": QTY}
"""


def _described_shop(tmp_path, qty: str, own_module: bool) -> dict:
    """The shop app's set, its mapping in the app's module or in a module of its own."""
    from ordo.procedures.fingerprint import describe

    mapping = ORDER_ARGS.replace("QTY", qty)
    if own_module:
        (tmp_path / "shop_mapping.py").write_text(mapping)
        (tmp_path / "shop.py").write_text(SHOP.replace("MAPPING", "from shop_mapping import order_args"))
    else:
        (tmp_path / "shop.py").write_text(SHOP.replace("MAPPING", mapping))
    for name in ("shop", "shop_mapping"):
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
    try:
        return describe(importlib.import_module("shop").app.registry())
    finally:
        for name in ("shop", "shop_mapping"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize("own_module", [False, True], ids=["in-the-app-module", "in-a-module-of-its-own"])
def test_an_edited_mapping_changes_the_procedure_set(tmp_path, monkeypatch, own_module):
    monkeypatch.syspath_prepend(str(tmp_path))
    before = _described_shop(tmp_path, "1", own_module)
    again = _described_shop(tmp_path, "1", own_module)
    after = _described_shop(tmp_path, "record.json().get('qty', 1)", own_module)
    assert set_id(before) == set_id(again)
    assert set_id(before) != set_id(after)  # so a sequencer with the edited mapping needs `ordo upgrade`
    assert "source 'orders' changed" in changes(before, after)


def test_an_app_without_sources_keeps_its_identity():
    app = ordo.App("plain")
    app.table("t")

    @app.procedure(args={"k": ordo.Int()}, keys=[("t", "k")])
    def touch(ctx, args):
        ctx.write("t", args["k"], 1)

    assert "sources" not in describe(app.registry())


def test_sources_name_declared_procedures_and_topics_of_their_own():
    app = ordo.App("shop", sources=[ordo.Source("orders", proc="place_ordr")])
    app.table("t")

    @app.procedure(args={"k": ordo.Int()}, keys=[("t", "k")])
    def place_order(ctx, args):
        ctx.write("t", args["k"], 1)

    with pytest.raises(
        ValueError,
        match="source 'orders' names procedure 'place_ordr', which is not declared "
        r"\(did you mean 'place_order'\?\)",
    ):
        app.registry()
    with pytest.raises(ValueError, match="is no Kafka topic name"):
        ordo.Source("orders/eu", proc="place_order")
    with pytest.raises(TypeError, match="args= takes a function of the record"):
        ordo.Source("orders", proc="place_order", args={"sku": "sku"})


def test_a_batch_names_source_positions_by_topic_and_a_cursor_without_them_is_as_before():
    from ordo.log.records import LogCursor, encode_batch, encode_entry, encode_start

    cursor = LogCursor(namespace="shop")
    cursor.accept(encode_start("shop", None, "s1"), 0)
    before_sources = cursor.to_dict()
    assert "source_offsets" not in before_sources  # snapshots and checkpoints of apps without sources unchanged
    entry = encode_entry([record_id("orders", 1, 8), "place_order", {"sku": "a", "qty": 1}])
    batch = encode_batch(1, 0, 1000, {0: (0, 3), "orders:1": (5, 9)}, [entry], log_id="s1", namespace="shop")
    assert cursor.accept(batch, 1) is not None
    assert cursor.request_offsets == {0: 3} and cursor.source_offsets == {"orders:1": 9}
    kept = cursor.to_dict()
    assert LogCursor.from_dict(kept, "shop") == cursor
    assert LogCursor.from_dict(json.loads(json.dumps(kept)), "shop") == cursor  # a cursor kept as JSON too
