"""Very lightweight locking (Ren, Thomson, Abadi; Calvin's VLL scheduler).

Instead of lock queues, every key has two counters — exclusive and shared requests of
the active transactions — and the active transactions sit in one queue in log order.
On arrival a transaction bumps its keys' counters; it is free, and runs at once, when
they show no earlier conflicting holder: for each write key exclusive == 1 and shared
== 0, for each read key exclusive == 0. Otherwise it is blocked. Finishing decrements the
counters and leaves the queue (from anywhere in it).

A blocked transaction runs when it reaches the head of the queue: everything before it
has finished. Between those moments, selective contention analysis (SCA) looks for
blocked transactions whose conflicts are already gone: it walks the queue from the head
collecting the keys of every transaction it passes (written, read) and frees each
blocked transaction whose writes meet neither set and whose reads meet no written key.
The counters cannot tell this (they count a blocked transaction's requests too), which
is why SCA exists. A walk costs the whole queue, so it runs only when more than
`sca_threshold` transactions are blocked and, since the last walk, transactions that could
be blocking others have finished — nothing else can free anyone — in number at least a
quarter of the queue, which bounds the walking per transaction.

A single-partition transaction that arrives to an empty queue runs without touching the
counters: it would be free, and its counters undone, before anything else happened.

Keys are only this partition's own, for the reasons given in scheduler/locking.py.
"""

from __future__ import annotations

from collections import deque

from ordo.scheduler.base import Scheduler, in_log_order, register
from ordo.scheduler.batch import BatchExecution, PreparedTxn
from ordo.scheduler.concurrent import ConcurrentBatch
from ordo.scheduler.locking import local_keys

DEFAULT_SCA_THRESHOLD = 8
SCA_AMORTIZE = 4  # walk again once a quarter of the queue's length has finished


class _Active:
    __slots__ = ("txn", "writes", "reads", "blocked", "done", "lingered")

    def __init__(self, txn: PreparedTxn, writes: tuple, reads: tuple):
        self.txn = txn
        self.writes = writes
        self.reads = reads
        self.blocked = False
        self.done = False
        # Stayed active while later txns arrived (multi-partition, or once blocked), so
        # its counters may block someone. A free single-partition txn runs to its end
        # before the next arrival: its finishing cannot free anybody.
        self.lingered = not txn.single


class _Counters(ConcurrentBatch):
    """One batch on one partition."""

    def __init__(self, execution: BatchExecution, sca_threshold: int):
        super().__init__(execution)
        self.sca_threshold = sca_threshold
        self.counts: dict[bytes, list[int]] = {}  # key -> [exclusive, shared]
        self.queue: deque[_Active] = deque()
        self.blocked = 0
        self.finished_since_sca = 0
        self.sca_runs = 0  # for tests and diagnostics

    def arrive(self, txn: PreparedTxn) -> _Active:
        writes, reads = local_keys(txn)
        active = _Active(txn, writes, reads)
        counts = self.counts
        blocked = False
        for key in writes:
            c = counts.get(key)
            if c is None:
                counts[key] = [1, 0]
            else:
                c[0] += 1
                if c[0] > 1 or c[1]:
                    blocked = True
        for key in reads:
            c = counts.get(key)
            if c is None:
                counts[key] = [0, 1]
            else:
                c[1] += 1
                if c[0]:
                    blocked = True
        self.queue.append(active)
        if blocked:
            active.blocked = active.lingered = True
            self.blocked += 1
        else:
            self.ready.append(active)
        return active

    def finish(self, active: _Active) -> None:
        counts = self.counts
        for key in active.writes:
            counts[key][0] -= 1
        for key in active.reads:
            counts[key][1] -= 1
        active.done = True
        if active.lingered:
            self.finished_since_sca += 1
        queue = self.queue
        while queue and queue[0].done:
            queue.popleft()
        if queue and queue[0].blocked:
            self._unblock(queue[0])  # everything before it has finished

    def _unblock(self, active: _Active) -> None:
        active.blocked = False
        self.blocked -= 1
        self.ready.append(active)

    def sca(self) -> int:
        """Free every blocked transaction with no conflict left; how many were freed."""
        self.sca_runs += 1
        self.finished_since_sca = 0
        written: set[bytes] = set()
        read: set[bytes] = set()
        freed = 0
        unseen = self.blocked  # past the last blocked txn there is nothing left to free
        for active in self.queue:
            if active.done:
                continue
            writes, reads = active.writes, active.reads
            if active.blocked:
                if written.isdisjoint(writes) and read.isdisjoint(writes) and written.isdisjoint(reads):
                    self._unblock(active)
                    freed += 1
                unseen -= 1
                if not unseen:
                    break
            written.update(writes)
            read.update(reads)
        return freed

    def drain(self) -> bool:
        """Run every free transaction; True if a task was started. At most one SCA walk
        per call (one call per arrival or per multi-partition completion) bounds its cost;
        whatever it leaves blocked still moves up to the head."""
        ready, execution = self.ready, self.execution
        started = False
        walked = False
        while True:
            while ready:
                active = ready.popleft()
                txn = active.txn
                if txn.single:
                    execution.run_single(txn)
                    self.finish(active)
                else:
                    self.start(active)
                    started = True
            if walked or self.blocked <= self.sca_threshold or self.finished_since_sca * SCA_AMORTIZE < len(self.queue):
                return started
            walked = True
            self.sca()

    def done(self, item) -> None:
        self.finish(item)

    async def run(self, txns: list[PreparedTxn]) -> None:
        try:
            run_single, queue = self.execution.run_single, self.queue
            for txn in txns:
                if txn.single and not queue:
                    # No active txn: its counters would show it free and be undone again
                    # before anything else happens, so skip them.
                    run_single(txn)
                    continue
                self.arrive(txn)
                # Newly started multi-partition transactions' local reads leave when this
                # loop next yields, all together: one message per peer instead of one per txn.
                self.drain()
            await self.join()
        except BaseException:
            self.cancel()
            raise
        if self.queue:
            raise RuntimeError("vll: batch ended with transactions still queued")


@register
class VLLScheduler(Scheduler):
    name = "vll"

    def __init__(self, sca_threshold: int = DEFAULT_SCA_THRESHOLD):
        self.sca_threshold = sca_threshold

    async def run_batch(self, txns: list[PreparedTxn], execution: BatchExecution) -> None:
        await _Counters(execution, self.sca_threshold).run(txns)
        in_log_order(execution)
