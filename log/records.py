"""The log: the total order of requests, one Kafka partition of msgpack records.

One or more sequencers write it (`--sequencers S`): sequencer k of S consumes the request
partitions p with p % S == k, cuts its own epochs and appends them, each with its own
idempotent producer. The broker interleaves their appends on the single log partition,
and that interleaving, as the log holds it, is the merged order: every reader follows
the same records in the same order, so it numbers the accepted batches 1, 2, 3, … alike.
(Calvin merges per-sequencer logs round-robin by epoch, which needs every sequencer to
emit an epoch, empty or not, every few milliseconds; one shared log partition orders the
batches without that traffic and without a reader waiting on the slowest sequencer.)

Record kinds:
    start:  [START, token, procedures, sequencer, sequencers]
        written by sequencer k of S when it takes over lane k; it opens a generation of
        that lane, named by the record's own log offset. The log's first start record's
        token is the log's identity (`log_id`). `procedures` describes the procedure set
        the sequencer validates with (`procedures.registry.Registry.describe`), so an
        engine can refuse a log it would interpret differently. A start record whose S
        differs from the one before closes every lane: the sequencers were reconfigured,
        and only those that start under the new S are followed (a batch of a closed lane
        counts as stale). A start record is sealed for the log it continues; the log's
        first for "first" (`record_context`).
    batch:  [BATCH, epoch, generation, time_ms, offsets, routing, log_id, sequencer, (ordering,) (procedure set,)
             entry, ...]
        an epoch of sequencer `sequencer`, numbered 1, 2, 3, … per lane across its
        generations; `generation` is the offset of the start record of the sequencer that
        wrote it; `offsets` maps request partition -> [start, end) consumed; each entry is
        the msgpack encoding of [id, proc, args] or [id, None, error] (rejected), kept as
        a bin so a reader decodes only the entries it needs; `routing` is None or
        [partitions, slices]: for the partition count the sequencer was told, slices[p]
        (a bin) lists what partition p takes part in, each item either an entry index (a
        single-partition or rejected entry that p alone handles) or [index, participants,
        active, …] (a multi-partition one, with the keys p needs for it);
        see `sequencer/routing.py`; a source topic's partition (sequencer/sources.py)
        is keyed in `offsets` by its name, "topic:partition", a string, where a request
        partition is keyed by its number, and its range is followed by the incarnation
        of the topic it was read from, [start, end, n, topic id] (absent in logs written
        before topic ids were kept); `log_id` names the log the batch belongs to;
        `ordering`, present only where the batch is not in log order, is a string (never
        a bin like the entries): ARIA for a batch whose serial order Aria's rule decides
        (scheduler/aria.py), which every engine and replay then runs with aria;
        `procedure set`, an integer, is the identity of the procedure set the sequencer
        validated the entries with (`procedures.fingerprint.set_id`): an engine runs the
        batch only with that set (absent in logs written before sets were versioned).
    upgrade: [UPGRADE, procedures, version, log_id]
        written by `ordo upgrade` (never by a sequencer): from the next batch on, the log
        runs procedure set `procedures` (described as in a start record), its `version`-th.
        It closes every lane, as a change of S does: only sequencers started after it, with
        that set, are followed. A sequencer whose set is not the log's current one refuses
        to start (log/versions.py), so the set changes only here.
    snapshot: [SNAPSHOT, cursor, accepted, time_ms, sequencer, sequencers]
        a sequencer's own state right after the record before it (a cursor as
        `LogCursor.to_dict` gives it, holding its own lane only, the number of entries it
        accepted so far, the batch time), appended after every SNAPSHOT_EVERY-th batch by
        the same producer, in order (no record of its lane between), and once after a
        sequencer's start-up: a restarting sequencer reads the log from a recent snapshot
        of its lane, not from its head. Every other reader skips it.
    skip:   [SKIP, offset, log_id]
        written by `ordo log skip --offset N` (never by a sequencer): every reader passes
        over the record at `offset` of log `log_id` instead of stopping there. A reader
        looks for one only when a record would stop it (`LogReader.accept`), and the command
        writes one only for such a record, so no reader has gone past that record any
        other way: the skip changes nothing a reader already did, and every replay agrees.

Every record ends with an HMAC tag under the namespace's log secret (log/secret.py),
which sequencers and engines share and clients do not. The tag covers where the record
belongs as well as its body (`record_context`): the namespace and the log's identity (a
log's first start record, which names it, is bound to the namespace and to "first"), and
the body holds the record's place in the log (a batch's lane, generation and epoch, a
snapshot's lane, generation and next epoch, a skip's offset). A reader drops a record
whose tag does not check, whatever it holds, and counts and reports it with its offset: a
client that can write to the log can neither inject a batch (its forgery is dropped, and
the sequencer's own batch of that epoch is accepted as usual) nor stop the readers with
one, nor bring a genuine record of another namespace or another log (a byte copy fails
like a forgery). A copy of a record of this log is where the body's place decides: a
batch out of place is a repeat or a stale batch, and a restarting sequencer seeds only
from a snapshot that sits right after the record of its lane it describes
(log/snapshots.py). The same tag is what lets each sequencer trust that the batch of
its lane at an epoch is its own: no other writer can make a record that a reader accepts,
so no conflicting batch can exist.

Every reader applies the same acceptance rule (`LogCursor.accept`), so the log means one
thing to the sequencers, the engine and a replay, whatever the broker does: a batch is
accepted only if it carries its lane's current generation and the lane's next epoch. The
late batches of a superseded sequencer (appended before it read the start record that took
its lane over), a repeat (a retried append, should a broker keep it twice), and the
records of an aborted transaction in a log written by a release that appended in
transactions, should a broker deliver them, are therefore either consistently accepted by
every reader or consistently ignored.

A log is recognised by its identity, kept in every batch and in every cursor (so in every
applied marker and checkpoint): a reader refuses a genuine batch of another log of its
namespace (`LogMismatch`), which is what a broker restarted without its data presents,
and a log whose first record is not a start record (its head deleted by retention) is
refused too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ordo.log.secret import TAG_BYTES, seal, unseal, unseal_before_places
from ordo.procedures.contract import ARIA as ARIA  # a batch ordering the log stamps; named where procedures need it

START = 0
BATCH = 1
SNAPSHOT = 2
SKIP = 3
UPGRADE = 4
_ARRAY32 = struct.Struct(">BI")


class LogError(RuntimeError):
    """The log cannot be followed: a batch is missing or a record is unreadable."""


class Unauthenticated(LogError):
    """A record without a valid tag under the log secret: no sequencer wrote it."""


class LogMismatch(LogError):
    """The log is not the one this reader followed before: the broker lost it, or the
    topic was deleted and made again."""


class SecretMismatch(LogError):
    """The log holds records, and none is signed with this process's log secret for this
    namespace: the secret is not the one the log was written with."""


# Batches of an older generation of a lane that continued its sequence after a newer start
# record of that lane, with no batch of the newer generation yet: a superseded sequencer
# leaves at most STALE_APPENDS of them (sequencer/takeover.py), so more than this means the
# start record did not come from a sequencer that went on to write (a foreign or forged record).
STALE_LIMIT = 4

# Start tokens a cursor remembers (LogCursor.starts): a copy of any of the latest this many
# start records is passed over; a copy of an older one is a stale lane, counted and said.
# Of each token its first 16 characters are kept (64 random bits of a sequencer's): the
# cursor travels with every applied batch.
START_MEMORY = 32
START_TOKEN_CHARS = 16


def record_context(namespace: str, log_id: str | None) -> bytes:
    """What every record's tag covers besides its body: the namespace and the log the
    record belongs to (None: "first", the log's first start record, which gives the log
    its identity). Every record kind is sealed and checked through this one function."""
    return msgpack.packb([namespace, "first" if log_id is None else ["log", log_id]])


def encode_start(
    namespace: str,
    log_id: str | None,
    token: str,
    procedures: dict | None = None,
    sequencer: int = 0,
    sequencers: int = 1,
    code: bytes | None = None,
) -> bytes:
    """`log_id` None: the log's first start record, whose token becomes the log's identity.
    `code`: the set's code, packed (procedures/kept.py)."""
    body = [START, token, procedures, sequencer, sequencers] + ([code] if code else [])
    return seal(msgpack.packb(body), record_context(namespace, log_id))


