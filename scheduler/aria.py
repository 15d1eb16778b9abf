"""Aria (Lu et al., VLDB 2020) with deterministic reordering: batches whose serial order is
decided by what their transactions touched, not by their log positions.

A batch the sequencer stamped with the aria ordering (`sequencer.log.ARIA`) runs in three
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
3. Fallback. The others run again one by one, in log order, after the first-pass commits
   are applied, each against the state the previous ones left.

The serial order this equals, which every replay reproduces (docs/architecture.md, "Aria
batches"): the first-pass commits in the topological order of "T reads a key U writes,
so T comes before U", smallest log position first among those ready; then the fallback
in log order. That order exists: among first-pass commits no two write one key (WAW), and
a cycle would have a member M of greatest position whose incoming edge X -> M (X < M)
is a WAR and whose outgoing edge M -> Y (Y < M) a RAW, so M would not have committed.
Executed serially in that order, each first-pass commit reads only values that no
transaction before it wrote: exactly what it read in the first pass.

Outcomes are reported in log order; change data is in the serial order (a key may be
written by a first-pass commit and again by an earlier position in the fallback, and a
consumer applying the changes in order must end with the final value).
"""

from __future__ import annotations

import heapq
from typing import Any, Callable

from scheduler.base import Scheduler, register
from scheduler.batch import BatchExecution, Outcome, PreparedTxn
from scheduler.execution import ANY_KEY, COMMITTED, execute, txn_seed
from scheduler.locking import LockingScheduler
from sequencer.log import ARIA
from storage.keys import KeyRange, encode_key, is_range_key
from storage.overlay import ABSENT, RangeView


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

    def __init__(self, txn: PreparedTxn, status: str, result: Any, error: str | None,
                 writes: dict[bytes, list], read: set[bytes], written: set[bytes]):
        self.txn, self.status, self.result, self.error = txn, status, result, error
        self.writes, self.read, self.written = writes, read, written

    @property
    def index(self) -> int:
        return self.txn.index


def written_keys(writes: dict[bytes, list], range_tables: dict[str, tuple[int, int]]) -> set[bytes]:
    """The keys a write set reserves: each key, and for a key of a range table the range it
    lies in (as ANALYZE's implied ranges: procedures/registry.py)."""
    written = set(writes)
    if range_tables:
        for table, key, _ in writes.values():
            shape = range_tables.get(table)
            if shape is not None:
                written.add(encode_key(table, KeyRange(key[:shape[0]])))
    return written


def committing(passes: list[FirstPass]) -> list[bool]:
    """For each first pass (in log order): does it commit in the first pass?"""
    first_writer: dict[bytes, int] = {}
    first_reader: dict[bytes, int] = {}
    for p in passes:
        index = p.index
        for key in p.written:
            first_writer.setdefault(key, index)
        for key in p.read:
            first_reader.setdefault(key, index)
    decisions = []
    for p in passes:
        index = p.index
        waw = any(first_writer[key] < index for key in p.written)
        raw = any(first_writer.get(key, index) < index for key in p.read)
        war = any(first_reader.get(key, index) < index for key in p.written)
        decisions.append(not waw and not (raw and war))
    return decisions


def serial_order(committed: list[FirstPass]) -> list[FirstPass]:
    """The first-pass commits in the topological order of read-before-write, smallest
    position first among those ready (Kahn's algorithm on a heap)."""
    writer = {key: p for p in committed for key in p.written}  # one writer per key (no WAW)
    after: dict[int, list[FirstPass]] = {}  # index -> the commits that must come after it
    waiting = {p.index: 0 for p in committed}
    for p in committed:
        for key in p.read:
            u = writer.get(key)
            if u is not None and u is not p:  # p reads what u writes: p before u
                after.setdefault(p.index, []).append(u)
                waiting[u.index] += 1
    ready = [(p.index, p) for p in committed if waiting[p.index] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, p = heapq.heappop(ready)
        order.append(p)
        for u in after.get(p.index, ()):
            waiting[u.index] -= 1
            if waiting[u.index] == 0:
                heapq.heappush(ready, (u.index, u))
    if len(order) != len(committed):
        raise RuntimeError("aria: the first-pass commits have a cyclic order (the commit rule is broken)")
    return order


# What an engine started with --scheduler aria says once: the stamp, not the flag, decides.
LOG_ORDER_NOTE = ("aria: batches the sequencer stamped aria run with aria; the others keep their log order "
                  "and run with locking")


@register
class AriaScheduler(Scheduler):
    name = "aria"

    def __init__(self) -> None:
        self.log_order = LockingScheduler()  # batches not stamped aria keep their log order
        self.transactions = 0  # run in aria batches
        self.fallbacks = 0  # of those, how many the first pass did not decide

    async def run_batch(self, txns: list[PreparedTxn], execution: BatchExecution) -> None:
        if execution.batch.ordering != ARIA:
            await self.log_order.run_batch(txns, execution)
            return
        if any(not txn.single for txn in txns):
            raise RuntimeError("aria: multi-partition transactions are not supported yet")
        passes = [self._first_pass(txn, execution) for txn in txns]
        decisions = committing(passes)
        self.transactions += len(passes)
        for p in serial_order([p for p, commits in zip(passes, decisions) if commits]):
            execution.outcomes.append(Outcome(p.index, p.txn.id, p.status, p.result, p.error))
            if p.status == COMMITTED and p.writes:
                execution.apply(p.index, p.writes)
        for p, commits in zip(passes, decisions):
            if not commits:
                self.fallbacks += 1
                _run_again(p.txn, execution)
        execution.outcomes.sort(key=lambda o: o.index)

    @staticmethod
    def _first_pass(txn: PreparedTxn, execution: BatchExecution) -> FirstPass:
        overlay = execution.overlay
        if txn.declared:
            snapshot = RecordingSnapshot({}, None)
            read = snapshot.read
            snapshot.update((key, RangeView(_RecordedRange(overlay, key, read), key) if is_range_key(key)
                             else overlay.get(key)) for key in txn.local_reads)
            write_set = txn.writes
        else:
            snapshot = RecordingSnapshot({}, _any_key_of(overlay))
            write_set = ANY_KEY
        status, result, error, writes = execute(txn.procedure, txn.args, snapshot, write_set, execution.defaults,
                                                execution.batch.time_ms, txn_seed(execution.batch.batch_id, txn.index))
        return FirstPass(txn, status, result, error, writes, snapshot.read,
                         written_keys(writes, execution.range_tables))


def _any_key_of(overlay) -> Callable[[bytes], Any]:
    """What a procedure without ANALYZE reads: any key, but no range (a scan needs one declared)."""
    get = overlay.get
    return lambda key: ABSENT if is_range_key(key) else get(key)


def _run_again(txn: PreparedTxn, execution: BatchExecution) -> None:
    """A fallback transaction, at its turn, against the state the serial order has reached."""
    if txn.declared:
        execution.run_single(txn)
        return
    status, result, error, writes = execute(txn.procedure, txn.args, RecordingSnapshot({}, _any_key_of(execution.overlay)),
                                            ANY_KEY, execution.defaults, execution.batch.time_ms,
                                            txn_seed(execution.batch.batch_id, txn.index))
    execution.outcomes.append(Outcome(txn.index, txn.id, status, result, error))
    if status == COMMITTED and writes:
        execution.apply(txn.index, writes)
