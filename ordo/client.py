"""The client API: submit requests to a namespace and collect their outcomes."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Iterable

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)

from sequencer.kafka import consumer_config, kafka_config
from sequencer.topics import Topics


def new_request(proc: str, args: dict[str, Any], request_id: str | None = None) -> dict[str, Any]:
    return {"id": request_id or f"req-{uuid.uuid4().hex}", "proc": proc, "args": args}


class Client:
    def __init__(self, bootstrap: str, namespace: str):
        self.bootstrap = bootstrap
        self.topics = Topics(namespace)
        self._producer: Producer | None = None

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(kafka_config(self.bootstrap, {
                "enable.idempotence": True,
                "linger.ms": 5,
                "queue.buffering.max.messages": 1_000_000,
            }))
        return self._producer

    def submit(self, requests: Iterable[dict[str, Any] | bytes | tuple[str, bytes]], on_sent=None) -> list[str]:
        """Produce requests and return their ids. A request is a dict, a raw message body
        sent as it is (keyed by its 'id' when it has one), or a (key, raw body) pair."""
        producer = self._ensure_producer()
        ids = []
        for request in requests:
            if isinstance(request, dict):
                key, value = str(request.get("id", "")), json.dumps(request, separators=(",", ":"))
            elif isinstance(request, tuple):
                key, value = request
            else:
                key, value = _raw_id(request), request
            while True:
                try:
                    producer.produce(self.topics.requests, key=key.encode() if key else None, value=value)
                    break
                except BufferError:
                    producer.poll(0.05)
            if on_sent is not None:
                on_sent(key)
            ids.append(key)
            producer.poll(0)
        remaining = producer.flush(60)
        if remaining:
            raise RuntimeError(f"{remaining} requests were not acknowledged by the broker")
        return ids

    def outcomes(self, ids: Iterable[str], timeout: float = 60.0, on_outcome=None) -> dict[str, dict]:
        """Wait for one outcome per id, reading <ns>.results from its beginning; returns
        what arrived before the timeout (missing ids are simply absent)."""
        wanted = set(ids)
        found: dict[str, dict] = {}
        consumer = Consumer(consumer_config(self.bootstrap, {
            "group.id": f"ordo-client-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }))
        consumer.assign([TopicPartition(self.topics.results, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        try:
            while len(found) < len(wanted) and time.monotonic() < deadline:
                for message in consumer.consume(10_000, 0.1):
                    if message.error() is not None:
                        if message.error().code() != KafkaError._PARTITION_EOF:
                            raise RuntimeError(f"results read failed: {message.error()}")
                        continue
                    outcome = json.loads(message.value())
                    if outcome["id"] in wanted and outcome["id"] not in found:
                        found[outcome["id"]] = outcome
                        if on_outcome is not None:
                            on_outcome(outcome)
        finally:
            consumer.close()
        return found

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None


def _raw_id(body: bytes) -> str:
    try:
        request_id = json.loads(body).get("id")
        return request_id if isinstance(request_id, str) else ""
    except Exception:
        return ""
