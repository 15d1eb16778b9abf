"""What the lock-based schedulers (locking, vll) share: single-partition transactions run
inline as soon as they are free; multi-partition ones become asyncio tasks, so the
partition keeps working while they wait for their remote reads."""

from __future__ import annotations

import asyncio
from collections import deque

from scheduler.batch import BatchExecution


class ConcurrentBatch:
    """One batch on one partition. Subclasses keep their admission state and define
    `drain` (run what is free) and `done` (a transaction finished: release what it held)."""

    def __init__(self, execution: BatchExecution):
        self.execution = execution
        self.exchange = None if execution is None else execution.exchange
        self.ready: deque = deque()
        self.tasks: list[asyncio.Task] = []

    def drain(self) -> bool:
        raise NotImplementedError

    def done(self, item) -> None:
        raise NotImplementedError

    def start(self, item) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(self._run_multi(item)))

    async def _run_multi(self, item) -> None:
        await self.execution.run(item.txn)
        self.done(item)
        self.drain()
        self.flush()

    def flush(self) -> None:
        """Push out local reads the exchange holds back to aggregate them. Every step that
        may have sent ends with this (a task waiting for its reads flushes in `receive`),
        so no peer ever waits on reads still sitting in our outbox."""
        if self.exchange is not None:
            self.exchange.flush()

    async def join(self) -> None:
        """Wait for every multi-partition task, including those started meanwhile."""
        tasks = self.tasks
        while tasks:
            self.flush()
            await tasks.pop()

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()
