"""Following the log: a consumer on the log's single partition that feeds every record
through a LogCursor, so all readers accept exactly the same batches.

A follower also watches what it cannot see in the records themselves: a log that no
longer holds the last record it read (the broker lost it), a log whose sequence stalled
behind a start record no batch followed, and a log whose broker holds records past the
reader's position that it never releases to committed readers (a transaction on the log
that never ends). Each stops it with a clear error instead of waiting forever for batches
that will never be accepted or never come.

A record that would stop every reader (a gap in a lane's epochs, a batch of another log)
is passed over only where a skip record (`ordo log skip`) further on names it: a reader
that meets one looks ahead for it (`LogReader.accept`). Records dropped or skipped are
reported, one line each, with their offset.

Before its first read a reader makes sure the log is one its log secret can read
(`log_identity`): a log that holds records none of which is signed with it for this
namespace stops the reader with one line naming the secret, rather than having every
record passed over."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from ordo.broker.fetch_stall import REFETCH_AFTER
from ordo.broker.fetch_states import FetchStates
from ordo.broker.clients import arrived, close_later, consumer_config, watermarks
from ordo.log.records import (
    SKIP,
    STALE_LIMIT,
    START,
    Batch,
    LogCursor,
    LogError,
    SecretMismatch,
    Start,
    batch_of_log,
    decode,
    decode_before_places,
    is_batch_record,
)
from ordo.log.probe import ABSENT_GRACE, GONE, LogWatch, fingerprint
from ordo.log.secret import PREVIOUS_ENV, SECRET_ENV, SECRET_FILE_ENV, secret_source
from ordo.broker.topics import Topics

log = logging.getLogger("ordo.log")

WATCH_EVERY = 2.0  # seconds between checks of the log's end offset
STALE_GRACE = 5.0  # how long the sequence may stall behind a start record before it is an error
# How long every record read may fail to verify before the reader says why that may be,
# and how often it says so again while it lasts; per-record warnings stop after a few.
UNVERIFIED_GRACE = 5.0
UNVERIFIED_REPEAT = 60.0
UNVERIFIED_SHOWN = 3
# How long the broker may hold back records past a reader's position: three times Kafka's
# default transaction timeout, after which Kafka itself aborts a transaction left open.
HELD_LIMIT = 180.0

# Records read from the log's head in search of its first start record before a log none
# of whose records verify is called one written with another secret: a log's first start
# record is its first record, unless a writer without the secret got in before it.
HEAD_SCAN = 1000


class LogLost(LogError):
    """The broker no longer holds the log this reader followed."""


def log_consumer(bootstrap: str, group: str, states: FetchStates | None = None) -> Consumer:
    return Consumer(
        consumer_config(
            bootstrap,
            {
                **(states.settings() if states is not None else {}),
                "group.id": group,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                # A position the log no longer holds is an error, never a silent jump elsewhere.
                "auto.offset.reset": "error",
                "fetch.max.bytes": 64 * 1024 * 1024,
                "max.partition.fetch.bytes": 16 * 1024 * 1024,
            },
        )
    )


def log_identity(bootstrap: str, topic: str, timeout: float = 30.0, group: str | None = None) -> str | None:
    """The identity of the log in `topic` (its first start record's token), read from its
    head; None for a log that holds no record yet. SecretMismatch where the log holds records
    and none of the first HEAD_SCAN is this namespace's first start record under this
    process's log secret (nor a batch of a log of it, which a log whose head was deleted
    begins with)."""
    namespace = Topics.namespace_of_log(topic)
    # A consumer group the documented ACLs grant its caller: the sequencer's by default.
    consumer = log_consumer(bootstrap, group or f"{topic}.startup")
    part = TopicPartition(topic, 0)
    try:
        low, end = watermarks(consumer, part, timeout)
        consumer.assign([TopicPartition(topic, 0, low)])
        seen = 0
        deadline = time.monotonic() + timeout
        # The consumer's position passes aborted records and transaction markers too.
        while seen < HEAD_SCAN and max(consumer.position([part])[0].offset, low) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} from its beginning made no progress for {timeout:.0f} s")
            for message in consumer.consume(100, 0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"log read failed: {error}")
                deadline, seen = time.monotonic() + timeout, seen + 1
                value = message.value()
                claimed = batch_of_log(value, namespace)
                if claimed is not None and seen > 1:
                    raise SecretMismatch(
                        f"the first {seen - 1} record(s) of {topic} are not signed for namespace {namespace} with "
                        f"the log secret from {secret_source()}, and a batch after them (offset "
                        f"{message.offset()}) is: the log began under an earlier secret; keep it for reading "
                        f"({PREVIOUS_ENV}, or a line after the first of the secret file; docs/operations.md, "
                        f"'Rotating the log secret'). Nothing was written"
                    )
                if claimed is not None:
                    return claimed  # a log whose head was deleted: its readers say so
                try:
                    kind, record = decode(value, namespace, None)
                except LogError:
                    try:  # a log written before tags covered where a record belongs
                        kind, record = decode_before_places(value, namespace)
                    except LogError:
                        continue
                if kind == START:
                    return record.token
        if seen == 0:
            return None  # nothing a committed reader sees (an aborted transaction's records)
    finally:
        consumer.close()
    raise SecretMismatch(
        f"none of the {seen} record(s) at the beginning of {topic} is signed for namespace {namespace} with the log "
        f"secret from {secret_source()}: it is not the secret this log was written with (moved, or changed?); "
        f"give Ordo that one ({SECRET_ENV}, {SECRET_FILE_ENV} or --log-secret-file; docs/operations.md, "
        f"'The log secret'). Nothing was written"
    )


def is_skip_for(value: bytes, offset: int, namespace: str, log_id: str | None) -> bool:
    """Whether `value` is a skip record naming `offset` of `namespace`'s log `log_id`."""
    if is_batch_record(value):
        return False
    try:
        kind, record = decode(value, namespace, log_id)
    except LogError:
        return False
    return kind == SKIP and record.offset == offset and record.log_id == log_id


