"""Following the log: a consumer on the log's single partition that feeds every record
through a LogCursor, so all readers accept exactly the same batches."""

from __future__ import annotations

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from sequencer.kafka import consumer_config
from sequencer.log import Batch, LogCursor


def log_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(consumer_config(bootstrap, {
        "group.id": group,
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        # A position the log no longer holds is an error, never a silent jump elsewhere.
        "auto.offset.reset": "error",
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
    }))


class LogReader:
    def __init__(self, bootstrap: str, topic: str, cursor: LogCursor, group: str):
        self.cursor = cursor
        self.topic = topic
        self._consumer = log_consumer(bootstrap, group)
        start = cursor.next_offset if cursor.next_offset > 0 else OFFSET_BEGINNING
        self._consumer.assign([TopicPartition(topic, 0, start)])

    def poll(self, timeout: float, max_records: int = 500) -> list[tuple[Batch, dict]]:
        """Accepted batches among the next records (possibly none), each with the cursor
        as it stood right after it: what a shard records as applied with that batch."""
        accepted = []
        for offset, value in self.poll_raw(timeout, max_records):
            batch = self.cursor.accept(value, offset)
            if batch is not None:
                accepted.append((batch, self.cursor.to_dict()))
        return accepted

    def poll_raw(self, timeout: float, max_records: int = 500) -> list[tuple[int, bytes]]:
        """The next records as (offset, value), without acceptance."""
        # Wait for the first record only, then take what is already here: consume(n, t)
        # alone would sit out all of t unless n records came.
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        out = []
        for message in [first, *self._consumer.consume(max_records - 1, 0)]:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"log read failed: {error}")
            out.append((message.offset(), message.value()))
        return out

    def lag(self) -> int | str:
        try:
            _, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=0.5, cached=False)
        except Exception:
            return "?"
        return max(0, high - self.cursor.next_offset)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
