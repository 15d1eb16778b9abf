"""The sequencer: consume requests, cut them into epochs, validate and number them, and
append each epoch to the log as one batch record, which carries the request offsets it
consumed.

Appends are plain idempotent writes, not Kafka transactions: a batch is one record that
names its lane, generation and epoch, and every reader accepts it by those alone
(`LogCursor.accept`), so a repeat or a superseded sequencer's batch is dropped alike by
all of them. Where to resume is read from the log itself (the last accepted batch's
request offsets), not from committed consumer offsets: the log is the single source of
truth. A sequencer learns from the log, too, that another one took over its lane
(sequencer/takeover.py). The consumed positions are also committed to the sequencer's
consumer group now and then, for the lag display and for any tool that expects them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from ordo.procedures.fingerprint import describe, describe_as, is_versioned, set_id, short
from ordo.procedures.registry import Registry
from ordo.procedures.ollp import is_resequenced, request_identity
from ordo.sequencer.dedupe import RecentIds
from ordo.sequencer.epochs import EpochLength
from ordo.broker.fetch_stall import EndWatch, FetchStall
from ordo.broker.fetch_states import FetchStates
from ordo.broker.clients import arrived, close_later, consumer_config, kafka_config
from ordo.broker.lag import sequencer_group
from ordo.sequencer.lane_owner import Superseded, note, own_owner, refuse_if_taken, who_took_over
from ordo.log.probe import LogWatch, fingerprint
from ordo.log.records import (
    ARIA,
    BATCH_OVERHEAD,
    SNAPSHOT_EVERY,
    LogCursor,
    bin_size,
    encode_batch,
    encode_entry,
    encode_snapshot,
    encode_start,
)
from ordo.broker.fetch_stall import REFETCH_AFTER
from ordo.log.reader import LogReader, log_identity
from ordo.sequencer.routing import (
    SINGLE_ITEM_BYTES,
    build_routing,
    item_bytes,
    max_item_bytes,
    placement_of,
    routing_bytes,
)
from ordo.broker.reachability import UNANSWERED
from ordo.sequencer.sources import SourceReading, SourceRecreated, position_key
from ordo.sequencer.takeover import TakeoverWatch
from ordo.log.snapshots import find_seed
from ordo.broker.topics import Topics, check_topics, request_partitions_for
from ordo.sequencer.wire import parse_request_sets
from ordo.storage.partitioning import Partitioner

log = logging.getLogger("ordo.sequencer")


def _spans(offsets: dict) -> str:
    """Request offsets a batch took, as 'partition p [first, end)' pieces (a source
    topic's as 'topic:p [first, end)')."""
    return (
        ", ".join(
            f"{'' if type(p) is str else 'partition '}{p} [{span[0]}, {span[1]})"
            for p, span in sorted(offsets.items(), key=lambda item: str(item[0]))
        )
        or "nothing"
    )


# How long appending one batch may go unacknowledged (the producer retrying meanwhile, a
# broker away and back) before the sequencer gives up with a clear error instead of
# waiting for ever.
APPEND_DEADLINE = 60.0
# What the producer may send beyond a batch record's value (key, headers, Kafka's record
# framing), and the largest value a batch record may have within librdkafka's own limit
# on `message.max.bytes`.
RECORD_OVERHEAD = 64 * 1024
MAX_BATCH_BYTES = 1_000_000_000 - RECORD_OVERHEAD
# What a batch record takes on the log beyond its value: key, headers and Kafka's framing.
RECORD_FRAMING = 1024
# How often the consumed positions are committed to the sequencer's group while batches are
# appended: they feed the lag display and the lane owner's note (lane_owner.py), not the
# log, so one commit per batch would be work for the broker that buys nothing.
NOTE_EVERY = 0.25
# The epoch lengths the sequencer keeps by default (SequencerConfig.epoch_ms): for an engine of
# one partition, and Calvin's for an engine of several.
SINGLE_PARTITION_EPOCH_MS = 2.0
PARTITIONED_EPOCH_MS = 10.0
# Epochs that follow the rate (SequencerConfig.min_delay_ms) are their longest from this many
# requests a second on (sequencer/epochs.py).
FOLLOW_FULL_AT = 1_000.0
# How often an idle sequencer checks that the broker still holds what it sequenced.
WATCH_EVERY = 2.0
# How long after its start a sequencer waits before it calls its lane its own (`settled`):
# a sequencer that passed its look at the same moment appends its start record at once
# after its look, so within this time, and the one it takes over from learns of it here.
SETTLE_S = 1.0
# How long an idle sequencer waits for a request at a time: the wait ends at the first
# request, so it costs no latency; it bounds how soon the idle watch and a stop are seen.
IDLE_WAIT = 0.05


class BrokerLost(RuntimeError):
    """The broker no longer holds what this sequencer wrote or consumed."""


SINGLE = ((0,), (0,), None, SINGLE_ITEM_BYTES)


class _MovedOn(Exception):
    """The log moved this sequencer's lane on without it (sequencer/takeover.py)."""


@dataclass(frozen=True, slots=True)
class SequencerConfig:
    # Calvin's epochs: at most one batch per that many ms unless full. 0: group commit, a
    # batch is cut as soon as the previous append is acknowledged and holds every request
    # that came meanwhile, so no request waits for an epoch's end. None: the default for the
    # engine's partition count (`epoch_ms`).
    max_delay_ms: float | None = None
    max_txns: int = 5_000
    max_bytes: int = 900_000  # below the broker's default 1 MiB message limit
    max_request_bytes: int = 64 * 1024
    dedupe_window: int = 1_000_000
    partitions: int = 1  # the engine's partition count, for routing each batch
    sequencers: int = 1  # S: how many sequencers share the request partitions
    index: int = 0  # k: this one takes the request partitions p with p % S == k
    ordering: str | None = None  # every batch's ordering stamp (log/records.py): None (log order) or ARIA
    # Epochs that follow the rate requests arrive at: this long at light load, growing with
    # the rate to `epoch_ms` (sequencer/epochs.py). None: epochs of `epoch_ms` always.
    min_delay_ms: float | None = None

    def epoch_length(self) -> EpochLength:
        """The sequencer's epochs: of `epoch_ms`, or following the rate from `min_delay_ms`
        at light load to `epoch_ms` from FOLLOW_FULL_AT requests a second on."""
        longest = self.epoch_ms / 1000.0
        if self.min_delay_ms is None or self.min_delay_ms >= self.epoch_ms:
            return EpochLength(longest, longest)
        return EpochLength(self.min_delay_ms / 1000.0, longest, FOLLOW_FULL_AT)

    @property
    def epoch_ms(self) -> float:
        """The epoch length the sequencer keeps (its longest, where epochs follow the rate). Epochs count from the last cut, so a request
        that comes after a quiet spell is cut at once, and under load batches come one per
        epoch. An engine of one partition pays little per batch beyond its entries: 2 ms
        epochs give it batches nearly as soon as group commit does at light load, and keep
        batches from shrinking to a few requests under heavy load, where group commit's
        one batch per append spends the engine's core on per-batch work. On several
        partitions each batch is also a round of exchanges between the partitions, so
        they get Calvin's 10 ms (docs/benchmarks.md)."""
        if self.max_delay_ms is not None:
            return self.max_delay_ms
        return SINGLE_PARTITION_EPOCH_MS if self.partitions == 1 else PARTITIONED_EPOCH_MS

    def __post_init__(self) -> None:
        if self.max_bytes > MAX_BATCH_BYTES:
            raise ValueError(
                f"--max-bytes {self.max_bytes:,} is more than a Kafka record can hold: at most {MAX_BATCH_BYTES:,} "
                f"(Kafka clients take records up to 1,000,000,000 bytes); the default is "
                f"{SequencerConfig.max_bytes:,}"
            )
        if self.ordering not in (None, ARIA):
            raise ValueError(f"unknown batch ordering {self.ordering!r} (log order, or '{ARIA}')")
        if self.partitions < 1:
            raise ValueError("partitions must be >= 1")
        if self.sequencers < 1 or not 0 <= self.index < self.sequencers:
            raise ValueError(f"sequencer index {self.index} of {self.sequencers}: need 0 <= index < sequencers")
        if (
            self.max_request_bytes
            + BATCH_OVERHEAD
            + 64
            + routing_bytes(self.partitions)
            + max_item_bytes(self.partitions)
            > self.max_bytes
        ):
            raise ValueError("max_request_bytes must leave room in max_bytes for one request")


@dataclass(frozen=True, slots=True)
class Handover:
    """A sequencer's state as of its newest batch every reader accepts, for the sequencer
    that goes on with its lane in the same process after an upgrade: what a new one would
    otherwise rebuild by reading the log back (its duplicate memory reaches a million
    entries back)."""

    cursor: dict
    next_offset: int  # the log offset after that batch
    accepted: int
    last_time: int
    recent: RecentIds


# The newest states a sequencer keeps to hand over: more than its appends after the record
# that ends its generation can be (takeover.STALE_APPENDS).
KEPT_STATES = 8


@dataclass(slots=True)
class _Epoch:
    entries: list[bytes] = field(default_factory=list)
    placements: list = field(default_factory=list)  # per entry: `placement_of`'s placement, None if rejected
    size: int = 0
    opened: float = 0.0
    # request partition, or a source topic's "topic:partition" -> [first, end) consumed
    offsets: dict[int | str, list[int]] = field(default_factory=dict)


@dataclass(slots=True)
class SequencerStats:
    batches: int = 0
    requests: int = 0  # taken into an epoch
    sequenced: int = 0  # appended to the log
    rejected: int = 0
    startup_records: int = 0  # log records read at start-up


def owned_partitions(partitions: int, index: int, sequencers: int) -> list[int]:
    return [p for p in range(partitions) if p % sequencers == index]


class Sequencer:
    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        registry: Registry,
        config: SequencerConfig = SequencerConfig(),
        owner: dict | None = None,
        procedure_specs: tuple[str, ...] = (),
    ):
        """`procedure_specs`: how `registry` was named (procedures/loading.py), for the
        upgrade command a refusal names."""
        self.bootstrap = bootstrap
        self.owner = owner or own_owner("ordo sequence")  # who this sequencer notes it is (lane_owner.py)
        self.topics = Topics(namespace)
        self.registry = registry
        self._procedure_specs = procedure_specs
        self._described = describe(registry)
        self._set_id = set_id(self._described)  # every batch carries it
        self.config = config
        # What a batch's entries and routing items may take: max_bytes less the rest of it.
        self._entries_limit = config.max_bytes - BATCH_OVERHEAD - routing_bytes(config.partitions)
        self.stats = SequencerStats()
        self._stop = threading.Event()
        self._group = sequencer_group(namespace)
        self._producer = Producer(
            kafka_config(
                bootstrap,
                {
                    # The broker keeps each batch once and in order however often the producer
                    # retries it; a record it cannot place in order stops the producer rather
                    # than leaving a gap that every reader would stop at.
                    "enable.idempotence": True,
                    "enable.gapless.guarantee": True,
                    "message.timeout.ms": int(APPEND_DEADLINE * 1000),
                    "linger.ms": 0,
                    "message.max.bytes": max(config.max_bytes + RECORD_OVERHEAD, 1_000_000),
                },
            )
        )
        self._consumer: Consumer | None = None
        self._states = FetchStates()  # the request consumer's fetcher, from its statistics
        self._owned: list[int] = []  # the request partitions this sequencer consumes
        self._sources = SourceReading(bootstrap, self.topics, registry, config.index, config.sequencers)
        self._cursor = LogCursor()
        self._started_at = -1  # this sequencer's start record's offset: its generation
        self._log_end = 0  # the log's end offset after this sequencer's last append, as far as known
        self._last_appended: tuple[int, bytes] | None = None  # (offset, fingerprint)
        # The log's end offset after the append before this sequencer's latest: the watch must
        # have read up to it before the next append.
        self._confirm_through = 0
        self._probe: LogWatch | None = None
        self._takeover: TakeoverWatch | None = None
        # Set once this sequencer's lane has stayed its own for SETTLE_S after its start:
        # its engine serves from then on (ordo/services.py), a loser of a start race never.
        self.settled = threading.Event()
        self._settle_at = float("inf")
        self._settle_end: int | None = None
        self._append_error: KafkaError | None = None  # the latest append's failure, from its delivery report
        self._positions: dict[tuple[str, int], TopicPartition] = {}  # consumed positions not noted yet
        self._noted_at = 0.0
        self._accepted = 0  # entries accepted into the log so far (what the duplicate check remembers)
        self._watched = 0.0
        self._partitions_checked = time.monotonic()  # when the requests topic's partitions were last counted
        self._ends: EndWatch | None = None
        self._fetch_stall = FetchStall()
        self._fetch_checked = time.monotonic()
        self._last_cut_at = 0.0  # monotonic time the newest batch began to be cut
        self._epochs = config.epoch_length()
        self._recent = RecentIds(config.dedupe_window)
        self._kept: deque[tuple[int, dict, int, int, tuple[int, int]]] = deque(maxlen=KEPT_STATES)
        self.handed_over: Handover | None = None  # for the sequencer after an upgrade (`_hand_over`)
        self._packed_code: bytes | None = None
        self._last_time = 0
        tables = registry.tables.values()
        self._partitioner = Partitioner.for_tables(config.partitions, {t.name: t.partitioner for t in tables})

    # -- start-up ---------------------------------------------------------------------

    def start(self, timeout: float = 60.0, checked=None, handover: Handover | None = None) -> None:
        """Mark the takeover of this lane in the log, and learn from the log where
        sequencing stands: from a recent snapshot of an earlier sequencer's state, reading
        forward to this sequencer's own start record. An earlier sequencer of the lane
        stops once it reads that start record (sequencer/takeover.py). `checked`: the set
        the log runs, read and matched against these procedures a moment ago; `handover`:
        the state of the sequencer this one follows in the same process, instead of the
        log's."""
        from ordo.log.versions import check_set, upgrade_command

        config = self.config
        check_topics(self.bootstrap, self.topics, timeout, record_bytes=config.max_bytes + RECORD_FRAMING)
        self._sources.check(timeout)
        partitions = request_partitions_for(self.bootstrap, self.topics, config.sequencers)
        # Before fencing anyone: a sequencer of another procedure set must leave a running one alone.
        # (`checked`: the log's set as the caller has just read and matched it, after an upgrade.)
        current = checked or check_set(
            self.bootstrap,
            self.topics.namespace,
            self.registry,
            upgrade_command(self.bootstrap, self.topics.namespace, self._procedure_specs),
            timeout,
            tuple(self._procedure_specs),
        )
        if current is not None and is_versioned(current.described):  # the log keeps its form
            self._described = describe_as(self.registry, current.described)
            self._set_id = set_id(self._described)
        self._owned = owned_partitions(partitions, config.index, config.sequencers)
        # The start record is bound to the log it continues (log/records.py), and a log none
        # of whose records this secret can read is refused before anything is written.
        log_id = log_identity(self.bootstrap, self.topics.log, timeout)
        # Before fencing anything: a live sequencer of another engine keeps its partitions.
        # Right before the start record, so that a start racing this one lands within SETTLE_S.
        refuse_if_taken(
            self.bootstrap, self.topics.namespace, self._group, self.topics.requests, self._owned, self.owner
        )
        while not self._take_over(log_id, timeout, handover):
            # Another sequencer began the log first, so this one's start record, made as
            # the log's first, belongs to no log: start again, in the log it began.
            log_id = self._cursor.log_id
        self._check_still_current()
        # Each source partition read from the incarnation of its topic the log names, or the
        # new one from its beginning (sequencer/sources.py); the log carries the binding.
        self._sources.bind(self._cursor)
        self._append([self._snapshot(self._own_cursor(), self._accepted)], [])
        self._keep(self._log_end - 1)
        self._takeover = TakeoverWatch(
            self.bootstrap,
            self.topics.log,
            self._cursor,
            config.index,
            self._started_at,
            f"{self._group}.takeover",
        )
        self._consumer = self._requests_consumer()
        offsets = self._cursor.request_offsets
        self._consumer.assign(
            [TopicPartition(self.topics.requests, p, offsets.get(p, OFFSET_BEGINNING)) for p in self._owned]
            + self._sources.assignment(self._cursor)
        )
        self._note_consumed()
        self._settle_at = time.monotonic() + SETTLE_S
        self._probe = LogWatch(self.bootstrap, self.topics.log, f"{self._group}.probe", WATCH_EVERY)
        self._ends = EndWatch(self.bootstrap, WATCH_EVERY)
        log.info(
            "sequencer %d of %d (generation at log offset %d) resumes at its batch %d",
            config.index,
            config.sequencers,
            self._started_at,
            self.next_epoch,
        )

    def _take_over(self, log_id: str | None, timeout: float, handover: Handover | None = None) -> bool:
        """Append this sequencer's start record to log `log_id` (None: as the log's first)
        and read the log up to it; False if the log had begun without it meanwhile."""
        config = self.config
        token = uuid.uuid4().hex
        start = encode_start(
            self.topics.namespace, log_id, token, self._described, config.index, config.sequencers, self._kept_code()
        )
        self._append([start], [], timeout)
        self._started_at = self._log_end - 1
        if handover is not None:  # read on from where the sequencer before stood
            self._cursor = LogCursor.from_dict(handover.cursor, self.topics.namespace)
            self._cursor.next_offset, self._cursor.only = handover.next_offset, config.index
            self._accepted, self._last_time, self._recent = handover.accepted, handover.last_time, handover.recent
            return self._catch_up(token, timeout)
        self._cursor, self._accepted, self._last_time = LogCursor(), 0, 0
        self._recent = RecentIds(config.dedupe_window)
        seed = find_seed(
            self.bootstrap,
            self.topics.log,
            self._started_at,
            config.dedupe_window,
            config.index,
            config.sequencers,
            log_id,
        )
        if seed is not None:
            self._cursor, self._accepted, self._last_time = seed
            self._cursor.only = config.index
        if self._catch_up(token, timeout):
            return True
        if log_id is not None or self._cursor.log_id is None:
            raise RuntimeError(
                f"this sequencer's start record at offset {self._started_at} of {self.topics.log} "
                f"does not verify for that log: restart the sequencer"
            )
        return False

    def _check_still_current(self) -> None:
        """The set check at the start ran before this sequencer's start record: an upgrade
        record that landed in between moved the log on, and its start record opens a lane of
        a set the log no longer runs. Read up to that start record, the log says so."""
        named = self._cursor.procedures
        if named is None or not named[3] or named[1] == self._set_id:
            return
        from ordo.log.versions import UpgradedAway

        raise UpgradedAway(
            f"{self.topics.log} moved to procedure set v{named[0]} ({short(named[1])}) at offset {named[2]} "
            f"(`ordo upgrade`) while this sequencer of {short(self._set_id)} started, and it stops before "
            f"sequencing anything; start it with the procedures of that set",
            named[0],
        )

    def _kept_code(self) -> bytes | None:
        """This set's code for the log to keep (procedures/kept.py), packed once."""
        if self._packed_code is None:
            from ordo.procedures.kept import pack

            self._packed_code = pack(self.registry, tuple(self._procedure_specs)) or b""
        return self._packed_code or None

    def _keep(self, offset: int) -> None:
        """Keep the state as of the record at `offset` (this sequencer's newest), to hand over."""
        self._kept.append((offset, self._cursor.to_dict(), self._accepted, self._last_time, self._recent.mark()))

    def _hand_over(self) -> Handover | None:
        """After an upgrade record ended this sequencer's generation: its state as of its
        newest batch before that record (readers pass over the ones after it, and the
        requests they held are read again), for the sequencer that goes on in this process;
        None where it cannot say."""
        moved = self._takeover.moved_on() if self._takeover is not None else None
        if moved is None or not self._takeover.upgraded:
            return None
        before = [kept for kept in self._kept if kept[0] < moved]
        if not before:
            return None
        offset, cursor, accepted, last_time, mark = before[-1]
        if not self._recent.rollback(mark):
            return None
        self._kept.clear()
        return Handover(cursor, offset + 1, accepted, last_time, self._recent)

    def _own_cursor(self) -> dict:
        """The cursor as a snapshot keeps it: this sequencer's lane only (what it knows of
        other lanes is not kept up to date while it runs)."""
        own = self._cursor.to_dict()
        own["lanes"] = {self.config.index: [self._started_at, self.next_epoch]}
        return own

    def _snapshot(self, cursor: dict, accepted: int) -> bytes:
        return encode_snapshot(
            self.topics.namespace, cursor, accepted, self._last_time, self.config.index, self.config.sequencers
        )

    def _catch_up(self, token: str, timeout: float) -> bool:
        """Read from the cursor to this sequencer's start record (False if the log passes
        over it); `timeout` bounds a stretch without progress, not the whole read."""
        reader = LogReader(
            self.bootstrap,
            self.topics.log,
            self._cursor,
            f"{self._group}.catchup",
            on_dropped=self._passed_over,
            check_secret=False,
        )
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                records = reader.poll_raw(0.2, 1000)
                if records:
                    deadline = time.monotonic() + timeout
                for offset, value in records:
                    self.stats.startup_records += 1
                    batch = reader.accept(offset, value)
                    if batch is not None and batch.sequencer == self.config.index:
                        entries = batch.entries
                        self._recent.add_batch_entries(entries)
                        self._accepted += sum(proc is not None for _, proc, _ in entries)
                        self._last_time = max(self._last_time, batch.time_ms)
                    elif self._cursor.started is not None and self._cursor.started.token == token:
                        self._log_end = offset + 1
                        return True
                    elif offset >= self._started_at:
                        return False
            raise TimeoutError(
                f"this sequencer's start record did not appear in {self.topics.log} "
                f"within {timeout:.0f} s of the last record read"
            )
        finally:
            reader.close()

    def _passed_over(self, offset: int, why: str) -> None:
        # The engines report each record on stderr; a sequencer re-reading the log says it only when asked.
        log.info("passed over the record at offset %d of %s: %s", offset, self.topics.log, why)

    @property
    def generation(self) -> int:
        """Start records in the log up to this sequencer's own (as far as it read)."""
        return self._cursor.generation

    @property
    def next_batch(self) -> int:
        """The id the log gives this sequencer's next batch if no other sequencer appends
        first: exact with one sequencer."""
        return self._cursor.next_batch

    @property
    def next_epoch(self) -> int:
        """The epoch number of this sequencer's next batch."""
        lane = self._cursor.lanes.get(self.config.index)
        return lane[1] if lane else 1

    # -- the loop ----------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        if self._consumer is None:
            self.start()
        try:
            with self._fenced_is_superseded():
                epoch = self._loop(_Epoch())
                if epoch.entries:
                    self._cut(epoch)
            self._note_consumed(stopped=True)
        finally:
            self.close()

    @contextmanager
    def _fenced_is_superseded(self):
        """A log that moved this lane on means another sequencer started on it, or `ordo
        upgrade` moved the log to another procedure set: stop in one line that says which,
        never to be restarted into taking the lane back."""
        try:
            yield
        except _MovedOn:
            from ordo.log.versions import UpgradedAway, current_set

            try:
                current = current_set(self.bootstrap, self.topics.log, 10)
            except Exception:
                current = None
            # An upgrade record ended the generation even where the log runs this sequencer's
            # own set again by now (v1 -> v2 -> v1 in quick succession): no other sequencer
            # took the lane, and the sequencer goes on in place like after any upgrade.
            upgraded = self._takeover is not None and self._takeover.upgraded
            if upgraded or (current is not None and current.identity != self._set_id):
                self.handed_over = self._hand_over()
                raise UpgradedAway(
                    f"{self.topics.log} moved to procedure set "
                    f"{current.name if current is not None else 'unknown'} (`ordo upgrade`), and this sequencer "
                    f"of {short(self._set_id)} stops; its engine stops where the log moves on",
                    current.version if current is not None else None,
                ) from None
            lane = f"sequencer {self.config.index} of {self.config.sequencers}"
            taker = who_took_over(self.bootstrap, self._group, self.topics.requests, self._owned, self.owner)
            if taker is None:
                raise Superseded(
                    f"the start record at offset {self._takeover.moved_on()} of {self.topics.log} took the lane "
                    f"of this {lane} over, and no sequencer noted itself on its request partitions: the record "
                    f"did not come from a sequencer; this one stops: restart Ordo (a new generation takes over) "
                    f"and keep other producers off the log"
                ) from None
            raise Superseded(
                f"{taker} started sequencing namespace {self.topics.namespace} ({lane}) and fenced this one, "
                f"which stops: one engine per namespace"
            ) from None

    def _loop(self, epoch: _Epoch) -> _Epoch:
        while not self._stop.is_set():
            max_delay = self._epochs.seconds()
            if not self.settled.is_set():
                self._check_settled()
            self._take_new_partitions()
            self._fetch_stuck_again()
            room = self.config.max_txns - len(epoch.entries)
            if epoch.entries:
                # consume(n, t) returns early only once n came: the epoch's end is the bound.
                messages = self._consumer.consume(room, max(epoch.opened + max_delay - time.monotonic(), 0.001))
            else:
                # An empty epoch opens at the first request: wait for it alone, take what came
                # with it (with group commit, all that came during the last append).
                messages = arrived(self._consumer, max(max_delay, IDLE_WAIT), room)
            if not messages and not epoch.entries:
                self._watch()
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        if message.topic() != self.topics.requests:
                            position = self._cursor.consumed_to(self._position(message))
                            raise BrokerLost(self._sources.lost(message.topic(), message.partition(), position))
                        raise BrokerLost(
                            f"{self.topics.requests} partition {message.partition()} does not reach "
                            f"the position this sequencer consumed up to: the broker lost the "
                            f"requests (restarted without its data?); see docs/operations.md, "
                            f"'Broker lost'"
                        )
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("request consumer: %s", error)
                    continue
                epoch = self._add(epoch, message)
                if len(epoch.entries) >= self.config.max_txns:
                    epoch = self._cut(epoch)
            if self._due(epoch, time.monotonic()):
                epoch = self._cut(epoch)
            elif not epoch.entries and epoch.offsets:
                epoch = self._consumed_without_batch(epoch)
        return epoch

    def _requests_consumer(self) -> Consumer:
        self._states = FetchStates()
        return Consumer(
            consumer_config(
                self.bootstrap,
                {
                    **self._states.settings(),
                    "group.id": self._group,
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.max.bytes": 64 * 1024 * 1024,
                    # A position the requests topic no longer holds is an error (the broker lost it),
                    # never a silent jump past the requests waiting there.
                    "auto.offset.reset": "error",
                },
            )
        )

    def _take_new_partitions(self) -> None:
        """Partitions added to the requests topic while this sequencer runs (producers scaled
        out): the ones this sequencer owns are read from their beginning, like those it
        started with, instead of waiting unread until a restart."""
        now = time.monotonic()
        if now - self._partitions_checked < WATCH_EVERY:
            return
        self._partitions_checked = now
        self._take_new_source_partitions()
        try:
            metadata = self._consumer.list_topics(self.topics.requests, timeout=1).topics.get(self.topics.requests)
        except KafkaException:
            return  # asked again in WATCH_EVERY; a broker away is the watch's business
        if metadata is None or metadata.error is not None:
            return
        owned = owned_partitions(len(metadata.partitions), self.config.index, self.config.sequencers)
        added = [p for p in owned if p not in self._owned]
        if not added:
            return
        offsets = self._cursor.request_offsets
        self._consumer.incremental_assign(
            [TopicPartition(self.topics.requests, p, offsets.get(p, OFFSET_BEGINNING)) for p in added]
        )
        self._owned = sorted(set(self._owned) | set(added))
        log.warning(
            "%s has %d partitions now: sequencer %d takes the new partition(s) %s too",
            self.topics.requests,
            len(metadata.partitions),
            self.config.index,
            ", ".join(map(str, added)),
        )

    def _fetch_stuck_again(self) -> None:
        """A partition that holds requests past this sequencer's position, none of which
        came for REFETCH_AFTER, is read on from there by a new consumer (broker/fetch_stall.py)."""
        now = time.monotonic()
        if now - self._fetch_checked < WATCH_EVERY or self._ends is None:
            return
        self._fetch_checked = now
        assignment = self._consumer.assignment()
        self._ends.watch([(tp.topic, tp.partition) for tp in assignment])
        positions = {(tp.topic, tp.partition): tp.offset for tp in self._consumer.position(assignment)}
        ends = self._ends.ends
        stuck = self._fetch_stall.stuck(positions, ends, now)
        idle = self._states.inactive(now, REFETCH_AFTER)
        if not stuck and not idle:
            return
        was = self._states.describe()
        for topic, partition in stuck:
            log.warning(
                "%s partition %d holds records up to offset %d, and none past offset %d came for %.0f s: reading "
                "on from there with a new consumer (the old one: %s)",
                topic,
                partition,
                ends[(topic, partition)] - 1,
                positions[(topic, partition)],
                self._fetch_stall.after,
                was,
            )
        if idle and not stuck:
            log.warning(
                "the request consumer has not fetched %s for %.0f s with its broker up (%s): reading on with a new "
                "consumer",
                ", ".join(f"{topic} partition {partition}" for topic, partition in idle),
                REFETCH_AFTER,
                was,
            )
        self._read_with_new_consumer(assignment, positions)

    def _read_with_new_consumer(self, assignment: list[TopicPartition], positions: dict) -> None:
        """Every partition read on where the old consumer stood, by a new consumer: a stalled
        one has fetched nothing more even when assigned its partition again. A partition it
        had taken nothing from yet begins where the log says, as at the start."""
        offsets = self._cursor.request_offsets

        def start(topic: str, partition: int) -> int:
            position = positions.get((topic, partition), -1)
            if position >= 0:
                return position
            if topic == self.topics.requests:
                return offsets.get(partition, OFFSET_BEGINNING)
            return self._sources.assignment(self._cursor, [position_key(topic, partition)])[0].offset

        old, self._consumer = self._consumer, self._requests_consumer()
        self._consumer.assign(
            [TopicPartition(tp.topic, tp.partition, start(tp.topic, tp.partition)) for tp in assignment]
        )
        close_later(old)

    def _take_new_source_partitions(self) -> None:
        added = self._sources.added(self._consumer)
        if added:
            self._consumer.incremental_assign(self._sources.assignment(self._cursor, added))
            log.warning(
                "sequencer %d reads the new partition(s) %s of its source topics too",
                self.config.index,
                ", ".join(added),
            )

    def _consumed_without_batch(self, epoch: _Epoch) -> _Epoch:
        """An epoch of dropped messages only (steps published again) appends nothing, but
        they no longer wait: the next batch's positions begin after them, and the lag shows
        them taken now, not when a request next comes."""
        for position, span in epoch.offsets.items():
            self._cursor.consumed(position, span[1], span[2:4])
        self._note_positions([self._topic_partition(p, span[1]) for p, span in epoch.offsets.items()])
        return _Epoch()

    def _topic_partition(self, position: int | str, offset: int) -> TopicPartition:
        """Where `position` (a request partition, or a source's "topic:partition") stands at `offset`."""
        if type(position) is str:
            return self._sources.topic_partition(position, offset)
        return TopicPartition(self.topics.requests, position, offset)

    def _position(self, message) -> int | str:
        """How the log names the partition `message` came from (log/records.py)."""
        if message.topic() == self.topics.requests:
            return message.partition()
        return self._sources.position(message)

    def _entry(self, message) -> tuple[bytes, tuple | None]:
        """The log entry of one request message, validated and checked for a duplicate
        id, with its placement (None for a rejected entry)."""
        if message.topic() == self.topics.requests:
            entry, sets = parse_request_sets(
                message.value(),
                message.key(),
                message.partition(),
                message.offset(),
                self.registry,
                self.config.max_request_bytes,
                self.config.ordering,
            )
        else:
            entry, sets = self._sources.entry(message, self.config.max_request_bytes, self.config.ordering)
        request_id, proc, args = entry
        placement = None
        if proc is not None:
            identity = request_identity(request_id, args)
            if identity in self._recent:
                if is_resequenced(request_id, identity):
                    return None, None  # a replayed re-sequencing of a dependent txn: already in the log
                entry = [request_id, None, f"duplicate request id '{request_id}'"]
            else:
                self._recent.add(identity)
                placement = SINGLE if self.config.partitions == 1 else placement_of(self._partitioner, *sets)
        self.stats.requests += 1
        if entry[1] is None:
            self.stats.rejected += 1
        return encode_entry(entry), placement

    def _add(self, epoch: _Epoch, message) -> _Epoch:
        encoded, placement = self._entry(message)
        if encoded is None:
            return self._skip(epoch, message)
        size = bin_size(encoded) + item_bytes(placement)
        if epoch.entries and epoch.size + size > self._entries_limit:
            epoch = self._cut(epoch)  # full by size: what it holds goes out first
        if not epoch.entries:
            epoch.opened = self._opening(time.monotonic())
        epoch.entries.append(encoded)
        epoch.placements.append(placement)
        epoch.size += size
        return self._taken(epoch, message)

    def _skip(self, epoch: _Epoch, message) -> _Epoch:
        """A dropped message still counts as consumed once the epoch holding it is cut (or at once,
        when the epoch holds nothing else: `_consumed_without_batch`)."""
        return self._taken(epoch, message)

    def _taken(self, epoch: _Epoch, message) -> _Epoch:
        """`epoch` consumes the partition of `message` up to it."""
        position, offset = self._position(message), message.offset()
        span = epoch.offsets.get(position)
        if span is None:
            start = self._cursor.consumed_to(position)
            epoch.offsets[position] = [offset if start is None else start, offset + 1]
            if type(position) is str:  # of the incarnation of its topic it was read from
                epoch.offsets[position] += self._cursor.source_ids.get(position, [])
        else:
            span[1] = offset + 1
        return epoch

    def _opening(self, now: float) -> float:
        """When an epoch whose first request is taken `now` counts as opened: Calvin's epochs
        are a cadence, not a wait after each append. A request that came while the last batch
        was being appended has been waiting since that append began, so its epoch ends one
        epoch length after that (never sooner: batches stay at most one per epoch length,
        unless full), and never later than one epoch length from now."""
        return max(self._last_cut_at, now - self._epochs.seconds())

    def _due(self, epoch: _Epoch, now: float) -> bool:
        """Whether `epoch` is cut now: at its epoch's end, or at once with group commit (the
        loop gets here after the last append returned, with every request that came
        meanwhile)."""
        return bool(epoch.entries) and now >= epoch.opened + self._epochs.seconds()

    def _cut(self, epoch: _Epoch) -> _Epoch:
        self._check_sources(epoch)
        self._check_cluster()  # the watches' latest answers: no request to the broker here
        self._await_watch(self._confirm_through)  # never more than one append ahead of the watch
        self._last_cut_at = time.monotonic()
        self._epochs.taken(len(epoch.entries), self._last_cut_at)
        self._last_time = max(self._last_time, int(time.time() * 1000))
        number = self.next_epoch
        record = encode_batch(
            number,
            self._started_at,
            self._last_time,
            {p: tuple(span) for p, span in epoch.offsets.items()},
            epoch.entries,
            # An aria batch's homes run RUN on whole read sets: no routing (scheduler/batch.py).
            None if self.config.ordering else build_routing(self.config.partitions, epoch.placements),
            self._cursor.log_id,
            self.config.index,
            self.config.ordering,
            self._set_id,
            namespace=self.topics.namespace,
        )
        positions = [self._topic_partition(p, span[1]) for p, span in epoch.offsets.items()]
        accepted = self._accepted + sum(placement is not None for placement in epoch.placements)
        self._append([record], positions)
        at = self._log_end - 1
        if number % SNAPSHOT_EVERY == 0:
            # Only of a batch every reader accepts: the watch has read up to it, the lane still ours.
            self._await_watch(self._log_end)
            after = LogCursor.from_dict(self._own_cursor(), self.topics.namespace)
            after.next_batch += 1
            after.lanes[self.config.index][1] += 1
            for position, span in epoch.offsets.items():
                after.consumed(position, span[1], span[2:4])
            self._append([self._snapshot(after.to_dict(), accepted)], [])
        if log.isEnabledFor(logging.DEBUG):
            rejected = sum(placement is None for placement in epoch.placements)
            log.debug(
                "batch %d: %d requests (%d rejected) from %s appended to %s, ending at offset %d",
                number,
                len(epoch.entries),
                rejected,
                _spans(epoch.offsets),
                self.topics.log,
                self._log_end,
            )
        self._cursor.lanes[self.config.index][1] += 1
        self._cursor.next_batch += 1
        for position, span in epoch.offsets.items():
            self._cursor.consumed(position, span[1], span[2:4])
        self._accepted = accepted
        self._keep(at)
        self.stats.batches += 1
        self.stats.sequenced += len(epoch.entries)
        return _Epoch()

    def _check_sources(self, epoch: _Epoch) -> None:
        """The source topics this epoch read from still have the topic ids their partitions
        are bound to, asked after every record of theirs in it was read: a consumer goes on
        reading a topic deleted and created again at the offset it stood at, so records of
        the new topic would otherwise enter the log as the old one's. Where one has another
        id, the sequencer stops without appending the epoch, and its restart reads the new
        topic from its beginning (sequencer/sources.py `bind`)."""
        topics = {position.rpartition(":")[0] for position in epoch.offsets if type(position) is str}
        if topics and self._cursor.source_ids:
            reason = self._sources.recreated(topics, APPEND_DEADLINE)
            if reason is not None:
                raise SourceRecreated(reason)

    def _append(self, records: list[bytes], positions: list[TopicPartition], timeout: float = APPEND_DEADLINE) -> None:
        """Append records (a batch and perhaps a snapshot, or a snapshot or a start record
        alone) and wait until the broker has them, then note the request positions they
        consume. The producer retries what the broker did not take (a broker away and
        back), and the broker keeps each record once; a record still not taken after
        APPEND_DEADLINE stops the sequencer in one line."""
        producer = self._producer
        self._append_error = None
        before = self._log_end
        for record in records:
            producer.produce(self.topics.log, value=record, partition=0, on_delivery=self._delivered)
        waiting = producer.flush(timeout)
        if self._append_error is not None or waiting:
            raise BrokerLost(self._cannot_append(self._append_error))
        self._confirm_through = before
        if positions:
            self._note_positions_soon(positions)

    def _note_positions_soon(self, positions: list[TopicPartition]) -> None:
        """Note consumed positions at most every NOTE_EVERY seconds (the newest of each partition)."""
        for position in positions:
            self._positions[(position.topic, position.partition)] = position
        now = time.monotonic()
        if now - self._noted_at >= NOTE_EVERY:
            self._noted_at = now
            self._note_positions(list(self._positions.values()))
            self._positions.clear()

    def _note_consumed(self, stopped: bool = False) -> None:
        """Note where this sequencer stands on its request partitions (what the log says it
        consumed), also when it has nothing to append: the positions a killed predecessor
        was about to note, or anyone else noted, would otherwise stand as waiting requests
        until the next batch."""
        offsets = self._cursor.request_offsets
        # Every owned partition, one never consumed at 0 (what the lag counts from anyway):
        # the positions carry this sequencer's note of who takes them (lane_owner.py).
        self._note_positions(
            [TopicPartition(self.topics.requests, p, offsets.get(p, 0)) for p in self._owned]
            + self._sources.noted(self._cursor),
            stopped,
        )

    def _note_positions(self, positions: list[TopicPartition], stopped: bool = False) -> None:
        if not positions:
            return
        noted = note(self.owner, stopped)
        try:
            self._consumer.commit(
                offsets=[
                    TopicPartition(position.topic, position.partition, position.offset, metadata=noted)
                    for position in positions
                ],
                asynchronous=True,
            )  # a stopping one's last goes out as its consumer closes
        except KafkaException:
            pass  # a display figure: the next batch's commit carries the positions on

    def _cannot_append(self, error: KafkaError | None) -> str:
        what = f"cannot append batch {self.next_epoch} of sequencer {self.config.index} to {self.topics.log}"
        if error is None or error.code() in UNANSWERED or error.code() == KafkaError._MSG_TIMED_OUT:
            return (
                f"{what} within {APPEND_DEADLINE:.0f} s ({error.str() if error else 'no acknowledgement'}): the "
                f"broker does not answer; start it again (on its data directory, it keeps the log) and restart Ordo"
            )
        return (
            f"{what} ({error.str()}): the broker may have been restarted without its data; see "
            f"docs/operations.md, 'Broker lost'"
        )

    def _delivered(self, error, message) -> None:
        if error is not None:
            self._append_error = error
        elif message.offset() + 1 > self._log_end:
            self._log_end = message.offset() + 1
            self._last_appended = (message.offset(), fingerprint(message.value()))

    def _watch(self) -> None:
        """When idle, note the consumed positions again (see _note_consumed), and check
        that the broker still holds the last record this sequencer appended: a broker
        restarted without its data would otherwise have it sequence into a new, unrelated
        log without a word. The broker is asked in the watch's own
        thread; here its latest answer is only read."""
        now = time.monotonic()
        if now - self._watched < WATCH_EVERY:
            return
        self._watched = now
        self._note_consumed()
        self._check_cluster()
        self._check_lane()
        if self._last_appended is None or self._probe is None:
            return
        self._probe.note(*self._last_appended)
        if self._probe.lost is not None:
            raise BrokerLost(
                f"{self.topics.log} no longer holds the record this sequencer appended at offset "
                f"{self._probe.lost}: the broker lost the log (restarted without its data?); see "
                f"docs/operations.md, 'Broker lost'"
            )

    def _check_cluster(self) -> None:
        """Stop at once if another Kafka cluster answers for the log: appending there would
        start a new, unrelated log without a word."""
        lost_cluster = self._probe.lost_cluster() if self._probe is not None else None
        if lost_cluster is not None:
            raise BrokerLost(lost_cluster)

    def _await_watch(self, end: int) -> None:
        """Wait until the takeover watch has read the log up to offset `end`, then stop if
        the lane moved on: what bounds a superseded sequencer's appends (sequencer/takeover.py)."""
        watch = self._takeover
        if watch is not None and not watch.read_through(end, APPEND_DEADLINE):
            raise BrokerLost(
                f"{self.topics.log} could not be read back up to offset {end} within {APPEND_DEADLINE:.0f} s, so "
                f"this sequencer cannot tell whether another took its lane over: the broker does not serve the "
                f"log; start it again (on its data directory, it keeps the log) and restart Ordo"
            )
        self._check_lane()

    def _check_settled(self) -> None:
        """Call the lane settled once the takeover watch has read the log, as far as it
        reached SETTLE_S after this sequencer's start, and found the lane still its own."""
        if time.monotonic() < self._settle_at:
            return
        if self._settle_end is None:
            try:
                _, self._settle_end = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topics.log, 0), timeout=5, cached=False
                )
            except KafkaException:  # the broker is between leaders: asked again on the next turn
                return
        watch = self._takeover
        if watch is not None and watch.read_through(self._settle_end, 0) and watch.moved_on() is None:
            self.settled.set()

    def _check_lane(self) -> None:
        """Stop once the log has moved this lane on without this sequencer: its batches
        would be dropped by every reader from there on."""
        if self._takeover is not None and self._takeover.moved_on() is not None:
            raise _MovedOn()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._probe is not None:
            self._probe.close()
            self._probe = None
        if self._takeover is not None:
            self._takeover.close()
            self._takeover = None
        if self._ends is not None:
            self._ends.close()
            self._ends = None
        self._producer.flush(5)
