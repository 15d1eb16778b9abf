"""Topic names of a namespace and their creation."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from ordo.broker.clients import kafka_config


_NAMESPACE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def valid_topic(name: str) -> bool:
    """Whether Kafka takes `name` as a topic's name."""
    return bool(_TOPIC.fullmatch(name)) and name not in (".", "..")


@dataclass(frozen=True, slots=True)
class Topics:
    namespace: str

    def __post_init__(self) -> None:
        # Kafka topic names (and so the namespace that prefixes them) allow only these.
        if not _NAMESPACE.fullmatch(self.namespace):
            raise ValueError(f"invalid namespace {self.namespace!r}: use 1-200 of A-Z a-z 0-9 . _ -")

    @staticmethod
    def namespace_of_log(topic: str) -> str:
        """The namespace whose log `topic` is."""
        return topic.removesuffix(".log")

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

    @property
    def reads(self) -> str:
        return f"{self.namespace}.reads"

    @property
    def read_answers(self) -> str:
        return f"{self.namespace}.read-answers"


# The log is the source of truth: it keeps every record for ever, and is never compacted.
# How long a topic must stay unknown to a cluster before it counts as missing (described()).
SETTLE = 10.0
LOG_SETTINGS = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
# Reads and their answers matter for as long as a client waits for them (scheduler/reads.py).
READ_SETTINGS = {"retention.ms": str(3_600_000), "cleanup.policy": "delete"}


# Kafka's default `message.max.bytes`: the largest record a topic takes unless told otherwise.
KAFKA_DEFAULT_RECORD_BYTES = 1_048_588


def log_settings(replication: int) -> dict[str, str]:
    settings = dict(LOG_SETTINGS)
    if replication >= 3:  # an append is acknowledged once two replicas hold it
        settings["min.insync.replicas"] = "2"
    return settings


def ensure_topics(
    bootstrap: str,
    namespace: str,
    request_partitions: int = 1,
    timeout: float = 30.0,
    replication: int = 1,
    record_bytes: int | None = None,
) -> Topics:
    """Create the namespace's topics that do not exist yet; existing ones are kept as they are,
    but an existing log must have the settings a source of truth needs (see check_log).
    The log has exactly one partition: it is the total order."""
    topics = Topics(namespace)
    admin = AdminClient(kafka_config(bootstrap))
    existing = admin.list_topics(timeout=timeout).topics
    wanted = {
        topics.requests: request_partitions,
        topics.log: 1,
        topics.results: 1,
        topics.changes: 1,
        topics.reads: 1,
        topics.read_answers: 1,
    }
    log_config = log_settings(replication)
    if record_bytes is not None and record_bytes > KAFKA_DEFAULT_RECORD_BYTES:
        log_config["max.message.bytes"] = str(record_bytes)  # a new log takes the batches asked for
    configs = {topics.log: log_config, topics.reads: READ_SETTINGS, topics.read_answers: READ_SETTINGS}
    new = [
        NewTopic(name, partitions, replication, config=configs.get(name, {}))
        for name, partitions in wanted.items()
        if name not in existing
    ]
    if new:
        for name, future in admin.create_topics(new, operation_timeout=timeout).items():
            try:
                future.result(timeout)
            except Exception as exc:  # created meanwhile by another process is fine
                if "already exists" not in str(exc).lower() and "TOPIC_ALREADY_EXISTS" not in str(exc):
                    if "INVALID_REPLICATION_FACTOR" in str(exc):
                        brokers = len(admin.list_topics(timeout=timeout).brokers)
                        raise RuntimeError(
                            f"cannot create {name} with {replication} replicas: the cluster has "
                            f"{brokers} broker(s); use --log-replication {brokers} or add "
                            f"brokers"
                        ) from None
                    raise
    wait_for_leaders(admin, [topic.topic for topic in new], timeout)
    check_log(admin, topics, timeout, record_bytes)
    return topics


def ensure_read_topics(bootstrap: str, topics: Topics, timeout: float = 30.0) -> None:
    """The namespace's read topics, for a namespace made before reads (scheduler/reads.py)."""
    admin = AdminClient(kafka_config(bootstrap))
    existing = admin.list_topics(timeout=timeout).topics
    log = existing.get(topics.log)
    replication = len(log.partitions[0].replicas) if log is not None and 0 in log.partitions else 1
    new = [
        NewTopic(name, 1, replication, config=READ_SETTINGS)
        for name in (topics.reads, topics.read_answers)
        if name not in existing
    ]
    if not new:
        return
    for future in admin.create_topics(new, operation_timeout=timeout).values():
        try:
            future.result(timeout)
        except Exception as exc:
            if "already exists" not in str(exc).lower() and "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    wait_for_leaders(admin, [topic.topic for topic in new], timeout)