SNAPSHOT_EVERY = 100


def encode_snapshot(
    namespace: str, cursor: dict, accepted: int, time_ms: int, sequencer: int = 0, sequencers: int = 1
) -> bytes:
    return seal(
        msgpack.packb([SNAPSHOT, cursor, accepted, time_ms, sequencer, sequencers]),
        record_context(namespace, cursor["log_id"]),
    )


def encode_skip(namespace: str, offset: int, log_id: str | None) -> bytes:
    return seal(msgpack.packb([SKIP, offset, log_id]), record_context(namespace, log_id))


def encode_upgrade(namespace: str, procedures: dict, version: int, log_id: str, code: bytes | None = None) -> bytes:
    body = [UPGRADE, procedures, version, log_id] + ([code] if code else [])
    return seal(msgpack.packb(body), record_context(namespace, log_id))


def is_batch_record(value: bytes) -> bool:
    """Batch records start with a 32-bit array header (see encode_batch); a reader that
    looks only for start and snapshot records skips them undecoded."""
    return value[:1] == b"\xdd"


def encode_entry(entry: list) -> bytes:
    return msgpack.packb(entry)


def encode_batch(
    epoch: int,
    generation: int,
    time_ms: int,
    offsets: dict[int, tuple[int, int]],
    encoded_entries: list[bytes],
    routing: list | None = None,
    log_id: str | None = None,
    sequencer: int = 0,
    ordering: str | None = None,
    procedures: int | None = None,
    *,
    namespace: str,
) -> bytes:
    """Entries are encoded one by one as they arrive (so an epoch's size is known exactly
    before it is cut) and concatenated here, each as a bin, under one array header."""
    head = [BATCH, epoch, generation, time_ms, {p: list(r) for p, r in offsets.items()}, routing, log_id, sequencer]
    if ordering is not None:
        head.append(ordering)
    if procedures is not None:
        head.append(procedures)
    return seal(
        _ARRAY32.pack(0xDD, len(head) + len(encoded_entries))
        + b"".join(msgpack.packb(item) for item in head)
        + b"".join(map(_bin, encoded_entries)),
        record_context(namespace, log_id),
    )


