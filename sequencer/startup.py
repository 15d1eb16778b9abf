"""Where a restarting sequencer begins to read the log: from a recent snapshot of an
earlier sequencer's state instead of the log's head, so start-up costs what the dedupe
window needs, not what the log has grown to.

The snapshot chosen is the newest one of the caller's own lane (sequencer k of S) that
still lies at least `window` of its accepted entries back, so the ids read forward from
it fill the duplicate check as a read from the head would. A start record of another
sequencer count met on the way back means the sequencers were reconfigured since: the
request partitions changed hands, and only a read from the head knows where each one
stands. Reading back touches only start and snapshot records' values."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

from ordo.sequencer.kafka import consumer_config
from ordo.sequencer.log import SNAPSHOT, SNAPSHOT_EVERY, START, LogCursor, Snapshot, Start, decode, is_batch_record

# Records read back per step: a little more than the distance between two snapshots
# (each batch is followed by its transaction marker).
STEP = 2 * SNAPSHOT_EVERY + 16


def find_seed(bootstrap: str, topic: str, before: int, window: int, sequencer: int = 0, sequencers: int = 1,
              timeout: float = 30.0) -> tuple[LogCursor, int, int] | None:
    """(cursor, entries accepted, batch time) to resume reading from, or None to read
    from the head. `before` is the offset of the caller's own start record."""
    consumer = Consumer(consumer_config(bootstrap, {
        "group.id": f"{topic}.startup", "enable.auto.commit": False,
        "isolation.level": "read_committed", "fetch.max.bytes": 64 * 1024 * 1024,
        # A position the broker calls out of range must not move the read to the log's end,
        # where it would wait for records that never come.
        "auto.offset.reset": "earliest",
    }))
    newest: Snapshot | None = None
    try:
        high = before
        while high > 0:
            low = max(0, high - STEP)
            for offset, record in reversed(_records(consumer, topic, low, high, timeout)):
                if isinstance(record, Start):
                    if record.sequencers != sequencers:
                        return None
                    continue
                if (record.sequencer, record.sequencers) != (sequencer, sequencers):
                    continue
                snapshot = record
                newest = newest or snapshot
                if newest.accepted - snapshot.accepted >= window:
                    cursor = LogCursor.from_dict(snapshot.cursor.to_dict())
                    cursor.next_offset = offset + 1
                    return cursor, snapshot.accepted, snapshot.time_ms
            high = low
        return None
    finally:
        consumer.close()


def _records(consumer: Consumer, topic: str, low: int, high: int,
             timeout: float) -> list[tuple[int, Snapshot | Start]]:
    """Snapshot and start records at offsets [low, high). A record at `high` or later always exists
    (the caller's start record), so the read ends on an offset, not on a timeout."""
    consumer.assign([TopicPartition(topic, 0, low)])
    found: list[tuple[int, Snapshot | Start]] = []
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        for message in consumer.consume(500, 0.5):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"log read failed: {error}")
            offset, value = message.offset(), message.value()
            deadline, last = time.monotonic() + timeout, offset
            if offset < low:
                continue
            if offset >= high - 1:
                if offset < high:
                    _keep(found, offset, value)
                return found
            _keep(found, offset, value)
    raise TimeoutError(f"reading {topic} back from offset {low} to {high} made no progress for {timeout:.0f} s "
                       f"(last record read: {'none' if last is None else f'offset {last}'})")


def _keep(found: list, offset: int, value: bytes) -> None:
    if is_batch_record(value):
        return
    try:
        kind, record = decode(value)
    except Exception:  # not a sequencer's record: every reader skips it
        return
    if kind in (SNAPSHOT, START):
        found.append((offset, record))
