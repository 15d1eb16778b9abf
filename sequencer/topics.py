"""Topic names of a namespace and their creation."""

from __future__ import annotations

import re
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, NewTopic

from sequencer.kafka import kafka_config


_NAMESPACE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")


@dataclass(frozen=True, slots=True)
class Topics:
    namespace: str

    def __post_init__(self) -> None:
        # Kafka topic names (and so the namespace that prefixes them) allow only these.
        if not _NAMESPACE.fullmatch(self.namespace):
            raise ValueError(f"invalid namespace {self.namespace!r}: use 1-200 of A-Z a-z 0-9 . _ -")

    @property
    def requests(self) -> str:
        return f"{self.namespace}.requests"

    @property
    def log(self) -> str:
        return f"{self.namespace}.log"

    @property
    def results(self) -> str:
        return f"{self.namespace}.results"

    @property
    def changes(self) -> str:
        return f"{self.namespace}.changes"


def ensure_topics(bootstrap: str, namespace: str, request_partitions: int = 1,
                  timeout: float = 30.0) -> Topics:
    """Create the namespace's topics that do not exist yet; existing ones are kept as they are.
    The log has exactly one partition: it is the total order."""
    topics = Topics(namespace)
    admin = AdminClient(kafka_config(bootstrap))
    existing = admin.list_topics(timeout=timeout).topics
    wanted = {
        topics.requests: request_partitions,
        topics.log: 1,
        topics.results: 1,
        topics.changes: 1,
    }
    new = [NewTopic(name, partitions, 1) for name, partitions in wanted.items() if name not in existing]
    if new:
        for name, future in admin.create_topics(new, operation_timeout=timeout).items():
            try:
                future.result(timeout)
            except Exception as exc:  # created meanwhile by another process is fine
                if "already exists" not in str(exc).lower() and "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
    existing = admin.list_topics(timeout=timeout).topics
    log_partitions = len(existing[topics.log].partitions)
    if log_partitions != 1:
        raise RuntimeError(f"topic {topics.log} has {log_partitions} partitions; the log needs exactly 1")
    return topics


def check_topics(bootstrap: str, topics: Topics, timeout: float = 30.0) -> None:
    """The namespace's topics exist and the log has one partition; else a clear error
    (a producer would otherwise have the broker make them with its defaults)."""
    admin = AdminClient(kafka_config(bootstrap))
    existing = admin.list_topics(timeout=timeout).topics
    missing = [name for name in (topics.requests, topics.log, topics.results, topics.changes)
               if name not in existing or existing[name].error is not None]
    if missing:
        raise RuntimeError(f"topics {', '.join(missing)} do not exist: create the namespace's topics first "
                           f"(`ordo run` creates them)")
    log_partitions = len(existing[topics.log].partitions)
    if log_partitions != 1:
        raise RuntimeError(f"topic {topics.log} has {log_partitions} partitions; the log needs exactly 1")


def partition_count(bootstrap: str, topic: str, timeout: float = 30.0) -> int:
    admin = AdminClient(kafka_config(bootstrap))
    metadata = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise RuntimeError(f"topic {topic} does not exist")
    return len(metadata.partitions)