def _bin(data: bytes) -> bytes:
    n = len(data)
    if n < 256:
        return b"\xc4" + bytes((n,)) + data
    if n < 65536:
        return b"\xc5" + n.to_bytes(2, "big") + data
    return b"\xc6" + n.to_bytes(4, "big") + data


def bin_size(encoded_entry: bytes) -> int:
    """Bytes an encoded entry takes in a batch record."""
    n = len(encoded_entry)
    return n + (2 if n < 256 else 3 if n < 65536 else 5)


BATCH_OVERHEAD = 288  # bytes of a batch record beyond its entries and routing (its tag: 32), with room to spare


class Batch:
    """One batch. Entries stay encoded until asked for: a partition worker decodes only
    those of its slice. `batch_id` is its place in the merged order, given by the reader
    that accepts it (until then, its epoch)."""

    __slots__ = (
        "batch_id",
        "generation",
        "time_ms",
        "offsets",
        "routing",
        "log_id",
        "log_offset",
        "sequencer",
        "epoch",
        "ordering",
        "procedures",
        "_raw",
        "_entries",
    )

    def __init__(
        self,
        batch_id: int,
        generation: int,
        time_ms: int,
        offsets: dict[int, list[int]],
        entries: list[list] | None = None,
        *,
        raw: list[bytes] | None = None,
        routing: list | None = None,
        log_id: str | None = None,
        log_offset: int = -1,
        sequencer: int = 0,
        epoch: int | None = None,
        ordering: str | None = None,
        procedures: int | None = None,
    ):
        self.batch_id = batch_id
        self.ordering = ordering  # None: log order
        self.procedures = procedures  # the procedure set's identity; None in logs from before versions
        self.epoch = batch_id if epoch is None else epoch
        self.sequencer = sequencer
        self.log_id = log_id
        self.generation = generation
        self.time_ms = time_ms
        self.offsets = offsets
        self.routing = routing
        self.log_offset = log_offset
        self._raw = raw
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries if self._entries is not None else self._raw)

    @property
    def entries(self) -> list[list]:
        """Every entry, decoded."""
        if self._entries is None:
            self._entries = [_unpack(raw) for raw in self._raw]
        return self._entries

    def entry(self, index: int) -> list:
        if self._entries is not None:
            return self._entries[index]
        return _unpack(self._raw[index])

    def __getstate__(self):
        return (
            self.batch_id,
            self.generation,
            self.time_ms,
            self.offsets,
            self.routing,
            self.log_id,
            self.log_offset,
            self.sequencer,
            self.epoch,
            self.ordering,
            self.procedures,
            self._raw,
            self._entries if self._raw is None else None,
        )

    def __setstate__(self, state) -> None:
        (
            self.batch_id,
            self.generation,
            self.time_ms,
            self.offsets,
            self.routing,
            self.log_id,
            self.log_offset,
            self.sequencer,
            self.epoch,
            self.ordering,
            self.procedures,
            self._raw,
            self._entries,
        ) = state

    def __repr__(self) -> str:
        ordering = "" if self.ordering is None else f", {self.ordering} ordering"
        return (
            f"Batch({self.batch_id}, sequencer {self.sequencer} epoch {self.epoch}, generation "
            f"{self.generation}, {len(self)} entries{ordering})"
        )


