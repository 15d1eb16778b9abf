"""Calvin's deterministic lock manager.

Each transaction requests the locks of its whole read and write set at once, in log
order; a key in both sets, and a blind write, take a write lock. Every key has a FIFO
queue of requests: a write is granted when nothing is ahead of it, a read when no write
is ahead of it, so the granted requests of a key are always a prefix of its queue —
either one write or a run of reads. A transaction runs once all its locks are granted.
Single-partition transactions run on the spot; a multi-partition one becomes a task
that waits for its remote reads while later, non-conflicting transactions go on.

Which keys are locked, and why that suffices. A partition locks only the keys it owns.
Every key has exactly one owner, and the owner's queue admits the key's readers and
writers in log order. A multi-partition transaction reads a remote key only through the
snapshot its owner takes once the owner has granted it the key (Calvin's read
exchange), and writes a remote key only at its owner (each active participant applies
its own writes only). So every key sees its accesses in log order, and a history in
which each key's conflicting accesses follow one total order (the log) is equivalent
to running the log serially. A participant that does not write releases its locks as
soon as it has sent its reads: its part of the transaction is over.

No deadlock: a transaction only ever waits for earlier ones (locally in a queue, or for
a peer to reach the same transaction), and the earliest unfinished transaction of the
whole log has every lock it needs on every participant.

A single-partition transaction that arrives while the table is empty runs without
touching it: its locks would be granted at once and released before anything else
happened, so the table would look exactly as before.
"""

from __future__ import annotations

from collections import deque

from ordo.scheduler.base import Scheduler, in_log_order, register
from ordo.scheduler.batch import BatchExecution, PreparedTxn
from ordo.scheduler.concurrent import ConcurrentBatch


def local_keys(txn: PreparedTxn) -> tuple[tuple, tuple]:
    """(write keys, read-only keys) of `txn` that this partition owns."""
    writes = txn.writes
    if txn.single:
        return tuple(writes), tuple(k for k in txn.reads if k not in writes)
    return txn.local_writes, tuple(k for k in txn.local_reads if k not in writes)


class _Holder:
    """A transaction in the lock table: how many of its locks are still pending."""

    __slots__ = ("txn", "missing", "requests")

    def __init__(self, txn: PreparedTxn):
        self.txn = txn
        self.missing = 0
        self.requests: list[tuple] = []  # (queue, request) pairs, for release


class _LockTable(ConcurrentBatch):
    """One batch's locks on one partition. Each key maps to [requests, granted]: a deque of
    (holder, is_write) in arrival order and how many of its leading requests hold the lock."""

    def __init__(self, execution: BatchExecution):
        super().__init__(execution)
        self.queues: dict[bytes, list] = {}
        self.holders = 0  # transactions in the table (holding or awaiting locks)

    def request(self, txn: PreparedTxn) -> _Holder:
        holder = _Holder(txn)
        writes, reads = local_keys(txn)
        queues = self.queues
        requests = holder.requests
        missing = 0
        for key in writes:
            queue = queues.get(key)
            if queue is None:
                queue = queues[key] = [deque(), 0]
            req = (holder, True)
            pending = queue[0]
            if pending:
                missing += 1
            else:
                queue[1] = 1
            pending.append(req)
            requests.append((queue, req))
        for key in reads:
            queue = queues.get(key)
            if queue is None:
                queue = queues[key] = [deque(), 0]
            req = (holder, False)
            pending, granted = queue
            # Granted requests form a prefix: a read joins it only if the whole queue is
            # granted reads (or empty).
            if granted == len(pending) and (not pending or not pending[-1][1]):
                queue[1] = granted + 1
            else:
                missing += 1
            pending.append(req)
            requests.append((queue, req))
        holder.missing = missing
        self.holders += 1
        return holder

    def release(self, holder: _Holder) -> None:
        self.holders -= 1
        ready = self.ready
        for queue, req in holder.requests:
            pending = queue[0]
            if pending[0] is req:
                pending.popleft()
            else:
                pending.remove(req)  # one of several granted reads
            granted = queue[1] - 1
            if granted == 0 and pending:
                head = pending[0]
                if head[1]:
                    granted = 1
                    _grant(head[0], ready)
                else:
                    for waiting, write in pending:
                        if write:
                            break
                        granted += 1
                        _grant(waiting, ready)
            queue[1] = granted

    def drain(self) -> bool:
        """Run every transaction whose locks are all granted; True if a task was started."""
        ready, execution = self.ready, self.execution
        started = False
        while ready:
            holder = ready.popleft()
            txn = holder.txn
            if txn.single:
                execution.run_single(txn)
                self.release(holder)
            else:
                self.start(holder)
                started = True
        return started

    def done(self, item) -> None:
        self.release(item)

    async def run(self, txns: list[PreparedTxn]) -> None:
        ready = self.ready
        try:
            run_single = self.execution.run_single
            for txn in txns:
                if txn.single and self.holders == 0:
                    # Nothing holds or awaits a lock: this txn's locks would all be granted
                    # and released again before anything else happens, so skip them.
                    run_single(txn)
                    continue
                holder = self.request(txn)
                if holder.missing == 0:
                    ready.append(holder)
                    # Newly started multi-partition transactions' local reads leave when this
                    # loop next yields, all together: one message per peer, not one per txn.
                    self.drain()
            await self.join()
        except BaseException:
            self.cancel()
            raise
        if any(queue[0] for queue in self.queues.values()):
            raise RuntimeError("locking: batch ended with lock requests still queued")


def _grant(holder: _Holder, ready: deque) -> None:
    holder.missing -= 1
    if holder.missing == 0:
        ready.append(holder)


@register
class LockingScheduler(Scheduler):
    name = "locking"

    async def run_batch(self, txns: list[PreparedTxn], execution: BatchExecution) -> None:
        await _LockTable(execution).run(txns)
        in_log_order(execution)
