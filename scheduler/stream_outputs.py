"""Output streams on Kafka: every tuple a dataflow emitted to a stream that no procedure
consumes (procedures/streams.py), published on <ns>.stream.<name> in log order.

They come from the change data of the stream's table, so a replay publishes the same
tuples under the same keys, "<batch>:<txn>:<seq>": a consumer keeping the last record per
key sees duplicates only.
"""

from __future__ import annotations

import json
from typing import Iterable

from ordo.procedures.streams import OUTPUT_TABLE_PREFIX

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def stream_topic(namespace: str, stream: str) -> str:
    return f"{namespace}.stream.{stream}"


def stream_records(namespace: str, batch_id: int, changes: Iterable[list]) -> list[tuple[str, bytes, bytes]]:
    """(topic, key, value) for every output tuple in `changes`, the writes to output
    streams' rows a partition applied in a batch, in txn order."""
    records = []
    for index, table, _key, value in changes:
        if table.startswith(OUTPUT_TABLE_PREFIX) and type(value) is list:
            topic = stream_topic(namespace, table[len(OUTPUT_TABLE_PREFIX) :])
            records += [
                (topic, f"{batch_id}:{index}:{seq}".encode(), _dumps(item).encode()) for seq, item in enumerate(value)
            ]
    return records


class StreamTopics:
    """Creates an output stream's topic the first time a tuple goes to it (one partition,
    so its tuples stay in log order; an existing topic is kept as it is)."""

    def __init__(self, bootstrap: str, extra: dict | None = None):
        self._bootstrap = bootstrap
        self._extra = extra
        self._known: set[str] = set()

    def ensure(self, records: list[tuple[str, bytes, bytes]], timeout: float = 30.0) -> None:
        wanted = {topic for topic, _, _ in records} - self._known
        if not wanted:
            return
        from confluent_kafka.admin import AdminClient, NewTopic

        from ordo.broker.clients import kafka_config

        admin = AdminClient(kafka_config(self._bootstrap, self._extra))
        existing = admin.list_topics(timeout=timeout).topics
        new = [NewTopic(topic, 1, 1) for topic in sorted(wanted) if topic not in existing]
        for topic, future in admin.create_topics(new, operation_timeout=timeout).items() if new else ():
            try:
                future.result(timeout)
            except Exception as exc:  # created meanwhile by another worker is fine
                if "already exists" not in str(exc).lower() and "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        self._known |= wanted