@dataclass
class HeldBack:
    """Records past a reader's position that have not come since `since`."""

    since: float
    position: int
    refetched: float  # when the reader last read on with a new consumer (at first: since)
    consumers: int = 0  # how many new consumers it has tried
    stable: int | None = None  # the last stable offset the newest one was told


class LogReader:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        cursor: LogCursor,
        group: str,
        on_start: Callable[[Start], None] | None = None,
        on_dropped: Callable[[int, str], None] | None = None,
        check_secret: bool = True,
        on_unverified: Callable[[str], None] | None = None,
    ):
        """`on_dropped(offset, why)` hears of each record passed over (default: a warning).
        `check_secret`: make sure of the log secret before the first read (`log_identity`),
        unless the caller has."""
        self.cursor = cursor
        cursor.namespace = Topics.namespace_of_log(topic)
        self.topic = topic
        self._secret_checked = not check_secret
        self._on_start = on_start
        self._on_dropped = on_dropped or self._warn
        self._on_unverified = on_unverified or self._say
        self._states = FetchStates()
        self._consumer = log_consumer(bootstrap, group, self._states)
        start = cursor.next_offset if cursor.next_offset > 0 else OFFSET_BEGINNING
        self._consumer.assign([TopicPartition(topic, 0, start)])
        self._bootstrap, self._group = bootstrap, group
        self._assigned_at = cursor.next_offset  # where the newest consumer began: read up to there
        self._watched = 0.0
        self._stale_since: float | None = None
        self._missing_since: float | None = None  # since when the broker says the log does not exist
        self._held: HeldBack | None = None  # while records past the position do not come
        # (offset, fingerprint) of the newest record read; resuming, the record before the
        # cursor, known only to exist
        self._last_read: tuple[int, bytes | None] | None = (
            (cursor.next_offset - 1, None) if cursor.next_offset > 0 else None
        )
        self._probe: LogWatch | None = None
        self._unverified_since: float | None = None  # while every record read fails to verify
        self._unverified_said = 0.0

    def poll(self, timeout: float, max_records: int = 500) -> list[tuple[Batch, dict]]:
        """Accepted batches among the next records (possibly none), each with the cursor
        as it stood right after it: what a shard records as applied with that batch."""
        accepted = []
        cursor = self.cursor
        records = self.poll_raw(timeout, max_records)
        for offset, value in records:
            batch = self.accept(offset, value)
            if cursor.started is not None:
                start, cursor.started = cursor.started, None
                if self._on_start is not None:
                    self._on_start(start)
            if batch is not None:
                accepted.append((batch, cursor.to_dict()))
        if records:
            offset, value = records[-1]
            self._last_read = (offset, fingerprint(value))
        if cursor.unverified or self._unverified_since is not None:
            self._check_unverified()
        if not records or cursor.stale > STALE_LIMIT:
            self._watch()
        return accepted

    def accept(self, offset: int, value: bytes) -> Batch | None:
        """`LogCursor.accept`, reporting what it drops, and passing over a record that would
        stop the reader where a skip record names it."""
        cursor = self.cursor
        try:
            batch = cursor.accept(value, offset)
        except LogError:
            if not self._skip_recorded(offset):
                raise
            cursor.skip(offset)
            batch = None
        while cursor.unreported:
            self._on_dropped(*cursor.unreported.pop(0))
        return batch

    def _warn(self, offset: int, why: str) -> None:
        if self.cursor.unverified <= UNVERIFIED_SHOWN or not why.startswith("not signed"):
            log.warning("passed over the record at offset %d of %s: %s", offset, self.topic, why)

    @staticmethod
    def _say(line: str) -> None:
        log.error("%s", line)

    def _check_unverified(self) -> None:
        """One line, not one per record, when for a while no record read verifies: what a
        log secret rotated for the writers and not yet for this reader looks like."""
        count = self.cursor.unverified
        if count == 0:
            self._unverified_since = None
            return
        now = time.monotonic()
        if self._unverified_since is None:
            self._unverified_since = now
        lasted = now - self._unverified_since
        if lasted < UNVERIFIED_GRACE or now - self._unverified_said < UNVERIFIED_REPEAT:
            return
        self._unverified_said = now
        self._on_unverified(
            f"for {lasted:.0f} s no record of {self.topic} has been signed with a log secret this process holds "
            f"({count} in a row, up to offset {self.cursor.next_offset - 1}), so none of them runs: if the log "
            f"secret was rotated, this process still has the old one; put the new secret where it reads it "
            f"({secret_source()}) and keep the old one for reading ({PREVIOUS_ENV}; docs/operations.md, 'Rotating "
            f"the log secret'); if not, a writer without the secret appends to the log. The records wait in the "
            f"log: nothing is lost"
        )

    def _skip_recorded(self, offset: int) -> bool:
        """Whether a skip record after `offset`, up to the log's end now, names it."""
        consumer = log_consumer(self._bootstrap, f"{self._group}.skips")
        try:
            part = TopicPartition(self.topic, 0)
            _, end = consumer.get_watermark_offsets(part, timeout=10, cached=False)
            consumer.assign([TopicPartition(self.topic, 0, offset + 1)])
            deadline = time.monotonic() + 60
            while offset + 1 < end and time.monotonic() < deadline:
                for message in consumer.consume(500, 0.5):
                    if message.error() is None and is_skip_for(
                        message.value(), offset, self.cursor.namespace, self.cursor.log_id
                    ):
                        return True
                if consumer.position([part])[0].offset >= end:  # passes aborted records and markers too
                    break
            return False
        finally:
            consumer.close()

    def _watch(self) -> None:
        now = time.monotonic()
        if now - self._watched < WATCH_EVERY:
            return
        self._watched = now
        self._renew_if_not_fetching(now)
        watch = self._log_watch()
        if self._last_read is not None:
            watch.note(*self._last_read)
        self.check_broker()
        end, error = watch.end
        if self._last_read is None:
            missing = watch.answered.is_set() and end is None and error in GONE
            # A durable broker that is starting again answers "no such topic" for a while.
            self._missing_since = (self._missing_since or now) if missing else None
            if missing and now - self._missing_since >= ABSENT_GRACE:
                raise LogError(
                    f"topic {self.topic} does not exist: create the namespace's topics first (`ordo run` creates them)"
                )
            self._check_held_back(now, end)
            return
        self._check_held_back(now, end)
        cursor = self.cursor
        if cursor.stale <= STALE_LIMIT:
            self._stale_since = None
            return
        if end is not None and 0 <= end <= cursor.next_offset + 1:  # at the tail (a marker may follow)
            self._stale_since = self._stale_since or now
            if now - self._stale_since >= STALE_GRACE:
                lane = max(cursor.stale_by_lane, key=cursor.stale_by_lane.get)
                if lane not in cursor.lanes:
                    raise LogError(
                        f"{cursor.stale} batches of sequencer {lane} came after a start record for "
                        f"{cursor.sequencers} sequencer(s), which closed that sequencer's lane: a sequencer started "
                        f"under the earlier count still appends to {self.topic}, or that start record did not come "
                        f"from a sequencer; stop the stray sequencer or restart the sequencers (a new generation "
                        f"takes over), and keep other producers off the log"
                    )
                raise LogError(
                    f"{cursor.stale} batches of sequencer {lane} belong to its previous generation, after a "
                    f"start record of that sequencer (offset {cursor.lanes[lane][0]}) that no batch followed: "
                    f"a record on {self.topic} did not come from a sequencer; restart the sequencer (a new "
                    f"generation takes over) and keep other producers off the log"
                )

    def check_broker(self) -> None:
        """Raise LogLost once the log's watch has found that the broker lost the log: another
        cluster answers, or the last record read is gone. Reads only the watch's latest
        answers, so it may be called while the reader waits on something else."""
        watch = self._probe
        if watch is None:
            return
        lost_cluster = watch.lost_cluster()
        if lost_cluster is not None:
            raise LogLost(lost_cluster)
        if watch.lost is not None:
            raise LogLost(
                f"{self.topic} no longer holds the record at offset {watch.lost} that this reader read: "
                f"the broker lost the log (restarted without its data?); see docs/operations.md, "
                f"'Broker lost'"
            )

    def check_broker_now(self, timeout: float = 10.0) -> None:
        """check_broker on a fresh answer: for a failure that may be the broker's loss
        (a write refused for an unknown topic), so it is reported as that loss."""
        if self._probe is not None:
            self._probe.ask_now(timeout)
        self.check_broker()

    def _log_watch(self) -> LogWatch:
        """Asks the broker about the log from a thread of its own (log/probe.py)."""
        if self._probe is None:
            self._probe = LogWatch(self._bootstrap, self.topic, f"{self._group}.probe", WATCH_EVERY)
        return self._probe

    def _renew_if_not_fetching(self, now: float) -> None:
        """A consumer whose fetcher has stayed out of `active` for REFETCH_AFTER with its
        broker up is replaced, whether or not records are known to wait (broker/fetch_states.py)."""
        if self._consumer is None or not self._states.inactive(now, REFETCH_AFTER):
            return
        was = self._states.describe()
        position = self.position()
        self._read_with_new_consumer(position)
        log.warning(
            "the consumer of %s has not fetched for %.0f s with its broker up (%s): reading on from offset %d with "
            "a new consumer",
            self.topic,
            REFETCH_AFTER,
            was,
            position,
        )

    def _check_held_back(self, now: float, end: int | None) -> None:
        """Records past this reader's position (more than one transaction marker) that have
        not reached it, with no progress, for HELD_LIMIT. Every REFETCH_AFTER of that, the
        reader reads on with a new consumer, which also asks the broker for the last stable
        offset: past the position, the broker releases records the old consumer never
        fetched; at it, a transaction on the log that never ends holds back everything
        after it."""
        position = self.position()
        if end is None or end <= position + 1:
            self._held = None
            return
        if self._held is None or self._held.position != position:
            self._held = HeldBack(now, position, refetched=now)
            return
        held = self._held
        if now - held.refetched >= REFETCH_AFTER and self._consumer is not None:
            held.refetched, held.consumers = now, held.consumers + 1
            was = self._states.describe()
            held.stable = self._read_with_new_consumer(position)
            log.warning(
                "%s holds records up to offset %d, %s, and none past offset %d came for %.0f s: "
                "reading on from there with a new consumer (the old one: %s)",
                self.topic,
                end - 1,
                "its last stable offset unknown"
                if held.stable is None
                else f"committed up to offset {held.stable - 1}",
                position,
                now - held.since,
                was,
            )
        if now - held.since < HELD_LIMIT:
            return
        if held.stable is not None and held.stable > position + 1:
            raise LogError(
                f"{self.topic} holds committed records up to offset {held.stable - 1}, but for "
                f"{now - held.since:.0f} s none past offset {position} reached this reader, through "
                f"{held.consumers} new consumer(s): the broker does not serve this reader's fetches; check the "
                f"broker's log and its listeners, then start again (the engine resumes from its shards)"
            )
        raise LogError(
            f"{self.topic} holds records up to offset {end - 1}, but for {now - held.since:.0f} s the "
            f"broker has released none past offset {position} to committed readers: a transaction on the log "
            f"never ended. Either a producer other than Ordo's sequencers writes to the log (end its "
            f"transaction, keep it off the log) or the local broker lost track of one, which nothing "
            f"ends (docs/local-broker.md, 'Transactions ending together'): start over on a new broker"
        )

    def _read_with_new_consumer(self, position: int) -> int | None:
        """Replaces the consumer with a new one at `position` and returns the log's last
        stable offset as the new one is told it (None if the broker did not say)."""
        self._states = FetchStates()
        old, self._consumer = self._consumer, log_consumer(self._bootstrap, self._group, self._states)
        self._consumer.assign([TopicPartition(self.topic, 0, position)])
        self._assigned_at = position
        if old is not None:
            close_later(old)
        try:
            return self._consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=2, cached=False)[1]
        except KafkaException:
            return None

    def position(self) -> int:
        """Where this reader stands in the log: every record before this offset has been
        read. The consumer's own position also passes what it drops (aborted records,
        transaction markers), which the cursor never sees: at the log's end, after a
        transaction's marker, only that position equals the end offset."""
        if self._consumer is None:  # closed
            return self.cursor.next_offset
        fetched = self._consumer.position([TopicPartition(self.topic, 0)])[0].offset
        return max(self.cursor.next_offset, fetched, self._assigned_at)

    def poll_raw(self, timeout: float, max_records: int = 500) -> list[tuple[int, bytes]]:
        """The next records as (offset, value), without acceptance."""
        if not self._secret_checked:
            try:
                log_identity(self._bootstrap, self.topic, max(timeout, 2.0), f"{self._group}.identity")
            except (KafkaException, TimeoutError):
                return []  # no answer yet: asked again on the next poll, nothing read before
            self._secret_checked = True
        out = []
        for message in arrived(self._consumer, timeout, max_records):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    raise LogLost(
                        f"{self.topic} does not reach offset {self.cursor.next_offset} any more, where "
                        f"this reader stands: the broker lost the log (restarted without its data?); "
                        f"see docs/operations.md, 'Broker lost'"
                    )
                raise RuntimeError(f"log read failed: {error}")
            out.append((message.offset(), message.value()))
        return out

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._probe is not None:
            self._probe.close()
            self._probe = None
