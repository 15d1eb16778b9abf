"""Aria (Lu et al., VLDB 2020) with deterministic reordering: batches whose serial order is
decided by what their transactions touched, not by their log positions.

A batch the sequencer stamped with the aria ordering (`log.records.ARIA`) runs in three
steps, on every engine whatever its --scheduler (scheduler/worker.py picks per batch):

1. First pass. Every transaction runs RUN against the batch's starting state; the keys it
   read from that state and the keys it wrote are recorded, nothing is applied. A declared
   range read records the range's key; a write of a key of a range table records the
   range it lies in too, so ranges conflict as they lock (docs/keys.md).
2. Commit. With the reservations of every transaction of the batch (a transaction that
   aborts records its reads and writes nothing), T commits in the first pass unless an
   earlier position writes a key T writes (WAW), or both an earlier position writes a key
   T reads (RAW) and an earlier position reads a key T writes (WAR). A transaction that
   writes nothing (it aborted, or only reads) is always decided here.
3. Fallback. The others run again after the first-pass commits are applied, in log order,
   under Calvin's deterministic locking (scheduler/locking.py) with the keys they declared,
   or, without ANALYZE, the keys their first pass read and wrote (all locked for writing).
   One whose RUN now reaches a key outside those writes nothing in this round and goes to
   the next with that key added; after FALLBACK_ROUNDS rounds it is aborted, saying its
   keys kept changing. Every request is decided in its own batch.

The serial order this equals, which every replay reproduces (docs/architecture.md, "Aria
batches"): the first-pass commits in the topological order of "T reads a key U writes,
so T comes before U", smallest log position first among those ready; then the fallback
rounds, each in log order (`aria_order` in scheduler/reference.py computes it). That order
exists: among first-pass commits no two write one key (WAW), and a cycle would have a
member M of greatest position whose incoming edge X -> M (X < M) is a WAR and whose
outgoing edge M -> Y (Y < M) a RAW, so M would not have committed. Executed serially in
that order, each first-pass commit reads only values that no transaction before it
wrote: exactly what it read in the first pass.

Outcomes are reported in log order. Change data: the first-pass commits' changes by log
position (they never write the same key, so the order among them changes no key's
history), then the fallback's in its serial order (a key a first-pass commit wrote may
be written again by an earlier position in the fallback: applying the changes in order
ends with the final value).

Partitions. Each transaction has a home, the partition that runs its first pass and
reports its outcome: the executor Calvin's placement gives it, or, without ANALYZE, the
owner of its home key. The phases of a batch are exchanged all to all, every partition
sending every peer one message per phase (possibly empty) under a reserved index
(negative, never a transaction's), so each knows when a phase is complete:
  reads: homes ask owners for the starting values of remote keys, in rounds, until no
      first pass misses any (a procedure without ANALYZE is run again once the values it
      missed are in);
  reservations: homes send each owner what their transactions read and wrote of its keys;
      the owner decides the conflicts of its keys (once, for every partition) and answers;
  commit: homes send each owner the committed writes of its keys, with the fallback list;
  fallback: the locking rounds, each followed by the list of transactions going on.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ordo.scheduler.base import Scheduler, _by_txn, register
from ordo.scheduler.batch import BatchExecution, Outcome, PreparedTxn, exchange_failed
from ordo.scheduler.execution import ABORTED, ANY_KEY, COMMITTED, execute, txn_seed
from ordo.scheduler.locking import LockingScheduler, _LockTable
from ordo.log.records import ARIA
from ordo.storage.keys import KeyRange, decode_key, encode_key, is_range_key
from ordo.storage.overlay import ABSENT, RangeView
from ordo.storage.partitioning import executor_of

FALLBACK_ROUNDS = 3  # locking rounds of the fallback before a transaction whose keys keep changing aborts
RETRY = "retry"  # a fallback outcome that is no outcome: the transaction goes to the next round


def kept_changing(procedure: str) -> str:
    return (
        f"aria: {procedure} reached keys outside those it had touched in each of {FALLBACK_ROUNDS} "
        "fallback rounds (its keys kept changing)"
    )


class _NeedsRemote(BaseException):
    """A first pass read a key another partition owns whose value is not here yet. A
    BaseException, so that RUN's own `except Exception` and `execute` let it through."""

    def __init__(self, key: bytes):
        self.key = key


