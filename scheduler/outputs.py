"""The engine's outputs, as they appear on Kafka.

<ns>.results, key = request id, one record per request:
    {"id": "r-42", "status": "committed", "batch": 17, "result": null, "error": null}
<ns>.changes, key = "<batch>:<partition>:<part>", the change data of a batch on a
partition in transaction order, split into parts that each fit in one Kafka message:
    {"batch": 17, "partition": 0, "part": 0, "parts": 1, "changes": [
        {"txn": 3, "table": "account", "key": 9, "value": 120},      # put
        {"txn": 5, "table": "account", "key": 4, "value": null, "deleted": true}]}
Every batch and partition has at least one part (possibly with no changes), so a consumer
can tell that it has seen all of a batch.

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

# Below the 1 MiB a Kafka broker accepts by default, with room for the record's framing.
MAX_MESSAGE_BYTES = 900_000


def outcome_record(outcome: Outcome, batch_id: int) -> bytes:
    if outcome.result is None and outcome.error is None:  # the common case, formatted directly
        return (f'{{"id":{_dumps(outcome.id)},"status":"{outcome.status}","batch":{batch_id},'
                f'"result":null,"error":null}}').encode()
    return _dumps({
        "id": outcome.id,
        "status": outcome.status,
        "batch": batch_id,
        "result": outcome.result,
        "error": outcome.error,
    }).encode()


def change_key(batch_id: int, partition: int, part: int) -> bytes:
    return f"{batch_id}:{partition}:{part}".encode()


def change_records(batch_id: int, partition: int, changes: list[list],
                   max_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[bytes, bytes]]:
    """(key, value) messages carrying `changes`, each at most about `max_bytes`."""
    encoded = [_change_json(index, table, key, value) for index, table, key, value in changes]
    groups: list[list[str]] = [[]]
    size = 0
    for item in encoded:
        if groups[-1] and size + len(item) + 1 > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += len(item) + 1
    parts = len(groups)
    return [
        (change_key(batch_id, partition, part),
         f'{{"batch":{batch_id},"partition":{partition},"part":{part},"parts":{parts},'
         f'"changes":[{",".join(group)}]}}'.encode())
        for part, group in enumerate(groups)
    ]


def _change_json(index: int, table: str, key: Any, value: Any) -> str:
    if type(key) is int and type(value) is int:  # the common case, formatted directly
        return f'{{"txn":{index},"table":{_dumps(table)},"key":{key},"value":{value}}}'
    return _dumps(_change(index, table, key, value))


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
            for key, value in change_records(batch_id, partition, records):
                produce(self.topics.changes, key=key, value=value)
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
