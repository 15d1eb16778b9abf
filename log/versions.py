"""Procedure set versions in the log: which set a log runs now, the check every sequencer
makes before it writes anything, and the upgrade record that moves a log to another set.

A log runs one procedure set at a time. Its first start record names the first; an upgrade
record (`ordo upgrade`, log/records.py) names each later one, from the next batch on; an
upgrade with the same code moves a set described in an earlier form to the newest. A
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

from confluent_kafka import Producer, TopicPartition

from ordo.procedures.fingerprint import (
    FORMAT,
    ProcedureSetChanged,
    changes,
    code_groups,
    describe,
    describe_as,
    identities,
    is_versioned,
    set_id,
    short,
    shown,
)
from ordo.procedures.kept import changed_files, pack
from ordo.procedures.registry import Registry
from ordo.broker.clients import kafka_config, watermarks
from ordo.log.records import (
    SNAPSHOT,
    START,
    UPGRADE,
    LogCursor,
    LogError,
    Start,
    Upgrade,
    decode,
    decode_before_places,
    encode_upgrade,
)
from ordo.log.reader import log_consumer, log_identity
from ordo.log.snapshots import OVERLAP, STEP, in_place, records_between
from ordo.broker.topics import Topics


# A sequencer that read the upgrade record of `ordo upgrade` exits with this: its engine goes
# on to the batch where the log moves on, and stops there itself (a restart would only be
# refused).
EXIT_UPGRADED = 4


class UpgradedAway(RuntimeError):
    """The log moved to another procedure set while this sequencer ran; `version`: the
    newest version of the log's set it found and could not go on with."""

    def __init__(self, message: str, version: int | None = None):
        super().__init__(message)
        self.version = version


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
        if self.described is None:
            return self.identity in identities(registry)
        if is_versioned(self.described):
            return set_id(describe_as(registry, self.described)) == self.identity
        return describe(registry, code=False) == self.described

    def changes(self, registry: Registry) -> list[str]:
        if self.described is None:
            return ["the log's set is not readable here"]
        together = code_groups(registry) if is_versioned(self.described) else ()
        return changes(self.described, describe_as(registry, self.described), together)


def current_set(bootstrap: str, topic: str, timeout: float = 30.0, until: int | None = None) -> Current | None:
    """The set the log runs now, or None for a log that names none yet (empty). Read back
    from the end to the newest snapshot in its place (log/snapshots.py: a byte copy of
    an old one is not), then forward through the upgrade and start records after it by
    the readers' own rule (`LogCursor`: versions follow one another, and in a versioned log
    only an upgrade changes the set). With `until`, the set as of the records before that
    offset."""
    log_id = log_identity(bootstrap, topic, timeout)
    if log_id is None:
        return None
    namespace = Topics.namespace_of_log(topic)
    consumer = log_consumer(bootstrap, f"{topic}.startup")  # the group the ACL recipe grants a sequencer
    try:
        low_water, end = _stable_end(consumer, TopicPartition(topic, 0), until, timeout)
        named: list[tuple[int, Start | Upgrade]] = []  # after the anchor, newest first
        anchor, sequencers = None, None
        high = end
        while high > low_water and anchor is None:
            low = max(low_water, high - STEP)
            records = records_between(consumer, topic, max(low_water, low - OVERLAP), high, timeout)
            for index in range(len(records) - 1, -1, -1):
                offset, value, head = records[index]
                if offset < low:
                    break
                if head is not None:
                    continue
                try:
                    kind, record = _decode(value, namespace, log_id)
                except LogError:
                    continue  # no sequencer's record of this log: every reader passes over it
                if kind in (START, UPGRADE):
                    if kind == START:
                        sequencers = sequencers or record.sequencers
                    if record.procedures is not None:
                        named.append((offset, record))
                elif (
                    kind == SNAPSHOT
                    and record.cursor.procedures is not None
                    and in_place(record, records[:index], namespace, log_id)
                ):
                    anchor, sequencers = record.cursor.procedures, sequencers or record.sequencers
                    break
            high = low
        cursor = LogCursor(namespace=namespace)
        cursor.log_id, cursor.procedures = log_id, anchor
        described = {}
        for offset, record in reversed(named):
            described[offset] = record.procedures
            if isinstance(record, Upgrade):
                cursor._upgrade(record, offset)
            else:
                cursor._name_procedures(record.procedures, offset)
        if cursor.procedures is None:
            return None
        version, identity, offset = cursor.procedures[:3]
        if offset not in described:
            found = records_between(consumer, topic, offset, offset + 1, timeout)
            try:
                described[offset] = _decode(found[0][1], namespace, log_id)[1].procedures if found else None
            except (LogError, AttributeError, TypeError):
                described[offset] = None
        return Current(version, identity, offset, described[offset], sequencers or 1, log_id)
    finally:
        consumer.close()