class _Outside(BaseException):
    """A fallback run of a procedure without ANALYZE reached a key outside the ones locked."""

    def __init__(self, key: bytes):
        self.key = key


class RecordingSnapshot(dict):
    """What RUN reads in the first pass: the batch's starting state, recording the keys it
    reads. Holds the declared read set, or, for a procedure without ANALYZE (`source`
    given), fetches any key it is asked for."""

    __slots__ = ("read", "_source")

    def __init__(self, values: dict[bytes, Any], source: Callable[[bytes], Any] | None):
        super().__init__(values)
        self.read: set[bytes] = set()
        self._source = source

    def __getitem__(self, key: bytes) -> Any:
        try:
            value = dict.__getitem__(self, key)
        except KeyError:
            if self._source is None:
                raise  # undeclared: TxnContext says so
            value = self._source(key)
            dict.__setitem__(self, key, value)
        self.read.add(key)
        return value

    def get(self, key: bytes, default: Any = None) -> Any:  # scans and OLLP's reconnaissance
        if self._source is None and not dict.__contains__(self, key):
            return default
        return self[key]


class _RecordedRange:
    """A declared range as the first pass reads it: any read through it records the range."""

    __slots__ = ("_overlay", "_key", "_read")

    def __init__(self, overlay, key: bytes, read: set[bytes]):
        self._overlay, self._key, self._read = overlay, key, read

    def get(self, key: bytes) -> Any:
        self._read.add(self._key)
        return self._overlay.get(key)

    def range_items(self, prefix: bytes) -> list:
        self._read.add(self._key)
        return self._overlay.range_items(prefix)


class FirstPass:
    """One transaction's first-pass execution: its decision if it commits, and what it touched."""

    __slots__ = ("txn", "status", "result", "error", "writes", "read", "written")

    def __init__(
        self,
        txn: PreparedTxn,
        status: str,
        result: Any,
        error: str | None,
        writes: dict[bytes, list],
        read: set[bytes],
        written: set[bytes],
    ):
        self.txn, self.status, self.result, self.error = txn, status, result, error
        self.writes, self.read, self.written = writes, read, written

    @property
    def index(self) -> int:
        return self.txn.index


def written_keys(writes: dict[bytes, list], range_tables: dict[str, tuple[int, int]]) -> set[bytes]:
    """The keys a write set reserves: each key, and for a key of a range table the range it
    lies in (as ANALYZE's implied ranges: procedures/registry.py; a key too short to lie in
    one, which only a procedure without ANALYZE can write, lies in none)."""
    written = set(writes)
    if range_tables:
        for table, key, _ in writes.values():
            shape = range_tables.get(table)
            if shape is not None and type(key) is tuple and len(key) >= shape[0]:
                written.add(encode_key(table, KeyRange(key[: shape[0]])))
    return written


# What an engine started with --scheduler aria says once: the stamp, not the flag, decides.
LOG_ORDER_NOTE = (
    "aria: batches the sequencer stamped aria run with aria; the others keep their log order and run with locking"
)


@register
class AriaScheduler(Scheduler):
    name = "aria"

    def __init__(self) -> None:
        self.log_order = LockingScheduler()  # batches not stamped aria keep their log order
        self.transactions = 0  # homed here in aria batches
        self.fallbacks = 0  # of those, how many the first pass did not decide

    async def run_batch(self, txns: list[PreparedTxn], execution: BatchExecution) -> None:
        if execution.batch.ordering != ARIA:
            await self.log_order.run_batch(txns, execution)
            return
        await _AriaBatch(self, txns, execution).run()


