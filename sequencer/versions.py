"""Procedure set versions in the log: which set a log runs now, the check every sequencer
makes before it writes anything, and the upgrade record that moves a log to another set.

A log runs one procedure set at a time. Its first start record names the first; an upgrade
record (`ordo upgrade`, sequencer/log.py) names each later one, from the next batch on. A
sequencer whose set differs from the log's current one refuses to start before it fences
anyone or appends anything, so a wrong app started on a namespace changes nothing, and an
edited procedure never runs the log's old batches: every batch carries the identity of the
set it was sequenced with, and engines run it with that set only (scheduler/follower.py).

The current set is found by reading the log back from its end to the newest record that
names it: a snapshot (a sequencer writes one every SNAPSHOT_EVERY batches of its lane and
after each start), an upgrade or a start record."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from ordo.procedures.fingerprint import (
    ProcedureSetChanged, changes, describe, is_versioned, set_id, short, shown,
)
from ordo.procedures.registry import Registry
from ordo.sequencer.kafka import kafka_config
from ordo.sequencer.log import (
    SNAPSHOT, SNAPSHOT_EVERY, START, UPGRADE, LogError, Snapshot, Start, Upgrade, decode, encode_upgrade,
    is_batch_record,
)
from ordo.sequencer.reader import log_consumer
from ordo.sequencer.topics import Topics

STEP = 2 * SNAPSHOT_EVERY + 16  # records read back per step: more than between two snapshots of a lane


@dataclass(frozen=True, slots=True)
class Current:
    """The procedure set a log runs now."""

    version: int
    identity: int
    offset: int  # of the start or upgrade record that named it
    described: dict | None  # as that record holds it
    sequencers: int  # S of the newest start record or snapshot
    log_id: str | None

    @property
    def name(self) -> str:
        return f"v{self.version} ({short(self.identity)})"

    def matches(self, registry: Registry) -> bool:
        """Whether `registry` is this set: by identity; a set logged before versions were
        kept (arguments only) by that older description."""
        if is_versioned(self.described) or self.described is None:
            return set_id(describe(registry)) == self.identity
        return describe(registry, code=False) == self.described

    def changes(self, registry: Registry) -> list[str]:
        if self.described is None:
            return ["the log's set is not readable here"]
        if is_versioned(self.described):
            return changes(self.described, describe(registry))
        return changes(self.described, describe(registry, code=False))


def current_set(bootstrap: str, topic: str, timeout: float = 30.0) -> Current | None:
    """The set the log runs now, or None for a log that names none yet (empty)."""
    consumer = log_consumer(bootstrap, f"{topic}.versions")
    try:
        low_water, end = _watermarks(consumer, topic, timeout)
        newer_starts: list[tuple[int, Start]] = []  # newest first
        sequencers = None
        high = end
        while high > low_water:
            low = max(low_water, high - STEP)
            for offset, record in reversed(_named_records(consumer, topic, low, high, timeout)):
                if isinstance(record, Start):
                    sequencers = sequencers or record.sequencers
                    if record.procedures is not None:
                        newer_starts.append((offset, record))
                    continue
                if isinstance(record, Snapshot):
                    sequencers = sequencers or record.sequencers
                    named = record.cursor.procedures
                    if named is None:
                        continue  # a log from before versions: its start records name the set
                    return _after(consumer, topic, named, newer_starts, sequencers, record.cursor.log_id, timeout)
                if isinstance(record, Upgrade):
                    named = [record.version, set_id(record.procedures), offset]
                    return _after(consumer, topic, named, newer_starts, sequencers or 1, record.log_id, timeout,
                                  record.procedures)
            high = low
        if not newer_starts:
            return None
        offset, first = newer_starts[-1]
        return _after(consumer, topic, [1, set_id(first.procedures), offset], newer_starts[:-1],
                      sequencers or 1, first.token, timeout, first.procedures)
    finally:
        consumer.close()


# What a partition answers while it is being created or its leadership moves.
_NOT_YET = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)


def _watermarks(consumer, topic: str, timeout: float) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5, cached=False)
        except KafkaException as exc:
            if exc.args[0].code() not in _NOT_YET or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _after(consumer, topic: str, named: list, newer_starts: list[tuple[int, Start]], sequencers: int,
           log_id: str | None, timeout: float, described: dict | None = None) -> Current:
    """The set `named` ([version, identity, offset]) as the start records after it leave it
    (a log from before versions changed its set with a start record)."""
    version, identity, offset = named
    for at, start in reversed(newer_starts):
        other = set_id(start.procedures)
        if other != identity:
            version, identity, offset, described = version + 1, other, at, start.procedures
    if described is None:
        found = _named_records(consumer, topic, offset, offset + 1, timeout)
        record = found[0][1] if found else None
        described = getattr(record, "procedures", None)
    return Current(version, identity, offset, described, sequencers, log_id)


def _named_records(consumer, topic: str, low: int, high: int, timeout: float) -> list[tuple[int, object]]:
    """Start, snapshot and upgrade records at offsets [low, high), read to the position
    `high` (past transaction markers)."""
    part = TopicPartition(topic, 0, low)
    consumer.assign([part])
    found: list[tuple[int, object]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for message in consumer.consume(500, 0.2):
            if message.error() is not None:
                continue
            offset, value = message.offset(), message.value()
            deadline = time.monotonic() + timeout
            if low <= offset < high and not is_batch_record(value):
                try:
                    kind, record = decode(value)
                except LogError:
                    continue  # no sequencer's record: every reader passes over it
                if kind in (START, SNAPSHOT, UPGRADE):
                    found.append((offset, record))
            if offset >= high - 1:
                return found
        if consumer.position([TopicPartition(topic, 0)])[0].offset >= high:
            return found
    raise TimeoutError(f"reading {topic} back from offset {low} to {high} made no progress for {timeout:.0f} s")


def check_set(bootstrap: str, namespace: str, registry: Registry, upgrade_hint: str,
              timeout: float = 30.0) -> Current | None:
    """Refuse, in one line and before anything is written, a procedure set other than the
    one the namespace's log runs; the log's current set (None: the log names none yet)."""
    topics = Topics(namespace)
    current = current_set(bootstrap, topics.log, timeout)
    if current is None or current.matches(registry):
        return current
    raise ProcedureSetChanged(
        f"{topics.log} runs procedure set {current.name}, and these procedures differ from it "
        f"({shown(current.changes(registry))}); nothing was written to the log. To move the log to them: "
        f"{upgrade_hint} (docs/operations.md, 'Upgrading procedures'); to go on as before, start the code "
        f"of {current.name}")


@dataclass(frozen=True, slots=True)
class Upgraded:
    before: Current
    version: int
    identity: int
    offset: int  # the upgrade record's


def upgrade(bootstrap: str, namespace: str, registry: Registry, timeout: float = 60.0) -> Upgraded | None:
    """Move the namespace's log to `registry`'s procedure set: fence every sequencer of the
    set before (each lane's transactional id), then append the upgrade record. None if the
    log already runs this set. A log that names no set yet needs no upgrade (its first
    sequencer names it)."""
    from ordo.sequencer.sequencer import transactional_id

    topics = Topics(namespace)
    current = current_set(bootstrap, topics.log, timeout)
    if current is None:
        raise ValueError(f"{topics.log} names no procedure set yet: start `ordo run` with these procedures, "
                         f"it needs no upgrade")
    if current.matches(registry) and is_versioned(current.described):
        return None
    described = describe(registry)
    producers = [Producer(kafka_config(bootstrap, {"transactional.id": transactional_id(namespace, k),
                                                   "transaction.timeout.ms": 10_000}))
                 for k in range(max(current.sequencers, 1))]
    try:
        for producer in producers:  # each fences the running sequencer of its lane, ending its transaction
            producer.init_transactions(timeout)
        writer = producers[0]
        written: list = []
        writer.begin_transaction()
        writer.produce(topics.log, encode_upgrade(described, current.version + 1, current.log_id), partition=0,
                       on_delivery=lambda error, message: written.append((error, message)))
        writer.commit_transaction(timeout)
        if not written or written[0][0] is not None:
            raise RuntimeError(f"could not append the upgrade record to {topics.log}: "
                               f"{written[0][0] if written else 'the broker did not answer'}")
    finally:
        for producer in producers:
            producer.flush(5)
    return Upgraded(current, current.version + 1, set_id(described), written[0][1].offset())


def upgrade_command(bootstrap: str, namespace: str, specs: tuple[str, ...]) -> str:
    """The `ordo upgrade` command line that moves `namespace` to the procedures of `specs`."""
    named = " ".join(f"--app {spec}" if ":" in spec else f"--procedures {spec}" for spec in specs)
    return f"`ordo upgrade --bootstrap-servers {bootstrap} --namespace {namespace} {named}`".replace("  ", " ")
