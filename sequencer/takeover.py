"""How a sequencer learns that its lane moved on without it: from the log itself.

A sequencer's batches count only while the log's readers accept them (`LogCursor.accept`):
while its lane's current generation is the one its own start record opened. Three records
end that: a newer start record of its lane (another sequencer took over), a start record
for another sequencer count (the sequencers were reconfigured, every lane closes), and an
upgrade record (`ordo upgrade`, every lane closes). A sequencer that goes on appending
after one of them loses nothing, since every reader drops its batches and the requests
they held are sequenced again by the sequencer that took over from the log's own
positions, but it must stop: one engine per namespace.

So each sequencer follows the log after its own start record in a thread of its own, with
the same acceptance rule every reader applies to start, upgrade and skip records (a copy
of a start record already met opens nothing), passing over batch records undecoded.
The sequencer asks `moved_on()` before each append and while idle: the answer costs no
request to the broker.

Without a transaction to fence it, a superseded sequencer's appends are bounded by the
watch alone, so the sequencer never runs ahead of it by more than one append: before an
append it waits until the watch has read through every append of its own but the latest
(`read_through`). A record that ends its generation lies before all but at most two of its
appends (one it had acknowledged, one in flight), and the third waits for the watch to
pass it: a superseded sequencer leaves at most two stale appends behind, whatever the
scheduling of its threads, which readers drop as stale. The watch normally reads an
append a fetch after it was acknowledged, long before the next is due, so the wait costs
nothing while all is well. A snapshot is appended only once the watch has read through
the batch it follows with the lane still this sequencer's (`Sequencer._cut`): a snapshot
always describes a batch every reader accepts."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, TopicPartition

from ordo.broker.clients import arrived, close_later, consumer_config
from ordo.log.records import LogCursor, LogError, is_batch_record
from ordo.broker.fetch_stall import REFETCH_AFTER


# The most appends a superseded sequencer makes after the record that ended its generation.
STALE_APPENDS = 2


class TakeoverWatch:
    """Follows `topic` from the record after `cursor.next_offset - 1` (this sequencer's
    start record, or the snapshot after it) and notes the offset of the first record after
    which lane `lane`'s generation is no longer `generation`."""

    def __init__(self, bootstrap: str, topic: str, cursor: LogCursor, lane: int, generation: int, group: str):
        self.topic, self.lane, self.generation = topic, lane, generation
        self.moved_at: int | None = None  # the offset of the record that ended this lane's generation
        self.upgraded = False  # whether that record is an upgrade record
        self._read_to = cursor.next_offset  # every record before this offset has been read
        self._wanted = 0  # the offset the sequencer waits for the watch to reach
        self._progress = threading.Condition()
        self._cursor = LogCursor.from_dict(cursor.to_dict(), cursor.namespace)
        self._cursor.only = None  # as the engines read it: a reconfiguration closes this lane too
        self._stop = threading.Event()
        self._bootstrap, self._group = bootstrap, group
        self._consumer = self._consumer_at(cursor.next_offset)
        self._thread = threading.Thread(target=self._run, name=f"takeover watch {topic}", daemon=True)
        self._thread.start()

    def _consumer_at(self, offset: int) -> Consumer:
        consumer = Consumer(
            consumer_config(
                self._bootstrap,
                {
                    "group.id": self._group,
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.max.bytes": 64 * 1024 * 1024,
                },
            )
        )
        consumer.assign([TopicPartition(self.topic, 0, offset)])
        return consumer

    def moved_on(self) -> int | None:
        """The offset of the record after which readers no longer take this sequencer's
        batches, once one was read; else None."""
        return self.moved_at

    def read_through(self, end: int, timeout: float) -> bool:
        """Wait until every record before offset `end` has been read, or the lane moved on;
        False if neither happened within `timeout` seconds (the log cannot be read back)."""
        with self._progress:
            self._wanted = max(self._wanted, end)
            self._progress.wait_for(
                lambda: self._read_to >= end or self.moved_at is not None or not self._thread.is_alive(), timeout
            )
            return self._read_to >= end or self.moved_at is not None

    def _run(self) -> None:
        moved = time.monotonic()  # when the watch last read a record, or began to wait for one
        try:
            while not self._stop.is_set() and self.moved_at is None:
                # Errors pass: the log's readers and the sequencer's watch report a broker's trouble.
                read_to = self._read_to
                for message in arrived(self._consumer, 0.2, 1000):
                    if message.error() is not None:
                        continue
                    if self._ends_generation(message.offset(), message.value()):
                        self.moved_at = message.offset()
                        break
                    read_to = max(read_to, message.offset() + 1)
                now = time.monotonic()
                if read_to != self._read_to or self.moved_at is not None:
                    moved = now
                    with self._progress:
                        self._read_to = read_to
                        self._progress.notify_all()
                elif self._wanted <= read_to:
                    moved = now
                elif now - moved >= REFETCH_AFTER:
                    # Records the sequencer appended, and none came: read on with a new consumer
                    # (as LogReader does).
                    close_later(self._consumer)
                    self._consumer = self._consumer_at(read_to)
                    moved = now
        finally:
            self._consumer.close()
            with self._progress:
                self._progress.notify_all()

    def _ends_generation(self, offset: int, value: bytes | None) -> bool:
        if value is None or is_batch_record(value):
            return False  # batches move no lane's generation, and may run to a megabyte
        cursor = self._cursor
        try:
            cursor.accept(value, offset)
        except LogError:
            return False  # a record every reader stops at: the engines say so
        cursor.unreported.clear()
        lane = cursor.lanes.get(self.lane)
        if lane is not None and lane[0] == self.generation:
            return False
        self.upgraded = cursor.upgraded is not None
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
