"""Where a restarting sequencer begins to read the log: from a recent snapshot of an
earlier sequencer's state instead of the log's head, so start-up costs what the dedupe
window needs, not what the log has grown to.

The snapshot chosen is the newest one of the caller's own lane (sequencer k of S) that
still lies at least `window` of its accepted entries back, so the ids read forward from
it fill the duplicate check as a read from the head would. A start record of another
sequencer count met on the way back means the sequencers were reconfigured since: the
request partitions changed hands, and only a read from the head knows where each one
stands. Reading back checks start and snapshot records, and of batch records only the
one that a candidate snapshot follows.

Only a snapshot that verifies for this namespace's log and sits at its place is trusted: right
after the record of its lane it describes (the batch of its generation and epoch, or, for
the snapshot a sequencer writes after its start-up, that start record), with no record
of its lane between. A byte copy of a genuine snapshot appended later lies after
batches of its lane that it does not know of: taken as the seed, it would move the lane
backwards and have its requests sequenced again as repeats, which every engine passes
over. So it is passed over here."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

from ordo.broker.clients import consumer_config
from ordo.log.records import (
    BATCH,
    SNAPSHOT,
    SNAPSHOT_EVERY,
    START,
    UPGRADE,
    LogCursor,
    LogError,
    Snapshot,
    batch_head,
    decode,
)
from ordo.broker.topics import Topics

# Records read back per step: a little more than the distance between two snapshots (in a
# log written by a release that appended in transactions, each batch is followed by its
# transaction marker).
STEP = 2 * SNAPSHOT_EVERY + 16
# Records read before each step too, so a snapshot at a step's first offset has the record
# it follows at hand.
OVERLAP = 16


def find_seed(
    bootstrap: str,
    topic: str,
    before: int,
    window: int,
    sequencer: int = 0,
    sequencers: int = 1,
    log_id: str | None = None,
    timeout: float = 30.0,
) -> tuple[LogCursor, int, int] | None:
    """(cursor, entries accepted, batch time) to resume reading from, or None to read
    from the head. `before` is the offset of the caller's own start record, `log_id` the
    log's identity (None: a new log, read from its head)."""
    if log_id is None:
        return None
    namespace = Topics.namespace_of_log(topic)
    consumer = Consumer(
        consumer_config(
            bootstrap,
            {
                "group.id": f"{topic}.startup",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.max.bytes": 64 * 1024 * 1024,
                # A position the broker calls out of range must not move the read to the log's end,
                # where it would wait for records that never come.
                "auto.offset.reset": "earliest",
            },
        )
    )
    newest: Snapshot | None = None
    try:
        high = before
        while high > 0:
            low = max(0, high - STEP)
            records = records_between(consumer, topic, max(0, low - OVERLAP), high, timeout)
            for index in range(len(records) - 1, -1, -1):
                offset, value, head = records[index]
                if offset < low:
                    break
                if head is not None:
                    continue
                try:
                    kind, record = decode(value, namespace, log_id)
                except LogError:  # not a record of this log: every reader passes over it
                    continue
                if kind == START:
                    if record.sequencers != sequencers:
                        return None
                    continue
                if kind != SNAPSHOT or (record.sequencer, record.sequencers) != (sequencer, sequencers):
                    continue
                if not in_place(record, records[:index], namespace, log_id):
                    continue
                snapshot = record
                newest = newest or snapshot
                if newest.accepted - snapshot.accepted >= window:
                    cursor = LogCursor.from_dict(snapshot.cursor.to_dict(), namespace)
                    cursor.next_offset = offset + 1
                    return cursor, snapshot.accepted, snapshot.time_ms
            high = low
        return None
    finally:
        consumer.close()


def in_place(snapshot: Snapshot, earlier: list[list], namespace: str, log_id: str) -> bool:
    """Whether the newest record of the snapshot's lane before it (in `earlier`, in log
    order) is the one it follows: its lane's batch of the generation it names and the epoch
    before the one it names, or that generation's start record; with no upgrade record or
    start record of another sequencer count between, either of which closes every lane."""
    lane = snapshot.cursor.lanes.get(snapshot.sequencer)
    if lane is None:
        return False
    generation, next_epoch = lane
    for offset, value, head in reversed(earlier):
        if head is not None and head[7] != snapshot.sequencer:
            continue  # another lane's batch: not checked
        if value is None:
            return False  # a batch of the lane whose value was not kept: no snapshot follows it directly
        try:
            kind, record = decode(value, namespace, log_id)
        except LogError:
            continue
        if kind == BATCH:
            return record.generation == generation and record.epoch == next_epoch - 1
        if kind == UPGRADE or (kind == START and record.sequencers != snapshot.sequencers):
            return False  # every lane closed between the batch and the snapshot: it describes none
        if kind == START and record.sequencer == snapshot.sequencer:
            return offset == generation
        if kind == SNAPSHOT and record.sequencer == snapshot.sequencer:
            return False  # two snapshots of a lane with no batch between: one is out of place
    return False


def records_between(consumer: Consumer, topic: str, low: int, high: int, timeout: float) -> list[list]:
    """The records at offsets [low, high) as [offset, value, batch head or None]. Of batch
    records only the head is kept, and the value only of the latest batch of each lane
    before a record that is no batch (what a snapshot may follow): batches run to a
    megabyte. The read ends on the record at `high` - 1 or on the position `high` (the log's
    end, with a transaction marker last), not on a timeout."""
    consumer.assign([TopicPartition(topic, 0, low)])
    found: list[list] = []
    latest: dict = {}  # lane -> the entry of its latest batch, while no other record came after it

    def keep(offset: int, value: bytes) -> None:
        head = batch_head(value)
        if head is not None and type(head[7]) is not int:
            found.append([offset, None, head])  # no sequencer's batch
            return
        if head is None:
            latest.clear()  # the batches before it keep their values
        else:
            before = latest.get(head[7])
            if before is not None:
                before[1] = None
            latest[head[7]] = entry = [offset, value, head]
            found.append(entry)
            return
        found.append([offset, value, None])

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        # Briefly: a log that ends on a transaction marker has no record at `high` - 1 to end on.
        for message in consumer.consume(500, 0.05):
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
                    keep(offset, value)
                return found
            keep(offset, value)
        if consumer.position([TopicPartition(topic, 0)])[0].offset >= high:
            return found  # `high` is the log's end, and what lies before it a transaction marker
    raise TimeoutError(
        f"reading {topic} back from offset {low} to {high} made no progress for {timeout:.0f} s "
        f"(last record read: {'none' if last is None else f'offset {last}'})"
    )
