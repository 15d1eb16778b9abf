"""Reading what Ordo writes, as typed records: outcomes (`<ns>.results`), an output
stream's tuples (`<ns>.stream.<name>`) and the change data (`<ns>.changes`), each from a
position: the topic's beginning, its end (what comes from now on), or a batch (every
record of that batch and later ones).

    for change in client.read_changes(table="account", start=1, idle=5):
        print(change.batch, change.key, change.value)

The wire format of each record is in scheduler/outputs.py and docs/wire-format.schema.json.
Records are read committed only (an engine's aborted outputs never show), every
partition of the topic, each in its own order; a replay publishes the same records again
(under the same keys), so a reader may see a record twice. Starting at a batch reads the
topic from its beginning and passes over what is older: outputs of several partition
workers interleave, so no offset marks where a batch begins."""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from ordo.errors import OrdoError
from ordo.sequencer.kafka import consumer_config

BEGINNING, END = "beginning", "end"
Position = str | int  # "beginning", "end", or a batch number


@dataclass(frozen=True, slots=True)
class Outcome:
    """A request's outcome: `status` is committed, aborted or rejected; `result` what RUN
    returned (committed), `error` why not (aborted, rejected); `steps` the outcomes of the
    procedures a stream triggered within the same transaction, if any."""

    id: str
    status: str
    batch: int | None
    txn: int | None
    restarts: int
    result: Any
    error: str | None
    steps: tuple = ()


@dataclass(frozen=True, slots=True)
class StreamTuple:
    """A tuple a dataflow emitted to an output stream, at (batch, txn, seq) in log order."""

    stream: str
    batch: int
    txn: int
    seq: int
    value: Any


@dataclass(frozen=True, slots=True)
class Change:
    """One write of a committed transaction: `value` None and `deleted` True for a delete."""

    batch: int
    txn: int
    table: str
    key: Any
    value: Any
    deleted: bool = False


class UnreadableRecord(OrdoError, ValueError):
    """A record on one of Ordo's output topics that no engine wrote (anyone who may write
    the topic can put one there)."""


def outcome_of(value: bytes) -> Outcome:
    record = _object(value)
    try:
        return Outcome(record["id"], record["status"], record.get("batch"), record.get("txn"),
                       record.get("restarts", 0), record.get("result"), record.get("error"),
                       tuple(record.get("steps") or ()))
    except (KeyError, TypeError):
        raise UnreadableRecord(f"not an outcome: {value[:200]!r}") from None


def tuple_of(stream: str, key: bytes | None, value: bytes) -> StreamTuple:
    try:
        batch, txn, seq = (int(part) for part in (key or b"").decode().split(":"))
        return StreamTuple(stream, batch, txn, seq, json.loads(value))
    except (ValueError, UnicodeDecodeError):
        raise UnreadableRecord(f"not a tuple of stream {stream}: key {key!r}") from None


def changes_of(value: bytes) -> list[Change]:
    record = _object(value)
    try:
        batch = record["batch"]
        return [Change(batch, item["txn"], item["table"], item["key"], item.get("value"), bool(item.get("deleted")))
                for item in record["changes"]]
    except (KeyError, TypeError):
        raise UnreadableRecord(f"not change data: {value[:200]!r}") from None


def _object(value: bytes) -> dict:
    try:
        record = json.loads(value)
    except (TypeError, ValueError, RecursionError):
        record = None
    if not isinstance(record, dict):
        raise UnreadableRecord(f"not a JSON object: {value[:200]!r}")
    return record


def read_topic(bootstrap: str, settings: dict, topic: str, start: Position, idle: float | None,
               decode: Callable[[Any], list], batch_of: Callable[[Any], int | None], missing: Callable[[str], Exception],
               timeout: float = 10.0) -> Iterator[Any]:
    """Records of every partition of `topic` from `start`, decoded (`decode(message)` gives
    a list of records), until `idle` seconds pass without one (None: never)."""
    if start not in (BEGINNING, END) and not (type(start) is int and start >= 1):
        raise ValueError(f"a position is 'beginning', 'end' or a batch number from 1, got {start!r}")
    consumer = Consumer(consumer_config(bootstrap, {
        "group.id": f"ordo-reader-{uuid.uuid4().hex}", "enable.auto.commit": False,
        "isolation.level": "read_committed", **settings}))
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            raise missing(topic) from exc
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise missing(topic)
        offset = OFFSET_END if start == END else OFFSET_BEGINNING
        consumer.assign([TopicPartition(topic, p, offset) for p in sorted(metadata.partitions)])
        from_batch = start if type(start) is int else None
        last = time.monotonic()
        while idle is None or time.monotonic() - last < idle:
            for message in consumer.consume(1000, 0.1):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise OrdoError(f"reading {topic} failed: {error}")
                last = time.monotonic()
                try:
                    records = decode(message)
                except UnreadableRecord as exc:  # anyone who may write the topic can put one there
                    logging.getLogger("ordo.client").warning("passed over the record at offset %d of %s "
                                                             "partition %d: %s", message.offset(), topic,
                                                             message.partition(), exc)
                    continue
                for record in records:
                    if from_batch is None or (batch_of(record) or 0) >= from_batch:
                        yield record
    finally:
        consumer.close()