def wait_for_leaders(admin: AdminClient, names: list[str], timeout: float = 30.0) -> None:
    """Until every partition of `names` has a leader: a topic's creation is acknowledged
    before its partitions are led, and a client that asks a partition for its offsets or
    records in between is told "not leader"."""
    found = described(admin, names, settle=timeout, led=True)
    unled = [name for name, metadata in found.items() if metadata is None]
    if unled:
        raise RuntimeError(
            f"topics {', '.join(unled)} have no leader {timeout:.0f} s after their creation: "
            f"is every broker of the cluster up?"
        )


def described(admin: AdminClient, names: list[str], settle: float, led: bool = False) -> dict:
    """Each topic of `names` as the cluster describes it (with its partitions, each led if
    `led`), or None for one it does not describe so within `settle` seconds. The nodes of a
    cluster learn of a new topic, its partitions and their leaders one by one, so an answer
    that a topic is unknown, or has no partitions, counts only once it has held that long."""
    deadline = time.monotonic() + settle
    while True:
        listed = admin.list_topics(timeout=max(settle, 1.0)).topics
        found = {name: listed.get(name) for name in names}
        for name, metadata in found.items():
            if (
                metadata is None
                or metadata.error is not None
                or not metadata.partitions
                or led
                and any(p.leader < 0 or p.error is not None for p in metadata.partitions.values())
            ):
                found[name] = None
        if all(found.values()) or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def check_topics(bootstrap: str, topics: Topics, timeout: float = 30.0, record_bytes: int | None = None) -> None:
    """The namespace's topics exist and the log has one partition; else a clear error
    (a producer would otherwise have the broker make them with its defaults)."""
    admin = AdminClient(kafka_config(bootstrap))
    found = described(admin, [topics.requests, topics.log, topics.results, topics.changes], settle=SETTLE)
    missing = [name for name, metadata in found.items() if metadata is None]
    if missing:
        raise RuntimeError(
            f"topics {', '.join(missing)} do not exist: create the namespace's topics first (`ordo run` creates them)"
        )
    check_log(admin, topics, timeout, record_bytes)


def check_log(admin: AdminClient, topics: Topics, timeout: float = 30.0, record_bytes: int | None = None) -> None:
    """The log has one partition and keeps every record: with a finite retention its head
    would go, and with it the only way to rebuild state or restart the sequencer. With
    `record_bytes`, it takes records that large: else the first full batch would fail."""
    log = described(admin, [topics.log], settle=timeout)[topics.log]
    log_partitions = len(log.partitions) if log is not None else 0
    if log_partitions != 1:
        raise RuntimeError(f"topic {topics.log} has {log_partitions} partitions; the log needs exactly 1")
    try:
        (future,) = admin.describe_configs([ConfigResource("topic", topics.log)]).values()
        configs = future.result(timeout)
    except Exception:  # a broker that does not describe configs: nothing to check against
        return
    wrong = [
        f"{name}={configs[name].value}"
        for name, value in LOG_SETTINGS.items()
        if name in configs and configs[name].value != value
    ]
    limit = configs.get("max.message.bytes")
    if record_bytes is not None and limit is not None and limit.value and int(limit.value) < record_bytes:
        raise RuntimeError(
            f"topic {topics.log} takes records of at most {int(limit.value):,} bytes (max.message.bytes), less "
            f"than a batch of --max-bytes can take ({record_bytes:,} with Kafka's framing): lower --max-bytes, "
            f"or run `kafka-configs --bootstrap-server … --alter --entity-type topics --entity-name {topics.log} "
            f"--add-config max.message.bytes={record_bytes}` (the brokers' replica.fetch.max.bytes must allow it too)"
        )
    if wrong:
        fix = ",".join(f"{name}={value}" for name, value in LOG_SETTINGS.items())
        raise RuntimeError(
            f"topic {topics.log} has {', '.join(wrong)}: the log is the source of truth and must keep every "
            f"record; run `kafka-configs --bootstrap-server … --alter --entity-type topics --entity-name "
            f"{topics.log} --add-config {fix}` (see docs/operations.md, 'Log retention')"
        )


def request_partitions_for(bootstrap: str, topics: Topics, sequencers: int) -> int:
    """The request topic's partition count, which S sequencers need to be at least S (each
    takes the partitions p with p % S == its index); else a clear error."""
    partitions = partition_count(bootstrap, topics.requests)
    if partitions < sequencers:
        raise ValueError(
            f"{sequencers} sequencers need at least {sequencers} partitions of {topics.requests}, "
            f"which has {partitions}: use fewer sequencers, or a new namespace with "
            f"--request-partitions {sequencers}"
        )
    return partitions


def partition_count(bootstrap: str, topic: str, settle: float = SETTLE) -> int:
    metadata = described(AdminClient(kafka_config(bootstrap)), [topic], settle=settle)[topic]
    if metadata is None:
        raise RuntimeError(f"topic {topic} does not exist")
    return len(metadata.partitions)
