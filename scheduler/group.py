"""Partition workers as the coordinator sees them. Each follows the log on its own
(`scheduler.follower`); the coordinator starts them, watches them, and can hold them at a
batch (for a checkpoint of every shard at one batch) or stop them.

`LocalGroup` runs them in this process on one event loop, which the coordinator drives;
`scheduler.ray_group.RayGroup` runs each as a Ray actor in a process of its own."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Protocol

from ordo.scheduler.exchange import LocalExchange
from ordo.scheduler.follower import FollowOptions, LogFollower
from ordo.scheduler.outputs import CollectedOutputs
from ordo.scheduler.worker import PartitionWorker


class WorkerGroup(Protocol):
    partitions: int

    def applied(self) -> list[dict[str, Any] | None]: ...

    def start(self, options: FollowOptions) -> None:
        """Every worker starts following the log."""

    def drive(self, seconds: float) -> bool:
        """Let the workers run for up to `seconds`; True once all of them have finished.
        Raises if one failed."""

    def status(self) -> list[dict[str, Any]]: ...

    def hold(self, batch_id: int | None) -> None:
        """Execute no batch after `batch_id` (None: go on)."""

    def stop(self) -> None: ...

    def collected(self) -> list[CollectedOutputs]: ...

    def checkpoint(self, paths: list[str]) -> list[dict[str, Any] | None]: ...

    def close(self) -> None: ...


class LocalGroup:
    def __init__(
        self,
        data_dir: str,
        partitions: int,
        scheduler: str,
        registry=None,
        sync: bool = False,
        procedure_modules: tuple[str, ...] = (),
    ):
        exchange = LocalExchange()
        self.partitions = partitions
        self.workers = [
            PartitionWorker(data_dir, p, partitions, scheduler, registry, exchange.endpoint(p), sync, procedure_modules)
            for p in range(partitions)
        ]
        self.followers: list[LogFollower] = []
        self._tasks: list[asyncio.Task] = []
        self._loop = asyncio.new_event_loop()

    def applied(self) -> list[dict[str, Any] | None]:
        return [worker.applied() for worker in self.workers]

    def start(self, options: FollowOptions) -> None:
        if self.partitions > 1:
            # Followers share one thread here: a blocking wait for the log by one would
            # stall the others.
            options = replace(options, idle_wait=min(options.idle_wait, 0.002))
        self.followers = [LogFollower(worker, options) for worker in self.workers]
        self._tasks = [self._loop.create_task(f.run()) for f in self.followers]

    def drive(self, seconds: float) -> bool:
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            self._loop.run_until_complete(asyncio.wait(pending, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION))
        for task in self._tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()
        return all(t.done() for t in self._tasks)

    def status(self) -> list[dict[str, Any]]:
        return [f.status() for f in self.followers]

    def hold(self, batch_id: int | None) -> None:
        for follower in self.followers:
            follower.hold_at = batch_id

    def stop(self) -> None:
        for follower in self.followers:
            follower.stop()

    def collected(self) -> list[CollectedOutputs]:
        return [f.sink for f in self.followers if isinstance(f.sink, CollectedOutputs)]

    def checkpoint(self, paths: list[str]) -> list[dict[str, Any] | None]:
        return [worker.checkpoint(path) for worker, path in zip(self.workers, paths)]

    def close(self) -> None:
        try:
            for task in self._tasks:
                if not task.done():
                    task.cancel()
            if self._tasks:
                self._loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
            for follower in self.followers:
                follower.close()
        finally:
            for worker in self.workers:
                worker.close()
            self._loop.close()
