"""A worker's output producer that stops delivering: when it counts as stalled, and which
of its unacknowledged outputs reached the broker before it was replaced.

Stalled: nothing acknowledged while the broker has answered for `stall_after` seconds on
end. Acknowledgements that stop because the broker is away are an outage, waited for
however long; the broker's answers are asked for only while nothing is acknowledged.

An idempotent producer writes each partition's messages in the order they were produced,
without gaps, so of the messages it never acknowledged, what reached the broker is, per
partition, a prefix of them. Reading the topics back from just before the oldest of them
was produced tells which arrived; a new producer then sends only the others. Every output
has a key of its own (a request id, "<batch>.<txn>.<part>", "<batch>:<txn>:<seq>"), so a
(topic, key, value) found there is that output and no other."""

from __future__ import annotations

import time
import uuid
from typing import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ordo.broker.clients import LEADER_MOVING, arrived, consumer_config, watermarks

# Producers stamp CreateTime from their own clock; the worker notes the time itself when it
# publishes, so a record produced then is never stamped much before. The margin only reads
# a little more.
CLOCK_MARGIN_MS = 2_000


# Answers that asking again does not change: the principal may not read the topic.
REFUSED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED})

# How often a worker whose outputs have no acknowledgement asks whether the broker answers.
LOOK_EVERY_S = 5.0


class StallWatch:
    """Counts a stall from the later of the last acknowledgement and the moment the broker
    was first seen answering again."""

    def __init__(self, stall_after: float, broker_answers: Callable[[], bool]):
        self.stall_after = stall_after
        self.look_every = min(LOOK_EVERY_S, stall_after / 2)
        self._broker_answers = broker_answers
        self._count = 0
        self._looked = time.monotonic()
        self._answering_since: float | None = None

    def progress(self, count: int, now: float) -> None:
        """`count` acknowledgements so far; outputs are waited for from `now`."""
        self._count, self._looked, self._answering_since = count, now, None

    def stalled(self, count: int, now: float) -> bool:
        if count != self._count:
            self.progress(count, now)
            return False
        if now - self._looked < self.look_every:
            return False
        self._looked = now
        if not self._broker_answers():
            self._answering_since = None
            return False
        if self._answering_since is None:
            self._answering_since = now
        if now - self._answering_since < self.stall_after:
            return False
        self._answering_since = None  # a new producer gets as long again
        return True


class TailsUnread(RuntimeError):
    """The topics could not be read back within the time given."""


def written_since(
    bootstrap: str, topics: Iterable[str], since_ms: int, timeout: float
) -> set[tuple[str, bytes, bytes]]:
    """(topic, key, value) of every record in `topics` stamped at `since_ms` or later, up to
    each partition's end when asked; asked again while the broker is still loading them.
    Raises TailsUnread if that takes over `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _read_since(bootstrap, sorted(set(topics)), since_ms, deadline)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if getattr(error, "code", lambda: None)() not in LEADER_MOVING or time.monotonic() > deadline - 1:
                raise TailsUnread(str(error or exc)) from None
            time.sleep(0.5)


def _read_since(bootstrap: str, topics: list[str], since_ms: int, deadline: float) -> set[tuple[str, bytes, bytes]]:
    consumer = Consumer(
        consumer_config(
            bootstrap,
            {
                "group.id": f"ordo-output-check-{uuid.uuid4().hex}",  # assigned only; never commits
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",  # outputs are not transactional
            },
        )
    )
    try:
        starts = []
        for topic in topics:
            metadata = consumer.list_topics(topic, timeout=_left(deadline)).topics.get(topic)
            if metadata is None or metadata.error is not None:
                raise TailsUnread(f"{topic}: {metadata.error if metadata is not None else 'not listed'}")
            starts += [TopicPartition(topic, p, since_ms - CLOCK_MARGIN_MS) for p in metadata.partitions]
        ends = {}
        for start in consumer.offsets_for_times(starts, timeout=_left(deadline)):
            if start.offset < 0:  # no record stamped that late
                continue
            _, end = watermarks(consumer, TopicPartition(start.topic, start.partition), _left(deadline))
            if end > start.offset:
                ends[(start.topic, start.partition)] = (start.offset, end)
        if not ends:
            return set()
        consumer.assign([TopicPartition(t, p, first) for (t, p), (first, _) in ends.items()])
        found: set[tuple[str, bytes, bytes]] = set()
        left = {where: end for where, (_, end) in ends.items()}
        while left:
            for message in arrived(consumer, min(0.5, _left(deadline))):
                error = message.error()
                if error is not None:
                    if error.code() in REFUSED:  # asking again would be refused again, until the deadline
                        raise TailsUnread(f"{message.topic()}: {error.str()}")
                    continue
                where = (message.topic(), message.partition())
                found.add((message.topic(), message.key() or b"", message.value() or b""))
                if where in left and message.offset() + 1 >= left[where]:
                    del left[where]
        return found
    finally:
        consumer.close()


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TailsUnread("out of time")
    return left
