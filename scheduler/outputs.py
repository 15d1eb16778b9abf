"""The engine's outputs, as they appear on Kafka.

<ns>.results, key = request id, one record per request:
    {"id": "r-42", "status": "committed", "batch": 17, "result": null, "error": null}
<ns>.changes, key = "<batch>:<partition>", one record per batch and partition:
    {"batch": 17, "partition": 0, "changes": [
        {"txn": 3, "table": "account", "key": 9, "value": 120},      # put
        {"txn": 5, "table": "account", "key": 4, "value": null, "deleted": true}]}

Both are pure functions of the log, so a replay re-emits them byte for byte: a consumer
that keeps the last record per key sees duplicates only, never different data.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from confluent_kafka import Producer

from scheduler.batch import Outcome
from sequencer.kafka import kafka_config
from sequencer.topics import Topics
from storage.keys import encode_key

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def outcome_record(outcome: Outcome, batch_id: int) -> bytes:
    return _dumps({
        "id": outcome.id,
        "status": outcome.status,
        "batch": batch_id,
        "result": outcome.result,
        "error": outcome.error,
    }).encode()


def change_key(batch_id: int, partition: int) -> bytes:
    return f"{batch_id}:{partition}".encode()


def change_record(batch_id: int, partition: int, changes: list[list]) -> bytes:
    return _dumps({
        "batch": batch_id,
        "partition": partition,
        "changes": [_change(index, table, key, value) for index, table, key, value in changes],
    }).encode()


def _change(index: int, table: str, key: Any, value: Any) -> dict:
    if value is None:
        return {"txn": index, "table": table, "key": key, "value": None, "deleted": True}
    return {"txn": index, "table": table, "key": key, "value": value}


class OutputSink(Protocol):
    def publish(self, batch_id: int, outcomes: list[Outcome], changes: dict[int, list[list]]) -> None:
        """Outputs of one batch: outcomes in txn order, change data per partition. Must be
        durable when it returns: the batch is applied only afterwards."""

    def close(self) -> None: ...


class KafkaOutputs:
    def __init__(self, bootstrap: str, topics: Topics):
        self.topics = topics
        self._producer = Producer(kafka_config(bootstrap, {
            "enable.idempotence": True,
            "linger.ms": 2,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
        }))

    def publish(self, batch_id: int, outcomes: list[Outcome], changes: dict[int, list[list]]) -> None:
        produce = self._producer.produce
        results_topic = self.topics.results
        for outcome in outcomes:
            produce(results_topic, key=outcome.id.encode(), value=outcome_record(outcome, batch_id))
        for partition, records in changes.items():
            produce(self.topics.changes, key=change_key(batch_id, partition),
                    value=change_record(batch_id, partition, records))
        remaining = self._producer.flush(60)
        if remaining:
            raise RuntimeError(f"{remaining} outputs of batch {batch_id} not acknowledged by the broker")

    def close(self) -> None:
        self._producer.flush(10)


class CollectedOutputs:
    """Outputs kept in memory: for comparing engine configurations on one log."""

    def __init__(self) -> None:
        self.outcomes: list[dict[str, Any]] = []
        self.changes: list[tuple] = []  # (batch, txn index, table, key, value or None)

    def publish(self, batch_id: int, outcomes: list[Outcome], changes: dict[int, list[list]]) -> None:
        self.outcomes.extend({"id": o.id, "status": o.status, "batch": batch_id, "result": o.result,
                              "error": o.error} for o in outcomes)
        merged = [(batch_id, *change) for records in changes.values() for change in records]
        merged.sort(key=lambda c: (c[1], encode_key(c[2], c[3])))  # txn order, then key order
        self.changes.extend(merged)

    def close(self) -> None:
        pass
