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
from ordo.broker.clients import arrived, consumer_config
from ordo.broker.fetch_stall import ReadOn

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
        return Outcome(
            record["id"],
            record["status"],
            record.get("batch"),
            record.get("txn"),
            record.get("restarts", 0),
            record.get("result"),
            record.get("error"),
            tuple(record.get("steps") or ()),
        )
    except (KeyError, TypeError):
        raise UnreadableRecord(f"not an outcome: {value[:200]!r}") from None


def tuple_of(stream: str, key: bytes | None, value: bytes) -> StreamTuple:
    try:
        batch, txn, seq = (int(part) for part in (key or b"").decode().split(":"))
        return StreamTuple(stream, batch, txn, seq, json.loads(value))
    except (ValueError, UnicodeDecodeError):
        raise UnreadableRecord(f"not a tuple of stream {stream}: key {key!r}") from None


def _record_changes(record: dict, value: bytes) -> tuple[tuple | None, list[Change]]:
    """((batch, txn, txns, part, parts) or None for a record of the format before, the
    record's writes)."""
    try:
        batch = record["batch"]
        txn = record.get("txn")
        if txn is None:  # one record per batch and partition: each change names its txn
            return None, [
                Change(batch, item["txn"], item["table"], item["key"], item.get("value"), bool(item.get("deleted")))
                for item in record["changes"]
            ]
        place = (batch, txn, record["txns"], record["part"], record["parts"])
        if not all(type(n) is int for n in place) or not (0 <= txn < place[2] and 0 <= place[3] < place[4]):
            raise TypeError
        return place, [
            Change(batch, txn, item["table"], item["key"], item.get("value"), bool(item.get("deleted")))
            for item in record["changes"]
        ]
    except (KeyError, TypeError, AttributeError):
        raise UnreadableRecord(f"not change data: {value[:200]!r}") from None


class WholeBatches:
    """Gathers <ns>.changes records into whole batches. A transaction's change data is one
    record or more (`part` of `parts`), every transaction of a batch has one, and each
    names the batch's size (`txns`); they reach a reader from several partitions of the
    topic in any order. `add` gives a batch's writes once all of them are in, in
    transaction order (within one, key order), and the same again if a replay publishes
    the whole batch again. Records of the format before (one per batch and engine
    partition) come out as they are read."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[int, dict[tuple[int, int], list[Change]], dict[int, int]]] = {}

    def add(self, value: bytes) -> list[Change]:
        place, changes = _record_changes(_object(value), value)
        if place is None:
            return changes
        batch, txn, txns, part, parts = place
        pending = self._pending.get(batch)
        if pending is None:
            pending = self._pending[batch] = (txns, {}, {})
        expected, received, parts_of = pending
        if txns != expected or parts_of.setdefault(txn, parts) != parts:
            raise UnreadableRecord(
                f"change data of batch {batch} that disagrees with the batch's other records "
                f"(txns {txns}, parts {parts}): {value[:200]!r}"
            )
        received[(txn, part)] = changes
        if len(parts_of) < expected or len(received) < sum(parts_of.values()):
            return []
        del self._pending[batch]
        return [change for place in sorted(received) for change in received[place]]


def _object(value: bytes) -> dict:
    try:
        record = json.loads(value)
    except (TypeError, ValueError, RecursionError):
        record = None
    if not isinstance(record, dict):
        raise UnreadableRecord(f"not a JSON object: {value[:200]!r}")
    return record


def read_topic(
    bootstrap: str,
    settings: dict,
    topic: str,
    start: Position,
    idle: float | None,
    decode: Callable[[Any], list],
    batch_of: Callable[[Any], int | None],
    missing: Callable[[str], Exception],
    timeout: float = 10.0,
) -> Iterator[Any]:
    """Records of every partition of `topic` from `start`, decoded (`decode(message)` gives
    a list of records), until `idle` seconds pass without one (None: never)."""
    if start not in (BEGINNING, END) and not (type(start) is int and start >= 1):
        raise ValueError(f"a position is 'beginning', 'end' or a batch number from 1, got {start!r}")

    def new_consumer() -> Consumer:
        return Consumer(
            consumer_config(
                bootstrap,
                {
                    "group.id": f"ordo-reader-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    **settings,
                },
            )
        )

    consumer = new_consumer()
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            raise missing(topic) from exc
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise missing(topic)
        offset = OFFSET_END if start == END else OFFSET_BEGINNING
        starts = {(topic, p): offset for p in sorted(metadata.partitions)}
        consumer.assign([TopicPartition(topic, p, offset) for (topic, p), offset in starts.items()])
        # A reader at the tail through a broker restart may fetch nothing more (broker/fetch_stall.py).
        read_on = ReadOn(new_consumer, starts)
        from_batch = start if type(start) is int else None
        last = time.monotonic()
        while idle is None or time.monotonic() - last < idle:
            messages = arrived(consumer, 0.1, 1000)
            if not messages:
                consumer = read_on.checked(consumer)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise OrdoError(f"reading {topic} failed: {error}")
                last = time.monotonic()
                read_on.read()
                try:
                    records = decode(message)
                except UnreadableRecord as exc:  # anyone who may write the topic can put one there
                    logging.getLogger("ordo.client").warning(
                        "passed over the record at offset %d of %s partition %d: %s",
                        message.offset(),
                        topic,
                        message.partition(),
                        exc,
                    )
                    continue
                for record in records:
                    if from_batch is None or (batch_of(record) or 0) >= from_batch:
                        yield record
    finally:
        consumer.close()