class _AriaBatch:
    """One aria batch on one partition."""

    def __init__(self, scheduler: AriaScheduler, txns: list[PreparedTxn], execution: BatchExecution):
        self.scheduler = scheduler
        self.txns = {txn.index: txn for txn in txns}
        self.execution = execution
        self.here = execution.partition
        self.peers = [p for p in range(execution.partitions) if p != self.here]
        self.overlay = execution.overlay
        self.remote: dict[bytes, Any] = {}  # starting values of other partitions' keys
        self._owners: dict[bytes, int] = {}
        self._phase = 0

    def owner(self, key: bytes) -> int:
        owner = self._owners.get(key)
        if owner is None:
            table, logical = decode_key(key)
            owner = self._owners[key] = self.execution.owner(table, logical, key)
        return owner

    async def exchange(self, payloads: dict[int, Any]) -> dict[int, Any]:
        """One phase: every peer gets its payload (None if none), and this returns what each
        peer sent here. Phases are numbered alike on every partition, under negative
        indices in the read exchange's mailbox."""
        self._phase += 1
        if not self.peers:
            return {}
        exchange, batch_id, index = self.execution.exchange, self.execution.batch.batch_id, -self._phase
        for peer in self.peers:
            exchange.send(batch_id, index, (peer,), {self.here: payloads.get(peer)})
        exchange.flush()
        arrived = asyncio.get_running_loop().create_future()
        exchange.when_received(batch_id, index, len(self.peers), arrived.set_result)
        received = await arrived
        if received is None:
            raise exchange_failed(exchange)
        return received

    async def run(self) -> None:
        execution = self.execution
        homed = [txn for txn in self.txns.values() if txn.executor == self.here]
        passes = await self.first_passes(homed)
        commits = await self.decide(passes)
        self.scheduler.transactions += len(passes)
        writes: dict[int, list] = {p: [] for p in range(execution.partitions)}
        fallback = []
        for p, commit in zip(passes, commits):
            if not commit:
                fallback.append((p.index, None if p.txn.declared else sorted(p.read | p.written)))
                continue
            execution.outcomes.append(Outcome(p.index, p.txn.id, p.status, p.result, p.error))
            if p.status == COMMITTED:
                execution.record(p.index, p.writes)
                for key, write in p.writes.items():
                    writes[self.owner(key)].append((p.index, key, write))
        self.scheduler.fallbacks += len(fallback)
        # What was sent is never changed afterwards: in one process peers share the objects.
        received = await self.exchange({peer: (writes[peer], fallback) for peer in self.peers})
        mine = writes[self.here]
        fallback = list(fallback)
        for _, (their_writes, their_fallback) in received.items():
            mine += their_writes
            fallback += their_fallback
        by_txn: dict[int, dict] = {}
        for index, key, write in sorted(mine, key=lambda w: w[0]):
            by_txn.setdefault(index, {})[key] = write
        for index, txn_writes in by_txn.items():
            execution.apply(index, txn_writes)
        await self.fall_back(sorted(fallback))
        execution.outcomes.sort(key=lambda o: o.index)

    # -- first pass ---------------------------------------------------------------------

    async def first_passes(self, homed: list[PreparedTxn]) -> list[FirstPass]:
        """Each transaction homed here, run against the starting state, in rounds until
        none misses a remote value; in log order."""
        passes: dict[int, FirstPass] = {}
        needed: dict[int, set[bytes]] = {}
        for txn in homed:
            if txn.declared and not txn.single:
                for key in txn.reads:
                    if self.owner(key) != self.here:
                        needed.setdefault(self.owner(key), set()).add(key)
        waiting = [txn for txn in homed if txn.declared and not txn.single]
        for txn in homed:
            if not (txn.declared and not txn.single):
                self._try(txn, passes, needed, waiting)
        while True:
            asked = await self.exchange({peer: (bool(waiting), sorted(needed.get(peer, ()))) for peer in self.peers})
            if not waiting and not any(more for more, _ in asked.values()):
                break
            get = self.overlay.get
            answers = await self.exchange({peer: {key: get(key) for key in keys} for peer, (_, keys) in asked.items()})
            for values in answers.values():
                self.remote.update(values)
            needed = {}
            retry, waiting = waiting, []
            for txn in retry:
                self._try(txn, passes, needed, waiting)
        return [passes[index] for index in sorted(passes)]

    def _try(self, txn: PreparedTxn, passes: dict, needed: dict, waiting: list) -> None:
        try:
            passes[txn.index] = self.first_pass(txn)
        except _NeedsRemote as missing:
            needed.setdefault(self.owner(missing.key), set()).add(missing.key)
            waiting.append(txn)

    def first_pass(self, txn: PreparedTxn) -> FirstPass:
        execution, overlay = self.execution, self.overlay
        if txn.declared:
            snapshot = RecordingSnapshot({}, None)
            read, remote, here = snapshot.read, self.remote, self.here
            snapshot.update(
                (
                    key,
                    RangeView(_RecordedRange(overlay, key, read), key)
                    if is_range_key(key)
                    else overlay.get(key)
                    if txn.single or self.owner(key) == here
                    else remote[key],
                )
                for key in txn.reads
            )
            write_set = txn.writes
        else:
            snapshot = RecordingSnapshot({}, self._any_key)
            write_set = ANY_KEY
        status, result, error, writes = execute(
            txn.procedure,
            txn.args,
            snapshot,
            write_set,
            execution.defaults,
            execution.batch.time_ms,
            txn_seed(execution.batch.batch_id, txn.index),
            in_log_order=False,
        )
        return FirstPass(
            txn, status, result, error, writes, snapshot.read, written_keys(writes, execution.range_tables)
        )

    def _any_key(self, key: bytes) -> Any:
        """What a procedure without ANALYZE reads in its first pass: any key at the batch's
        start, but no range (a scan needs one declared)."""
        if is_range_key(key):
            return ABSENT
        if self.owner(key) == self.here:
            return self.overlay.get(key)
        try:
            return self.remote[key]
        except KeyError:
            raise _NeedsRemote(key) from None

    # -- reservations ---------------------------------------------------------------------

    async def decide(self, passes: list[FirstPass]) -> list[bool]:
        """Whether each pass commits: its keys' owners report its conflicts on them."""
        by_owner: dict[int, list] = {}
        for p in passes:
            parts: dict[int, tuple[list, list]] = {}
            for key in p.read:
                parts.setdefault(self.owner(key), ([], []))[0].append(key)
            for key in p.written:
                parts.setdefault(self.owner(key), ([], []))[1].append(key)
            for owner, (read, written) in parts.items():
                by_owner.setdefault(owner, []).append((p.index, read, written))
        received = await self.exchange({peer: by_owner.get(peer, []) for peer in self.peers})
        received[self.here] = by_owner.get(self.here, [])
        decided = _owner_flags(received)
        flags = decided.pop(self.here)
        for peer_flags in (await self.exchange(decided)).values():
            for index, flag in peer_flags.items():
                flags[index] = flags.get(index, 0) | flag
        return [_commits(flags.get(p.index, 0)) for p in passes]

    # -- fallback -------------------------------------------------------------------------

    async def fall_back(self, fallback: list[tuple[int, list | None]]) -> None:
        """`fallback`: (position, the keys to lock or None for its declared sets), the whole
        batch's, in log order; the same on every partition."""
        execution = self.execution
        for _ in range(FALLBACK_ROUNDS):
            if not fallback:
                return
            round_execution = _FallbackExecution(execution)
            txns = [txn for txn in map(self._fallback_txn, fallback) if txn is not None]
            await _LockTable(round_execution).run(txns)
            execution.outcomes += [o for o in round_execution.outcomes if o.status != RETRY]
            # Locking finishes transactions out of order; conflicting ones in log order, so
            # sorting by position keeps every key's history and makes the bytes the same.
            round_execution.changes.sort(key=_by_txn)
            execution.changes += round_execution.changes
            round_execution.streamed.sort(key=_by_txn)
            execution.streamed += round_execution.streamed
            retries = dict(round_execution.retries)
            for their_retries in (await self.exchange({peer: round_execution.retries for peer in self.peers})).values():
                retries.update(their_retries)
            fallback = sorted(retries.items())
        for index, keys in fallback:
            if self._reporter(index, keys) == self.here:
                txn = self.txns[index]
                execution.outcomes.append(Outcome(index, txn.id, ABORTED, None, kept_changing(txn.procedure.name)))

    def _placed(self, index: int, keys: list[bytes]) -> tuple[tuple[int, ...], int]:
        participants = tuple(sorted({self.owner(key) for key in keys})) or (0,)
        return participants, executor_of(index, participants)

    def _reporter(self, index: int, keys: list[bytes]) -> int:
        return self._placed(index, keys)[1]

    def _fallback_txn(self, item: tuple[int, list | None]) -> PreparedTxn | None:
        """This partition's part of a fallback transaction, or None if it has none."""
        index, keys = item
        txn = self.txns.get(index)
        if keys is None:
            return txn  # its declared sets, placed as for any scheduler
        participants, _ = self._placed(index, keys)
        if self.here not in participants:
            return None
        here = self.here
        local = tuple(key for key in keys if self.owner(key) == here)
        writes = {key: decode_key(key) for key in keys}
        single = len(participants) == 1
        return PreparedTxn(
            index,
            txn.id,
            txn.procedure,
            txn.args,
            tuple(keys),
            writes,
            local,
            participants,
            participants,
            () if single else local,
            declared=False,
            batch_id=txn.batch_id,
            time_ms=txn.time_ms,
        )