@dataclass(frozen=True, slots=True)
class Start:
    token: str
    procedures: dict | None
    sequencer: int = 0
    sequencers: int = 1
    code: bytes | None = None  # the set's code, packed (procedures/kept.py)


@dataclass(frozen=True, slots=True)
class Snapshot:
    cursor: "LogCursor"
    accepted: int
    time_ms: int
    sequencer: int = 0
    sequencers: int = 1


@dataclass(frozen=True, slots=True)
class Skip:
    offset: int
    log_id: str | None


@dataclass(frozen=True, slots=True)
class Upgrade:
    procedures: dict
    version: int
    log_id: str | None
    code: bytes | None = None


def _unpack(raw: bytes) -> list:
    return msgpack.unpackb(raw, strict_map_key=False, use_list=True)


def decode(value: bytes, namespace: str, log_id: str | None) -> tuple[int, Any]:
    """A record's kind and content, for a reader of `namespace`'s log `log_id` (None: one
    that has not met the log's first start record yet); Unauthenticated if its tag does
    not check there, LogError if it cannot be read."""
    body = unseal(value, record_context(namespace, log_id))
    if body is None:
        raise Unauthenticated(f"not signed with this namespace's log secret for {_where(log_id)}")
    return _parse(body, namespace)


def decode_before_places(value: bytes, namespace: str) -> tuple[int, Any]:
    """`decode` for a record of a log written before tags covered where a record belongs
    (its tag covers its body alone); Unauthenticated if that tag does not check either."""
    body = unseal_before_places(value)
    if body is None:
        raise Unauthenticated("not signed with this namespace's log secret")
    return _parse(body, namespace)


