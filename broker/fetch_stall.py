"""A consumer that fetches nothing more although its partitions hold records past its
positions: seen after a broker restart under load (librdkafka 2.16, a `read_committed`
consumer, a node stopped and started again), with every other client of the broker served.
The remedy, as for the log's readers (log/reader.py), is a new consumer that reads on
from the positions once REFETCH_AFTER has passed without progress: assigning the partition
again has once left a log reader stalled as before.

Where a partition ends is asked in a thread of its own, on a consumer of its own: a Kafka
broker answers one connection's requests in order, so the question on the reading consumer
would wait out its outstanding fetch (log/probe.py). That consumer is replaced too
once it has had no answer for REFETCH_AFTER."""

from __future__ import annotations

import logging
import threading
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from ordo.broker.clients import close_later, consumer_config

# How long records past the reader's position may stay out of its reach before it reads on
# with a new consumer. After a broker restart that moved the log's leader epoch, a
# read_committed consumer has been seen to fetch nothing more (records the broker serves
# to any new reader), and once even after being assigned its position again.
REFETCH_AFTER = 10.0

Partition = tuple[str, int]
log = logging.getLogger("ordo.sequencer")


class EndWatch:
    """The end offsets of the partitions last given to `watch`, asked every `every` seconds."""

    def __init__(self, bootstrap: str, every: float, renew_after: float = REFETCH_AFTER, consumer=None):
        """`consumer()` makes the consumer that asks (by default one of its own); a new one
        replaces it once `renew_after` seconds have passed without an answer, as the log's
        readers do, since a consumer stuck after a broker restart would leave every stalled
        fetch unnoticed."""
        self.every, self.renew_after = every, renew_after
        self.ends: dict[Partition, int] = {}
        self.renewed = 0  # how many times the asking consumer was replaced
        self._partitions: list[Partition] = []
        self._stop = threading.Event()
        self._new_consumer = consumer or (
            lambda: Consumer(
                consumer_config(bootstrap, {"group.id": f"ordo-ends-{uuid.uuid4().hex}", "enable.auto.commit": False})
            )
        )
        self._consumer = self._new_consumer()
        self._thread = threading.Thread(target=self._run, name="partition ends", daemon=True)
        self._thread.start()

    def watch(self, partitions: list[Partition]) -> None:
        self._partitions = list(partitions)

    def _run(self) -> None:
        unanswered_since: float | None = None
        try:
            while not self._stop.wait(self.every):
                ends = {}
                for topic, partition in self._partitions:
                    try:
                        _, end = self._consumer.get_watermark_offsets(
                            TopicPartition(topic, partition), timeout=self.every, cached=False
                        )
                    except KafkaException:
                        continue  # a broker away says nothing of where a partition ends
                    ends[(topic, partition)] = end
                self.ends = ends
                if ends or not self._partitions:
                    unanswered_since = None
                    continue
                now = time.monotonic()
                unanswered_since = unanswered_since or now
                if now - unanswered_since >= self.renew_after:
                    old, self._consumer = self._consumer, self._new_consumer()
                    close_later(old)
                    self.renewed += 1
                    unanswered_since = now
                    log.warning(
                        "no answer for %.0f s to where %s end: asking with a new consumer",
                        self.renew_after,
                        ", ".join(f"{topic} partition {partition}" for topic, partition in self._partitions),
                    )
        finally:
            self._consumer.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


class FetchStall:
    """Which partitions have held records past an unchanged position for `after` seconds.
    A partition that ends one past the position is caught up (a transaction marker may
    follow the last record)."""

    def __init__(self, after: float = REFETCH_AFTER):
        self.after = after
        self._since: dict[Partition, tuple[float, int]] = {}  # partition -> (since when, at position)

    def stuck(self, positions: dict[Partition, int], ends: dict[Partition, int], now: float) -> list[Partition]:
        stuck = []
        for where, position in positions.items():
            end = ends.get(where)
            if end is None or position < 0 or end <= position + 1:
                self._since.pop(where, None)
                continue
            since = self._since.get(where)
            if since is None or since[1] != position:
                self._since[where] = (now, position)
            elif now - since[0] >= self.after:
                stuck.append(where)
                self._since[where] = (now, position)  # looked at again after as long
        return stuck


class ReadOn:
    """The same remedy for a reader that waits at the tail (a client's outcome reader, the
    topic readers of ordo.reading): after `after` seconds without a record, where its
    partitions end is asked on a consumer of its own, and a reader whose partitions hold
    records past its positions is replaced by a new consumer reading on from there. An
    idle reader at the tail asks once per `after`; one whose broker is away keeps waiting.

    `starts` are the offsets the reader was assigned, by (topic, partition): where it stands
    until it has read something (a logical offset: the low watermark for OFFSET_BEGINNING,
    unknown for the end)."""

    def __init__(self, new_consumer, starts: dict[Partition, int], after: float = REFETCH_AFTER):
        self._new_consumer = new_consumer
        self._starts = dict(starts)
        self.after = after
        self._quiet_since = time.monotonic()

    def read(self) -> None:
        """The reader took a record."""
        self._quiet_since = time.monotonic()

    def checked(self, consumer):
        """`consumer`, or the consumer that reads on in its place."""
        now = time.monotonic()
        if now - self._quiet_since < self.after:
            return consumer
        self._quiet_since = now
        try:
            positions = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(consumer.assignment())}
        except KafkaException:
            return consumer
        at = {where: offset if offset >= 0 else self._starts.get(where, offset) for where, offset in positions.items()}
        probe = self._new_consumer()
        try:
            behind = False
            for (topic, partition), offset in at.items():
                low, end = probe.get_watermark_offsets(TopicPartition(topic, partition), timeout=2.0, cached=False)
                if offset == OFFSET_BEGINNING:
                    at[(topic, partition)] = offset = low
                behind = behind or (offset >= 0 and end > offset)
        except KafkaException:
            return consumer  # a broker away: the reader reads on when it is back
        finally:
            close_later(probe)
        if not behind:
            return consumer
        logging.getLogger("ordo.client").warning(
            "a reader of %s fetched nothing for %.0f s with records past its position: reading on with a new consumer",
            ", ".join(sorted({topic for topic, _ in at})),
            self.after,
        )
        reader = self._new_consumer()
        reader.assign([TopicPartition(topic, partition, offset) for (topic, partition), offset in at.items()])
        self._starts.update(at)
        close_later(consumer)
        return reader