def _owner_flags(received: dict[int, list]) -> dict[int, dict[int, int]]:
    """At a key's owner: the conflicts of each transaction on the owner's keys, as bits
    (WAW, RAW, WAR), for each partition that sent reservations (transactions without
    conflicts left out)."""
    first_writer: dict[bytes, int] = {}
    first_reader: dict[bytes, int] = {}
    for entries in received.values():
        for index, read, written in entries:
            for key in written:
                if first_writer.get(key, index) >= index:
                    first_writer[key] = index
            for key in read:
                if first_reader.get(key, index) >= index:
                    first_reader[key] = index
    flags: dict[int, dict[int, int]] = {}
    for sender, entries in received.items():
        mine = flags[sender] = {}
        for index, read, written in entries:
            flag = 0
            if any(first_writer[key] < index for key in written):
                flag |= _WAW
            if any(first_writer.get(key, index) < index for key in read):
                flag |= _RAW
            if any(first_reader.get(key, index) < index for key in written):
                flag |= _WAR
            if flag:
                mine[index] = flag
    return flags


_WAW, _RAW, _WAR = 1, 2, 4


def _commits(flags: int) -> bool:
    """Aria's rule with deterministic reordering: no WAW, and not both RAW and WAR."""
    return not flags & _WAW and (flags & (_RAW | _WAR)) != (_RAW | _WAR)


