"""Partition workers as the coordinator sees them: one call per batch for all of them.
`LocalGroup` runs them in this process on one event loop; `scheduler.ray_group.RayGroup`
runs each as a Ray actor in a process of its own."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from scheduler.exchange import LocalExchange
from scheduler.worker import PartitionResult, PartitionWorker
from sequencer.log import Batch


class WorkerGroup(Protocol):
    partitions: int

    def applied(self) -> list[dict[str, Any] | None]: ...

    def execute(self, batch: Batch, commit: dict[str, Any] | None) -> list[PartitionResult]: ...

    def commit(self, marker: dict[str, Any]) -> None: ...

    def checkpoint(self, paths: list[str]) -> list[dict[str, Any] | None]: ...

    def close(self) -> None: ...


class LocalGroup:
    def __init__(self, data_dir: str, partitions: int, scheduler: str, registry=None, sync: bool = False,
                 procedure_modules: tuple[str, ...] = ()):
        exchange = LocalExchange()
        self.partitions = partitions
        self.workers = [
            PartitionWorker(data_dir, p, partitions, scheduler, registry, exchange.endpoint(p), sync,
                            procedure_modules)
            for p in range(partitions)
        ]
        self._loop = asyncio.new_event_loop()

    def applied(self) -> list[dict[str, Any] | None]:
        return [worker.applied() for worker in self.workers]

    def execute(self, batch: Batch, commit: dict[str, Any] | None) -> list[PartitionResult]:
        return self._loop.run_until_complete(self._execute(batch, commit))

    async def _execute(self, batch: Batch, commit: dict[str, Any] | None) -> list[PartitionResult]:
        return await asyncio.gather(*(w.execute(batch, commit) for w in self.workers))

    def commit(self, marker: dict[str, Any]) -> None:
        for worker in self.workers:
            worker.commit(marker)

    def checkpoint(self, paths: list[str]) -> list[dict[str, Any] | None]:
        return [worker.checkpoint(path) for worker, path in zip(self.workers, paths)]

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self._loop.close()
