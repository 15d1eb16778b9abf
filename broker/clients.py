"""Settings every Ordo Kafka client shares."""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from ordo.broker.client_settings import user_kafka_settings

# librdkafka's own log lines (connection FAIL lines repeated while a broker is away) go
# through Python logging under this name, shown only with --log-level info or debug: Ordo
# reports what actually fails in one line of its own.
LIBRDKAFKA_LOGGER = logging.getLogger("ordo.librdkafka")
# Quiet in every process (Ray workers and the sequencer child too) unless a command's
# --log-level lowers it (ordo/config.py).
LIBRDKAFKA_LOGGER.setLevel(logging.CRITICAL)


class OneLinePerCause(logging.Filter):
    """librdkafka repeats a failure for every connection attempt, every thread and every
    client (hundreds of lines in seconds while a broker is away). Let through the first
    line of each cause (the message with its numbers taken out) per `interval` seconds,
    and say on the next one how many were held back."""

    _numbers = re.compile(r"\d+")

    def __init__(self, interval: float = 10.0):
        super().__init__()
        self.interval = interval
        self._causes: dict[str, list] = {}  # cause -> [when last let through, held back since]
        self._lock = threading.Lock()  # librdkafka logs from the threads that poll its clients

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cause = self._numbers.sub("#", message.split("]: ", 1)[-1])
        now = time.monotonic()
        with self._lock:
            seen = self._causes.get(cause)
            if seen is not None and now - seen[0] < self.interval:
                seen[1] += 1
                return False
            held = seen[1] if seen is not None else 0
            self._causes[cause] = [now, 0]
        if held:
            record.msg, record.args = f"{message} ({held} more like it in the last {self.interval:.0f} s)", None
        return True


LIBRDKAFKA_LOGGER.addFilter(OneLinePerCause())


def kafka_config(bootstrap: str, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """librdkafka settings: quiet about connections a broker closes at shutdown (normal,
    not an error), then the user's settings for every client (broker/client_settings.py),
    then the caller's own, and the bootstrap servers."""
    return {
        "log.connection.close": False,
        "logger": LIBRDKAFKA_LOGGER,
        **user_kafka_settings(),
        **(settings or {}),
        "bootstrap.servers": bootstrap,
    }


TAIL_FETCH_WAIT_MS = 50  # see consumer_config

# How Ordo's own request producers (ordo.Client, `ordo submit`, the Spark requests sink,
# the benchmarks' prefill) batch: what arrives within 20 ms goes in one produce request, up
# to 10,000 messages or 1 MB. A broker keeps each producer batch as one record batch, and
# the local broker stalls once a partition holds several thousand of them
# (docs/local-broker.md): fewer, fuller batches keep it serving.
REQUEST_BATCHING = {"linger.ms": 20, "batch.num.messages": 10_000, "batch.size": 1_000_000}


def close_later(consumer) -> None:
    """Close a consumer being replaced in a thread of its own: one whose fetching stalled
    may take its time to close, and its replacement reads on meanwhile."""
    threading.Thread(target=consumer.close, name="ordo-consumer-close", daemon=True).start()


def arrived(consumer, timeout: float, most: int = 10_000) -> list:
    """The messages that arrive within `timeout` seconds: the first one, with whatever came
    with it, at once. `consume(most, timeout)` alone sits out all of `timeout` unless `most`
    messages came, which would add up to `timeout` to every hop that reads this way."""
    first = consumer.poll(timeout)
    return [] if first is None else [first, *consumer.consume(most - 1, 0)]


def consumer_config(bootstrap: str, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Consumer settings for a pipeline that waits on every hop. A fetch at the tail waits
    up to 50 ms for data: a broker answers it as soon as a record arrives, so the wait costs
    no latency, while each consumer idling at the tail asks only 20 times a second (at
    5 ms, two idle log followers cost the local broker 15 % of a core, measured). An empty
    or failed fetch is retried after 5 ms, not librdkafka's 500 ms default (which would put
    half-second outliers into latencies)."""
    return kafka_config(
        bootstrap,
        {
            "fetch.wait.max.ms": TAIL_FETCH_WAIT_MS,
            "fetch.error.backoff.ms": 5,
            "enable.partition.eof": False,
            **(settings or {}),
        },
    )


# What a partition answers while its leader moves or its broker loads it after a restart:
# asked again. A new leader answers OFFSET_NOT_AVAILABLE until its high watermark has caught
# up (taken as a failure, it once made every unacknowledged output go again, as copies).
LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    }
)

# ... and while a topic is being created: a node of a cluster that has not learned of a new
# topic yet has the client call the partition unknown.
_MOVING = LEADER_MOVING | {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC}


def watermarks(consumer, partition, timeout: float) -> tuple[int, int]:
    """A partition's (low, end) offsets, asked again while its leader is moving or starting
    (a broker restarted a moment ago, or a topic made a moment ago, answers "not leader"
    until it has loaded the partition)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(
                partition, timeout=max(0.5, deadline - time.monotonic()), cached=False
            )
        except KafkaException as exc:
            code = exc.args[0].code() if exc.args and hasattr(exc.args[0], "code") else None
            if code not in _MOVING or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# Live reads' questions and answers (scheduler/reads.py): sent at once at light load, where a
# linger would be most of a read's time; gathered for a millisecond under load, where one
# produce request per record is what the broker spends most on (measured: 4,600 against
# 11,000 reads/s beside writes, the broker at 75 against 37 % of a core).
GATHER_MS = 1
GATHER_FROM = 8  # records at once from which they are gathered
POLL_EVERY_S = 0.01


class PacedProducer:
    """Two producers of one client: one that sends at once, one that gathers."""

    def __init__(self, config: dict[str, Any]):
        from confluent_kafka import Producer

        self._prompt = Producer({**config, "linger.ms": 0})
        self._gathering = Producer({**config, "linger.ms": GATHER_MS})
        self._polled = 0.0

    def produce(self, topic: str, value: bytes, key: bytes, busy: bool) -> None:
        (self._gathering if busy else self._prompt).produce(topic, value, key)

    def poll(self) -> None:
        """Serve the producers' events, at most every POLL_EVERY_S: each poll hands the
        interpreter lock over, which under load costs more than the poll itself."""
        now = time.monotonic()
        if now - self._polled < POLL_EVERY_S:
            return
        self._polled = now
        self._prompt.poll(0)
        self._gathering.poll(0)

    def flush(self, timeout: float) -> None:
        self._prompt.flush(timeout)
        self._gathering.flush(timeout)
