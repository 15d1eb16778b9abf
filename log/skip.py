"""`ordo log skip --offset N`: get a namespace past a record that stops every reader of its
log (a gap in a lane's epochs, a batch of another log), by appending a signed skip record
that names it (log/records.py). Readers that reach record N look ahead for such a record
and pass over N; a replay does the same, so every reader and every replay agrees.

The command skips only a record that does stop the readers: it follows the log from its
beginning to N as a reader does and appends the skip only if record N stops it. No reader
can have got past such a record, so the skip changes nothing a reader already did."""

from __future__ import annotations

import time

from confluent_kafka import Producer, TopicPartition

from ordo.broker.clients import kafka_config
from ordo.log.records import LogCursor, LogError, encode_skip
from ordo.log.reader import LogReader, is_skip_for, log_consumer
from ordo.broker.topics import Topics


def skip_record(bootstrap: str, namespace: str, offset: int, timeout: float = 60.0) -> tuple[str, int]:
    """Append a skip of the record at `offset`; (why that record stops the readers, the
    skip record's own offset)."""
    topic = Topics(namespace).log
    if offset < 0:
        raise ValueError("--offset must be an offset of the log, 0 or more")
    end = _log_end(bootstrap, topic)
    if offset >= end:
        raise ValueError(f"{topic} ends before offset {offset} (its next offset is {end})")
    cursor, why = _follow_to(bootstrap, topic, offset, timeout)
    producer = Producer(kafka_config(bootstrap, {"enable.idempotence": True}))
    written: list = []
    producer.produce(
        topic,
        encode_skip(namespace, offset, cursor.log_id),
        partition=0,
        on_delivery=lambda error, message: written.append((error, message)),
    )
    producer.flush(timeout)
    if not written or written[0][0] is not None:
        raise RuntimeError(
            f"could not append the skip record to {topic}: {written[0][0] if written else 'the broker did not answer'}"
        )
    return why, written[0][1].offset()


def _log_end(bootstrap: str, topic: str) -> int:
    consumer = log_consumer(bootstrap, f"{topic}.skip-tool")
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
    finally:
        consumer.close()


def _follow_to(bootstrap: str, topic: str, offset: int, timeout: float) -> tuple[LogCursor, str]:
    """Follow the log as a reader does up to the record at `offset`; the cursor before it
    and why it stops a reader. Raises if it does not, or if an earlier record stops first."""
    cursor = LogCursor()
    reader = LogReader(bootstrap, topic, cursor, f"{topic}.skip-tool", on_dropped=lambda *_: None)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, value in reader.poll_raw(0.5, 1000):
                if at < offset:
                    try:
                        reader.accept(at, value)
                    except LogError as exc:
                        raise ValueError(
                            f"the record at offset {at}, before {offset}, stops the log's readers first ({exc})"
                        ) from None
                    continue
                if at > offset:
                    raise ValueError(
                        f"{topic} has no record at offset {offset} that readers see (a transaction "
                        f"marker, or a record of an aborted transaction): nothing to skip"
                    )
                if is_skip_for(value, offset, cursor.namespace, cursor.log_id):
                    raise ValueError(f"the record at offset {offset} is itself a skip record")
                try:
                    cursor.accept(value, at)
                except LogError as exc:
                    return cursor, str(exc)
                raise ValueError(
                    f"the record at offset {offset} does not stop the log's readers (they accept it "
                    f"or pass over it already): nothing to skip"
                )
        raise TimeoutError(f"reading {topic} up to offset {offset} made no progress for {timeout:.0f} s")
    finally:
        reader.close()