def _stable_end(consumer, partition: TopicPartition, until: int | None, timeout: float) -> tuple[int, int]:
    """The log's (low, end) as a read_committed reader sees it, with `end` capped at `until`.
    A transaction's commit returns before the broker writes its marker to the log, and until
    then the records before `until` are not all readable: wait for them, so a set read "as
    of `until`" never silently leaves out a record just committed (an upgrade's own)."""
    deadline = time.monotonic() + timeout
    while True:
        low_water, end = watermarks(consumer, partition, timeout)
        if until is None:
            return low_water, end
        if end >= until:
            return low_water, until
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{partition.topic} offers readers its records up to offset {end} only, {timeout:.0f} s after "
                f"a transaction committed a record at offset {until - 1}"
            )
        time.sleep(0.05)


def _decode(value: bytes, namespace: str, log_id: str):
    try:
        return decode(value, namespace, log_id)
    except LogError:
        pass
    try:
        return decode(value, namespace, None)  # the log's first start record, sealed as its first
    except LogError:
        return decode_before_places(value, namespace)  # a log written before tags covered places


def check_set(
    bootstrap: str,
    namespace: str,
    registry: Registry,
    upgrade_hint: str,
    timeout: float = 30.0,
    specs: tuple[str, ...] = (),
) -> Current | None:
    """Refuse, in one line and before anything is written, a procedure set other than the
    one the namespace's log runs; the log's current set (None: the log names none yet).
    The line names the procedures that differ and, where the log keeps the set's code, the
    files of `specs`' project that do."""
    topics = Topics(namespace)
    current = current_set(bootstrap, topics.log, timeout)
    if current is None or current.matches(registry):
        return current
    files = _changed_files(bootstrap, topics.log, current, registry, specs, timeout)
    raise ProcedureSetChanged(
        f"{topics.log} runs procedure set {current.name}, and these procedures differ from it "
        f"({shown(current.changes(registry))}{'; ' + shown(files) if files else ''}); nothing was written to "
        f"the log. To move the log to them: "
        f"{upgrade_hint} (docs/operations.md, 'Upgrading procedures'); to go on as before, start the code "
        f"of {current.name}"
    )


def _changed_files(
    bootstrap: str, topic: str, current: Current, registry: Registry, specs: tuple[str, ...], timeout: float
) -> list[str]:
    """The project's files that differ from the code the record naming the log's set keeps
    (empty where it keeps none, or they cannot be compared)."""
    if not specs:
        return []
    consumer = log_consumer(bootstrap, f"{topic}.startup")
    try:
        found = records_between(consumer, topic, current.offset, current.offset + 1, timeout)
        if not found or found[0][1] is None:
            return []
        _, record = _decode(found[0][1], Topics.namespace_of_log(topic), current.log_id or "")
        code = getattr(record, "code", None)
        return changed_files(code, registry, specs) if code else []
    except Exception:
        return []  # the procedures' names say enough
    finally:
        consumer.close()


@dataclass(frozen=True, slots=True)
class Upgraded:
    before: Current
    version: int
    identity: int
    offset: int  # the upgrade record's


def transactional_id(namespace: str, index: int) -> str:
    """The transactional id sequencer k of a release that appended in Kafka transactions
    used: `ordo upgrade` still fences it, so such a sequencer stops too."""
    return f"{namespace}.sequencer" if index == 0 else f"{namespace}.sequencer.{index}"


