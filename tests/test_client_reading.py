"""The client reads everything Ordo writes, as typed records, from a position: outcomes, an
output stream's tuples and the change data, sync and async (`async with`), against a real
`ordo run` of examples/inventory.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from ordo.client import AsyncClient, Client
from ordo.errors import TopicMissing
from ordo.reading import Change, Outcome, StreamTuple
from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT, stop

pytestmark = pytest.mark.slow


@pytest.fixture
def served(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=2)
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            str(tmp_path / "d"),
            "--app",
            "inventory:app",
            "--runtime",
            "local",
            "--partitions",
            "2",
            "--quiet",
        ],
        cwd=os.path.join(ROOT, "examples"),
        env=env,
    )
    with Client(broker, namespace) as client:
        client.wait_for_topics()
        outcomes = {}
        for step in (
            [("deliver", {"batch": [{"warehouse": 1, "item": 7, "qty": 12}, {"warehouse": 2, "item": 3, "qty": 4}]})],
            [("ship", {"warehouse": 1, "item": 7, "qty": 5}), ("ship", {"warehouse": 2, "item": 3, "qty": 9})],
        ):
            ids = [client.submit(proc, args) for proc, args in step]
            outcomes.update(client.wait(ids, timeout=120))
    try:
        yield broker, namespace, outcomes
    finally:
        assert stop(engine) == 0


def test_outcomes_tuples_and_changes_from_a_position(served):
    broker, namespace, submitted = served
    client = Client(broker, namespace)
    outcomes = list(client.read_outcomes(idle=3))
    assert all(isinstance(o, Outcome) for o in outcomes)
    assert {o.id: (o.status, o.result) for o in outcomes} == {
        i: (o["status"], o["result"]) for i, o in submitted.items()
    }
    delivered = next(o for o in outcomes if o.result == 2)  # the delivery's two lines
    ships = [o for o in outcomes if o is not delivered]
    first_ship = min(o.batch for o in ships)
    assert first_ship > delivered.batch
    later = list(client.read_outcomes(start=first_ship, idle=3))
    assert sorted(o.id for o in later) == sorted(o.id for o in ships)
    assert list(client.read_outcomes(start="end", idle=2)) == []

    shipped = next(o for o in later if o.result == 7)
    assert list(client.read_stream("low_stock", idle=3)) == [
        StreamTuple("low_stock", shipped.batch, shipped.txn, 0, {"warehouse": 1, "item": 7, "left": 7})
    ]
    stock = sorted(client.read_changes(table="stock", idle=3), key=lambda c: (c.batch, c.txn, str(c.key)))
    assert all(isinstance(c, Change) for c in stock)
    assert [(c.key, c.value) for c in stock] == [([1, 7], 12), ([2, 3], 4), ([1, 7], 7)]
    assert {c.table for c in client.read_changes(idle=3)} >= {"stock", "delivered"}
    with pytest.raises(TopicMissing):
        next(client.read_stream("no_such_stream", idle=1))


def test_async_reading_with_async_with(served):
    broker, namespace, submitted = served

    async def read() -> tuple[list, list]:
        async with AsyncClient(broker, namespace) as client:
            outcomes = [o async for o in client.read_outcomes(idle=3)]
            tuples = [t async for t in client.read_stream("low_stock", idle=3)]
            return outcomes, tuples

    outcomes, tuples = asyncio.run(read())
    assert {o.id for o in outcomes} == set(submitted)
    assert [t.value for t in tuples] == [{"warehouse": 1, "item": 7, "left": 7}]


def test_a_record_no_engine_wrote_is_passed_over(served, caplog):
    from confluent_kafka import Producer

    broker, namespace, submitted = served
    producer = Producer({"bootstrap.servers": broker})
    producer.produce(f"{namespace}.results", b"not json", b"forged")
    producer.produce(f"{namespace}.results", b'{"id": "x"}', b"x")
    assert producer.flush(30) == 0
    outcomes = list(Client(broker, namespace).read_outcomes(idle=3))
    assert {o.id for o in outcomes} == set(submitted)
    assert sum("passed over the record" in r.getMessage() for r in caplog.records) == 2


def test_the_documented_reader_example_runs(served):
    broker, namespace, submitted = served
    env = {**os.environ, "PYTHONPATH": ROOT, "ORDO_BOOTSTRAP_SERVERS": broker, "ORDO_NAMESPACE": namespace}
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "inventory_reader.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum("low stock" in line and "'left': 7" in line for line in lines) == 1, lines
    assert sum(": stock[" in line for line in lines) == 3 and sum("committed" in line for line in lines) == 2


def test_every_record_matches_the_wire_format_schema(served):
    """docs/wire-format.schema.json describes what is on each topic: requests, outcomes,
    change data and stream tuples, as a client of any language reads them."""
    import json

    import jsonschema

    from tests.helpers import topic_reader

    broker, namespace, submitted = served
    with open(os.path.join(ROOT, "docs", "wire-format.schema.json")) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)

    def validate(topic: str, definition: str) -> int:
        consumer = topic_reader(broker, topic, consumer_timeout_ms=2000)
        records = [json.loads(message.value) for message in consumer]
        consumer.close()
        for record in records:
            jsonschema.validate(record, {**schema, "$ref": f"#/$defs/{definition}"})
        return len(records)

    assert validate(f"{namespace}.requests", "request") == len(submitted)
    assert validate(f"{namespace}.results", "outcome") == len(submitted)
    assert validate(f"{namespace}.changes", "changes") >= 2
    assert validate(f"{namespace}.stream.low_stock", "stream_tuple") == 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"id": "x", "status": "done"}, {**schema, "$ref": "#/$defs/outcome"})
