"""What the lock-based schedulers (locking, vll) share: single-partition transactions run
inline as soon as they are free; multi-partition ones do their local part and go on from a
callback when their remote reads arrive, so the partition keeps working meanwhile."""

from __future__ import annotations

import asyncio
from collections import deque

from ordo.scheduler.batch import BatchExecution


class ConcurrentBatch:
    """One batch on one partition. Subclasses keep their admission state and define
    `drain` (run what is free) and `done` (a transaction finished: release what it held).
    A multi-partition transaction is no task of its own: it does its local part when it
    starts and goes on from the exchange's callback (`BatchExecution.begin`), which spares
    each one an asyncio task and its wake-ups."""

    def __init__(self, execution: BatchExecution):
        self.execution = execution
        self.exchange = None if execution is None else execution.exchange
        self.ready: deque = deque()
        self.open = 0  # multi-partition transactions started and not finished
        self._error: BaseException | None = None
        self._all_finished: asyncio.Future | None = None

    def drain(self) -> bool:
        raise NotImplementedError

    def done(self, item) -> None:
        raise NotImplementedError

    def start(self, item) -> None:
        self.open += 1
        self.execution.begin(item.txn, lambda: self._finished(item), self._failed)

    def _finished(self, item) -> None:
        if self._error is not None:
            return
        try:
            self.done(item)
            self.drain()
            self.flush()
        except BaseException as exc:
            self._failed(exc)
            return
        self.open -= 1
        if not self.open:
            self._wake()

    def _failed(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._wake()

    def _wake(self) -> None:
        waiting = self._all_finished
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    def flush(self) -> None:
        """Push out local reads the exchange holds back to aggregate them. Every step that
        may have sent ends with this, so no peer ever waits on reads still sitting in our
        outbox."""
        if self.exchange is not None:
            self.exchange.flush()

    async def join(self) -> None:
        """Wait until every multi-partition transaction has finished, including those
        started meanwhile; raise what failed."""
        while self.open and self._error is None:
            self.flush()
            self._all_finished = asyncio.get_running_loop().create_future()
            await self._all_finished
        self._all_finished = None
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        """A failed batch: whatever its transactions' callbacks still do is ignored."""
        if self._error is None:
            self._error = RuntimeError("the batch was abandoned")
