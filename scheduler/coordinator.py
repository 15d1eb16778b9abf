"""The coordinator: follows the log in order, hands each batch to the partition workers
(one call per batch per worker), publishes one outcome per request and the change data,
then has the workers apply the batch.

Outputs are flushed before the batch is applied, so a crash can only make a restart emit
a batch's outputs again (identically), never lose them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from procedures.registry import Registry
from scheduler.batch import Outcome
from scheduler.execution import ABORTED, COMMITTED, REJECTED
from scheduler.group import LocalGroup, WorkerGroup
from scheduler.outputs import KafkaOutputs, OutputSink
from scheduler.worker import PartitionResult, check_layout
from sequencer.log import Batch, LogCursor
from sequencer.reader import LogReader
from sequencer.topics import Topics

log = logging.getLogger("ordo.engine")


@dataclass(slots=True)
class EngineStats:
    batches: int = 0
    txns: int = 0
    committed: int = 0
    aborted: int = 0
    rejected: int = 0
    last_batch: int = 0


class Coordinator:
    def __init__(self, bootstrap: str, namespace: str, data_dir: str, scheduler: str = "serial",
                 partitions: int = 1, registry: Registry | None = None, sync: bool = False,
                 runtime: str = "auto", ray_address: str | None = None, cores: list[int] | None = None,
                 procedure_modules: tuple[str, ...] = (), outputs: OutputSink | None = None):
        check_layout(data_dir, partitions)
        self.topics = Topics(namespace)
        self.stats = EngineStats()
        self._stop = threading.Event()
        self.group = make_group(data_dir, partitions, scheduler, registry, sync, runtime, ray_address, cores,
                                procedure_modules)
        self.cursor = self._resume_cursor()
        self.stats.last_batch = self.cursor.next_batch - 1
        self._uncommitted: dict | None = None  # marker of the executed, published, unapplied batch
        self._reader = LogReader(bootstrap, self.topics.log, self.cursor, f"{namespace}.engine")
        self.outputs = outputs if outputs is not None else KafkaOutputs(bootstrap, self.topics)
        self._closed = False

    def _resume_cursor(self) -> LogCursor:
        markers = self.group.applied()
        if all(m is None for m in markers):
            return LogCursor()
        batches = {m["batch"] if m else 0 for m in markers}
        if len(batches) != 1:
            raise RuntimeError(
                f"shards stopped at different batches {sorted(batches)}: restore them from a common checkpoint")
        return LogCursor.from_dict(markers[0]["cursor"])

    def stop(self) -> None:
        self._stop.set()

    def run(self, idle_exit: float | None = None, until_batch: int | None = None,
            progress=None) -> EngineStats:
        """Follow the log until stopped; with `idle_exit`, also stop after that many seconds
        without a new batch; with `until_batch`, stop once that batch is applied.
        `progress(stats)` is called after every poll."""
        last_progress = time.monotonic()
        try:
            while not self._stop.is_set():
                if until_batch is not None and self.stats.last_batch >= until_batch:
                    break
                batches = self._reader.poll(0.05)
                for batch, cursor in batches:
                    if until_batch is not None and batch.batch_id > until_batch:
                        break
                    self.apply(batch, cursor)
                if batches:
                    last_progress = time.monotonic()
                else:
                    self._commit_pending()
                    if idle_exit is not None and time.monotonic() - last_progress > idle_exit:
                        break
                if progress is not None:
                    progress(self.stats)
        finally:
            self.close()
        return self.stats

    def apply(self, batch: Batch, cursor: dict) -> None:
        """Execute a batch, publish its outputs, and have it applied (with the next call to
        the workers, or when the log goes quiet)."""
        results = self.group.execute(batch, self._uncommitted)
        self._uncommitted = None
        self._publish(batch, results)
        self._uncommitted = {"batch": batch.batch_id, "cursor": cursor}
        self.stats.batches += 1
        self.stats.last_batch = batch.batch_id

    def _commit_pending(self) -> None:
        if self._uncommitted is not None:
            self.group.commit(self._uncommitted)
            self._uncommitted = None

    def _publish(self, batch: Batch, results: list[PartitionResult]) -> None:
        outcomes: list[Outcome] = [
            Outcome(index, request_id, REJECTED, None, error)
            for index, (request_id, proc, error) in enumerate(batch.entries)
            if proc is None
        ]
        for result in results:
            outcomes.extend(result.outcomes)
        outcomes.sort(key=lambda o: o.index)
        self.outputs.publish(batch.batch_id, outcomes, {r.partition: r.changes for r in results})
        stats = self.stats
        for outcome in outcomes:
            if outcome.status == COMMITTED:
                stats.committed += 1
            elif outcome.status == ABORTED:
                stats.aborted += 1
            else:
                stats.rejected += 1
        stats.txns += len(outcomes)

    def log_lag(self) -> int | str:
        """Log records not yet read; for display only (some brokers misreport watermarks)."""
        return self._reader.lag()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._reader.close()
        self.outputs.close()
        try:
            self._commit_pending()
        finally:
            self.group.close()


def make_group(data_dir: str, partitions: int, scheduler: str, registry: Registry | None, sync: bool,
               runtime: str, ray_address: str | None, cores: list[int] | None,
               procedure_modules: tuple[str, ...]) -> WorkerGroup:
    """`local`: workers in this process; `ray`: one Ray actor per partition; `auto`: Ray
    when there is more than one partition."""
    if runtime == "auto":
        runtime = "ray" if partitions > 1 or ray_address else "local"
    if runtime == "local":
        return LocalGroup(data_dir, partitions, scheduler, registry, sync, procedure_modules)
    if runtime == "ray":
        if registry is not None:
            raise ValueError("Ray workers build their registry from procedure modules, not a Registry object")
        from scheduler.ray_group import RayGroup

        return RayGroup(data_dir, partitions, scheduler, sync, procedure_modules, ray_address, cores)
    raise ValueError(f"unknown runtime '{runtime}' (local, ray or auto)")