def upgrade(
    bootstrap: str, namespace: str, registry: Registry, timeout: float = 60.0, specs: tuple[str, ...] = ()
) -> Upgraded | None:
    """Move the namespace's log to `registry`'s procedure set: fence every sequencer of a
    release that appended in transactions (each lane's transactional id), then append the
    upgrade record in one transaction; the running sequencers stop once they read that
    record (sequencer/takeover.py). None if the log already runs this set. A log that names
    no set yet needs no upgrade (its first sequencer names it)."""
    topics = Topics(namespace)
    current = current_set(bootstrap, topics.log, timeout)
    if current is None:
        raise ValueError(
            f"{topics.log} names no procedure set yet: start `ordo run` with these procedures, it needs no upgrade"
        )
    if current.matches(registry) and is_versioned(current.described) and current.described["format"] == FORMAT:
        return None  # an earlier form is moved to the newest, which records the environment
    described = describe(registry)
    producers = [
        Producer(
            kafka_config(
                bootstrap, {"transactional.id": transactional_id(namespace, k), "transaction.timeout.ms": 10_000}
            )
        )
        for k in range(max(current.sequencers, 1))
    ]
    try:
        # Each fences its lane's sequencer of a release that appended in transactions.
        for producer in producers:
            producer.init_transactions(timeout)
        writer = producers[0]
        written: list = []
        writer.begin_transaction()
        record = encode_upgrade(namespace, described, current.version + 1, current.log_id, pack(registry, specs))
        writer.produce(
            topics.log, record, partition=0, on_delivery=lambda error, message: written.append((error, message))
        )
        writer.commit_transaction(timeout)
        if not written or written[0][0] is not None:
            raise RuntimeError(
                f"could not append the upgrade record to {topics.log}: "
                f"{written[0][0] if written else 'the broker did not answer'}"
            )
    finally:
        for producer in producers:
            producer.flush(5)
    offset = written[0][1].offset()
    # Readers take the first upgrade record after the set it moves from and pass over any
    # other made from that set: success is only what they accepted.
    accepted = current_set(bootstrap, topics.log, timeout, until=offset + 1)
    if accepted is not None and accepted.offset == offset:
        return Upgraded(current, accepted.version, accepted.identity, offset)
    if accepted is not None and accepted.identity == set_id(described):
        return Upgraded(current, accepted.version, accepted.identity, accepted.offset)  # the same move, made first
    raise UpgradeRaced(
        f"another `ordo upgrade` moved {topics.log} from {current.name} to procedure set "
        f"{accepted.name if accepted is not None else 'unknown'} at offset "
        f"{accepted.offset if accepted is not None else '?'}, before this one's record at offset {offset}, "
        f"which every reader passes over: nothing changed by this command. The log runs that set now; to move "
        f"it to these procedures, run `ordo upgrade` again (docs/operations.md, 'Upgrading procedures')"
    )


def kept_code(
    bootstrap: str, namespace: str, identity: int, timeout: float = 60.0, at: int | None = None
) -> bytes | None:
    """The code of procedure set `identity` as the log keeps it (procedures/kept.py): from
    a start or upgrade record that names that set (`at`: the one at that offset, else any);
    None if none holds it."""
    found = logged_set(bootstrap, namespace, identity, timeout, at, with_code=True)
    return found[1] if found is not None else None


def logged_set(
    bootstrap: str,
    namespace: str,
    identity: int,
    timeout: float = 60.0,
    at: int | None = None,
    with_code: bool = False,
) -> tuple[dict, bytes | None] | None:
    """(the described set, the code kept with it) of procedure set `identity`, from the
    newest start or upgrade record that names it (`at`: the one at that offset; `with_code`:
    one that keeps its code); None if none does."""
    topic = Topics(namespace).log
    log_id = log_identity(bootstrap, topic, timeout)
    if log_id is None:
        return None
    consumer = log_consumer(bootstrap, f"{topic}.startup")
    try:
        low_water, end = watermarks(consumer, TopicPartition(topic, 0), timeout)
        if at is not None:
            low_water, end = max(low_water, at), min(end, at + 1)
        if end <= low_water:
            return None
        for offset, value, head in reversed(records_between(consumer, topic, low_water, end, timeout)):
            if head is not None or value is None:
                continue
            try:
                kind, record = _decode(value, namespace, log_id)
            except LogError:
                continue
            if kind in (START, UPGRADE) and record.procedures and (record.code or not with_code):
                if set_id(record.procedures) == identity:
                    return record.procedures, record.code
        return None
    finally:
        consumer.close()


class UpgradeRaced(RuntimeError):
    """Another upgrade of the same log was accepted first."""


def upgrade_command(bootstrap: str, namespace: str, specs: tuple[str, ...]) -> str:
    """The `ordo upgrade` command line that moves `namespace` to the procedures of `specs`."""
    named = " ".join(f"--app {spec}" if ":" in spec else f"--procedures {spec}" for spec in specs)
    return f"`ordo upgrade --bootstrap-servers {bootstrap} --namespace {namespace} {named}`".replace("  ", " ")