def _parse(body, namespace: str) -> tuple[int, Any]:
    try:
        record = msgpack.unpackb(body, strict_map_key=False, use_list=True)
        kind = record[0]
        if kind == START:
            if type(record[1]) is not str:
                raise ValueError("a start record's token must be a string")
            sequencer, sequencers = record[3:5] if len(record) >= 5 else (0, 1)
            if not (type(sequencer) is int and type(sequencers) is int and 0 <= sequencer < sequencers):
                raise ValueError("a start record's sequencer must be k of S, 0 <= k < S")
            code = record[5] if len(record) > 5 and type(record[5]) is bytes else None
            return START, Start(record[1], record[2] if len(record) > 2 else None, sequencer, sequencers, code)
        if kind == SNAPSHOT:
            return SNAPSHOT, Snapshot(
                LogCursor.from_dict(record[1], namespace),
                record[2],
                record[3],
                *(record[4:6] if len(record) >= 6 else (0, 1)),
            )
        if kind == BATCH:
            at = 8
            ordering = record[at] if len(record) > at and type(record[at]) is str else None
            at += ordering is not None
            procedures = record[at] if len(record) > at and type(record[at]) is int else None
            at += procedures is not None
            raw = record[at:]
            if type(record[7]) is not int:
                raise ValueError("a batch's sequencer must be an index")
            if any(type(item) is not bytes for item in raw):
                raise ValueError("batch entries must be encoded entries")
            return BATCH, Batch(
                record[1],
                record[2],
                record[3],
                record[4],
                raw=raw,
                routing=record[5],
                log_id=record[6],
                sequencer=record[7],
                ordering=ordering,
                procedures=procedures,
            )
        if kind == SKIP:
            if type(record[1]) is not int:
                raise ValueError("a skip record's offset must be an integer")
            return SKIP, Skip(record[1], record[2])
        if kind == UPGRADE:
            if type(record[1]) is not dict or type(record[2]) is not int or record[2] < 1:
                raise ValueError("an upgrade record holds a procedure set and its version number")
            code = record[4] if len(record) > 4 and type(record[4]) is bytes else None
            return UPGRADE, Upgrade(record[1], record[2], record[3], code)
    except Exception as exc:
        raise LogError(f"unreadable log record: {exc}") from exc
    raise LogError(f"unknown log record kind {kind!r}")


def _where(log_id: str | None) -> str:
    return "the start of a log" if log_id is None else f"log {log_id}"


def batch_head(value: bytes) -> list | None:
    """A batch record's head as it claims, unchecked: [BATCH, epoch, generation, time_ms,
    offsets, routing, log_id, sequencer]; None if it is no batch record. Only to pick which
    records to check in full."""
    if not is_batch_record(value) or len(value) <= TAG_BYTES:
        return None
    try:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(memoryview(value)[_ARRAY32.size : -TAG_BYTES])
        return [unpacker.unpack() for _ in range(8)]
    except Exception:
        return None


def batch_of_log(value: bytes, namespace: str) -> str | None:
    """The log a batch record that failed its check belongs to, where it is a genuine batch
    of another log of this namespace (what a broker that lost the log presents), else None
    (a forgery, or a copy from another namespace)."""
    head = batch_head(value)
    log_id = head[6] if head is not None else None
    if type(log_id) is not str or unseal(value, record_context(namespace, log_id)) is None:
        return None
    return log_id