class _FallbackExecution(BatchExecution):
    """A fallback round: the batch's execution state, with procedures without ANALYZE kept
    to the keys locked for them; one that reaches another key is a retry, not an outcome."""

    def __init__(self, execution: BatchExecution):
        super().__init__(
            execution.batch,
            execution.partition,
            execution.overlay,
            execution.defaults,
            execution.owner,
            execution.exchange,
            execution.range_tables,
            execution.partitions,
        )
        self.retries: dict[int, list[bytes]] = {}  # position -> the keys to lock next round

    def _execute(self, txn: PreparedTxn, snapshot: dict[bytes, Any]):
        if txn.declared:
            return super()._execute(txn, snapshot)
        try:
            return execute(
                txn.procedure,
                txn.args,
                _Locked(snapshot),
                _LockedWrites(txn.writes),
                self.defaults,
                self.batch.time_ms,
                txn_seed(self.batch.batch_id, txn.index),
                in_log_order=False,
            )
        except _Outside as outside:
            self.retries[txn.index] = sorted({*txn.writes, outside.key})
            return RETRY, None, None, {}


class _Locked(dict):
    """The values a fallback run of a procedure without ANALYZE holds locks on."""

    def __missing__(self, key: bytes) -> Any:
        raise _Outside(key)


class _LockedWrites:
    __slots__ = ("_keys",)

    def __init__(self, keys):
        self._keys = keys

    def __contains__(self, key: bytes) -> bool:
        if key in self._keys:
            return True
        raise _Outside(key)

    def __iter__(self):
        return iter(self._keys)