@dataclass(slots=True)
class LogCursor:
    """How far a reader has followed the log. Persisted with applied state, so a restart
    continues exactly where the last applied batch left off."""

    next_batch: int = 1  # the id the next accepted batch gets, counting every lane
    generation: int = 0  # start records seen: for messages only, acceptance goes by `lanes`
    next_offset: int = 0  # next Kafka offset of the log partition to read
    request_offsets: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    # "topic:partition" of a source topic -> next offset (sequencer/sources.py)
    source_offsets: dict[str, int] = field(default_factory=dict)
    log_id: str | None = None  # the first start record's token
    # sequencer -> [offset of its current start record, its next epoch]
    lanes: dict[int, list[int]] = field(default_factory=dict)
    sequencers: int = 1  # S of the latest start record
    time_ms: int = 0  # the latest accepted batch's time: batch times never go back
    # The procedure set the log runs from here on: [version, identity, offset of the start or
    # upgrade record that named it, whether it covers code] (procedures/fingerprint.py), None
    # before the first.
    procedures: list | None = None
    # Whether a record sealed in its place was met: before it, a log written before tags
    # covered places is read as it was sealed then (`_before_places`).
    placed: bool = False
    # The tokens of the latest START_MEMORY start records accepted, oldest first: a start
    # record opens a generation once, so one whose token is among them is a copy.
    starts: list[str] = field(default_factory=list)
    # "topic:partition" of a source topic -> [incarnation, topic id] its offsets belong to
    # (sequencer/sources.py); none for a position from before topic ids were kept.
    source_ids: dict[str, list] = field(default_factory=dict)
    # Not persisted: what the reader saw since it started.
    stale_by_lane: dict[int, int] = field(default_factory=dict, compare=False)  # see STALE_LIMIT
    started: Start | None = field(default=None, compare=False)  # the latest start record
    upgraded: Upgrade | None = field(default=None, compare=False)  # the latest upgrade record
    versions: dict[int, int] = field(default_factory=dict, compare=False)  # procedure set -> version, as read
    # procedure set -> the offset of the newest record that named it, as read (its code is kept there)
    named_at: dict[int, int] = field(default_factory=dict, compare=False)
    foreign: int = field(default=0, compare=False)  # unreadable records skipped
    # Records dropped or skipped since the reader started, as (offset, why), for the reader
    # to report; `dropped` counts them all.
    dropped: int = field(default=0, compare=False)
    unreported: list[tuple[int, str]] = field(default_factory=list, compare=False)
    # Records in a row, up to the newest, that verify under none of this process's secrets.
    unverified: int = field(default=0, compare=False)
    # A restarting sequencer seeded from its own snapshot follows its own lane only.
    only: int | None = field(default=None, compare=False)
    # The namespace whose log this is: every record's tag is checked for it (record_context).
    namespace: str = field(default="", compare=False)

    @property
    def stale(self) -> int:
        return max(self.stale_by_lane.values(), default=0)

    def accept(self, value: bytes, offset: int) -> Batch | None:
        """Advance past the record at `offset`; return it if it is the next batch."""
        self.next_offset = offset + 1
        try:
            kind, record = decode(value, self.namespace, self.log_id)
            self.placed = True
        except Unauthenticated as exc:
            kind, record = self._before_places(value, offset, exc)
            if kind is None:
                return None
        except LogError as exc:
            self._foreign(offset, exc)
            return None
        self.unverified = 0
        if kind in (SNAPSHOT, SKIP):  # a skip took effect when a reader met the record it names
            return None
        if kind == START:
            self._start(record, offset)
            return None
        if kind == UPGRADE:
            self._upgrade(record, offset)
            return None
        return self._batch(record, offset)

    def _before_places(self, value: bytes, offset: int, unplaced: Unauthenticated) -> tuple:
        """A record that does not verify in its place: in a log written before tags covered
        where a record belongs, its records as they were sealed then, up to the log's first
        record sealed in place (after it, such a record can only be a copy); else passed
        over, like a forgery. (None, None) for a record passed over."""
        if not self.placed:
            try:
                kind, record = decode_before_places(value, self.namespace)
            except Unauthenticated:
                pass
            except LogError as exc:
                self._foreign(offset, exc)
                return None, None
            else:
                if kind != BATCH or record.log_id == self.log_id:
                    return kind, record
                unplaced = Unauthenticated(f"a batch of log {record.log_id}, not of log {self.log_id}")
        self._refuse_other_log(value, offset)
        self.unverified += 1
        self._drop(offset, str(unplaced))
        return None, None

    def skip(self, offset: int) -> None:
        """Pass over the record at `offset`, which a skip record names."""
        self.next_offset = offset + 1
        self._drop(offset, "a skip record (`ordo log skip`) names it")

    def _refuse_other_log(self, value: bytes, offset: int) -> None:
        """Stop at a genuine batch of another log of this namespace: the log this reader
        followed is gone, or its head is."""
        log_id = batch_of_log(value, self.namespace)
        if log_id is None or log_id == self.log_id:
            return
        if self.log_id is None:
            raise LogError(
                f"the log does not begin with a sequencer's start record (a batch of log {log_id} at offset "
                f"{offset} comes first): its head was deleted, typically by topic retention"
            )
        raise LogMismatch(
            f"the batch at offset {offset} belongs to log {log_id}, not to log {self.log_id} that this reader "
            f"followed: the broker lost the log (restarted without its data?) or the topic was made again; if "
            f"this record alone is out of place and the log goes on after it, pass over it with `ordo log skip "
            f"--offset {offset}` (docs/operations.md, 'A record that stops the log')"
        )

    def _foreign(self, offset: int, exc: LogError) -> None:
        # No sequencer writes such a record, so it is no batch: every reader skips it
        # alike. A damaged batch is not lost silently: the next one shows a gap.
        self.foreign += 1
        self._drop(offset, str(exc))

    def _drop(self, offset: int, why: str) -> None:
        self.dropped += 1
        self.unreported.append((offset, why))

    def _start(self, start: Start, offset: int) -> None:
        token = start.token[:START_TOKEN_CHARS]
        if token in self.starts:
            self._drop(
                offset,
                f"a copy of an earlier start record of sequencer {start.sequencer} of "
                f"{start.sequencers} (a start record opens its generation once)",
            )
            return
        self.starts.append(token)
        del self.starts[:-START_MEMORY]
        if self.log_id is None and self.generation == 0:
            self.log_id = start.token
        self.generation += 1
        self.started = start
        if start.procedures is not None:
            self._name_procedures(start.procedures, offset)
        if self.only is not None and start.sequencer != self.only:
            return
        if start.sequencers != self.sequencers:
            self.lanes.clear()  # reconfigured: only sequencers started under the new S count
            self.stale_by_lane.clear()
            self.sequencers = start.sequencers
        lane = self.lanes.get(start.sequencer)
        self.lanes[start.sequencer] = [offset, lane[1] if lane else 1]

    def _upgrade(self, upgrade: Upgrade, offset: int) -> None:
        current = self.procedures
        if current is not None and upgrade.version != current[0] + 1:
            # Versions follow one another: an upgrade to any other is a copy of an earlier one.
            self._drop(
                offset,
                f"an upgrade record to procedure set v{upgrade.version} where the log runs "
                f"v{current[0]}: a copy, out of place",
            )
            return
        self.upgraded = upgrade
        self.lanes.clear()  # the sequencers of the set before go: only those started after it count
        self.stale_by_lane.clear()
        self._name_procedures(upgrade.procedures, offset, upgrade.version)

    def _name_procedures(self, described: dict, offset: int, version: int | None = None) -> None:
        """The set a start record (`version` None) or an upgrade names from here on. In a
        versioned log only an upgrade changes the set: a start record of another set is a
        stray or a copy, and its batches name their own set anyway."""
        from ordo.procedures.fingerprint import is_versioned, set_id

        identity, versioned = set_id(described), is_versioned(described)
        current = self.procedures
        if current is None:
            self.procedures = [version or 1, identity, offset, versioned]
        elif current[1] != identity and (version is not None or not (versioned and current[3])):
            self.procedures = [version or current[0] + 1, identity, offset, versioned]
        self.versions.setdefault(identity, self.procedures[0])
        self.named_at[identity] = offset

    def _batch(self, batch: Batch, offset: int) -> Batch | None:
        lane = self.lanes.get(batch.sequencer)
        if lane is None or batch.generation != lane[0] or batch.epoch < lane[1]:
            # Stale: a batch of a generation a later start record of its lane ended, or of a
            # lane that a start record of another sequencer count closed (a stray sequencer
            # of the earlier count, or a copied start record), unless this reader follows
            # one lane only.
            closed = lane is None and self.only is None
            if closed or (lane is not None and batch.generation < lane[0] and batch.epoch >= lane[1]):
                self.stale_by_lane[batch.sequencer] = self.stale_by_lane.get(batch.sequencer, 0) + 1
            return None  # a superseded sequencer's batch, or a repeat
        if batch.epoch > lane[1]:
            raise LogError(
                f"log gap: expected batch {lane[1]} of sequencer {batch.sequencer}, found batch {batch.epoch} "
                f"at offset {offset}; to pass over that record: `ordo log skip --offset {offset}` "
                f"(docs/operations.md, 'A record that stops the log')"
            )
        named = self.procedures
        if named is not None and named[3] and batch.procedures is not None and batch.procedures != named[1]:
            # A sequencer that started as an upgrade landed: its lane opened after the upgrade,
            # but its set is the one the log moved away from (it stops itself on reading that).
            from ordo.procedures.fingerprint import short

            self._drop(
                offset,
                f"a batch of procedure set {short(batch.procedures)}, after the log moved to v{named[0]} "
                f"({short(named[1])}) at offset {named[2]}: a sequencer of the set before started as it moved",
            )
            return None
        self.stale_by_lane.pop(batch.sequencer, None)
        lane[1] += 1
        batch.batch_id = self.next_batch
        self.next_batch += 1
        for position, span in batch.offsets.items():
            self.consumed(position, span[1], span[2:4])
        if batch.time_ms < self.time_ms:
            batch.time_ms = self.time_ms
        self.time_ms = batch.time_ms
        batch.log_offset = offset
        return batch

    def consumed(self, position: int | str, end: int, incarnation=()) -> None:
        """Everything before `end` of a request partition (its number) or of a source
        topic's partition (its "topic:partition", of `incarnation` [n, topic id] where
        given) is in the log."""
        if type(position) is str:
            self.source_offsets[position] = end
            if incarnation:
                self.source_ids[position] = list(incarnation)
        else:
            self.request_offsets[int(position)] = end

    def consumed_to(self, position: int | str) -> int | None:
        """Where the log's records of `position` end (None: it holds none of them)."""
        return (self.source_offsets if type(position) is str else self.request_offsets).get(position)

    def to_dict(self) -> dict[str, Any]:
        # Only a log that reads source topics has source offsets: any other cursor is as before them.
        sources = {"source_offsets": dict(self.source_offsets)} if self.source_offsets else {}
        if self.source_ids:
            sources["source_ids"] = {key: list(value) for key, value in self.source_ids.items()}
        return {
            "next_batch": self.next_batch,
            "generation": self.generation,
            "next_offset": self.next_offset,
            "request_offsets": dict(self.request_offsets),
            "log_id": self.log_id,
            "lanes": {k: list(lane) for k, lane in self.lanes.items()},
            "sequencers": self.sequencers,
            "time_ms": self.time_ms,
            "procedures": self.procedures,
            "placed": self.placed,
            "starts": list(self.starts),
            **sources,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], namespace: str) -> "LogCursor":
        return cls(
            data["next_batch"],
            data["generation"],
            data["next_offset"],
            {int(p): o for p, o in data["request_offsets"].items()},
            dict(data.get("source_offsets", {})),
            data.get("log_id"),
            {int(k): list(lane) for k, lane in data.get("lanes", {}).items()},
            data.get("sequencers", 1),
            data.get("time_ms", 0),
            data.get("procedures"),
            namespace=namespace,
            placed=data.get("placed", False),
            starts=list(data.get("starts", [])),
            source_ids={key: list(value) for key, value in data.get("source_ids", {}).items()},
        )
