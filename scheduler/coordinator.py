"""The coordinator: follows the log in order, hands each batch to the partition workers
(one call per batch per worker), publishes one outcome per request and the change data,
then has the workers apply the batch.

Outputs are flushed before the batch is applied, so a crash can only make a restart emit
a batch's outputs again (identically), never lose them.

Every `checkpoint_every` batches (batch ids that are multiples of it, so every run
checkpoints the same batches) all shards are checkpointed at the same batch; on start,
shards that disagree are restored from the newest checkpoint (see `recovery/`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from procedures.registry import Registry
from recovery.checkpoints import CheckpointStore
from recovery.restore import AUTO, DataDirLock, check_log_holds, prepare_shards
from scheduler.batch import Outcome
from scheduler.execution import ABORTED, COMMITTED, REJECTED
from scheduler.group import LocalGroup, WorkerGroup
from scheduler.outputs import KafkaOutputs, OutputSink
from scheduler.worker import PartitionResult, check_layout
from sequencer.log import Batch, LogCursor, LogError
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
    checkpoints: int = 0


class Coordinator:
    def __init__(self, bootstrap: str, namespace: str, data_dir: str, scheduler: str = "serial",
                 partitions: int = 1, registry: Registry | None = None, sync: bool = False,
                 runtime: str = "auto", ray_address: str | None = None, cores: list[int] | None = None,
                 procedure_modules: tuple[str, ...] = (), outputs: OutputSink | None = None,
                 checkpoint_every: int = 100, keep_checkpoints: int = 2, restore: str = AUTO):
        """`restore`: "auto" (restore only shards that disagree), "checkpoint" or "scratch"."""
        check_layout(data_dir, partitions)
        self.topics = Topics(namespace)
        self.stats = EngineStats()
        self._stop = threading.Event()
        self._checkpoint_requested = threading.Event()
        self.checkpoint_every = checkpoint_every
        self._lock = DataDirLock(data_dir)
        try:
            self.checkpoints = CheckpointStore(data_dir, partitions, keep_checkpoints)
            self.recovery = prepare_shards(data_dir, partitions, self.checkpoints, restore)
            self.group = make_group(data_dir, partitions, scheduler, registry, sync, runtime, ray_address, cores,
                                    procedure_modules)
        except BaseException:
            self._lock.release()
            raise
        self._applied: dict | None = None  # marker of the last batch all shards applied
        self.cursor = self._resume_cursor()
        check_log_holds(bootstrap, self.topics.log, self.cursor)
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
        if len(batches) != 1:  # prepare_shards made them agree; a worker must have moved on since
            raise RuntimeError(f"shards stopped at different batches {sorted(batches)}")
        self._applied = markers[0]
        return LogCursor.from_dict(markers[0]["cursor"])

    def stop(self) -> None:
        self._stop.set()

    def request_checkpoint(self) -> None:
        """Checkpoint at the next batch boundary (safe from a signal handler or a thread)."""
        self._checkpoint_requested.set()

    def checkpoint(self) -> dict | None:
        """Checkpoint every shard at the last executed batch, applying it first; returns
        the manifest entry, or None while no batch is applied."""
        self._checkpoint_requested.clear()
        self._commit_pending()
        if self._applied is None:
            return None
        latest = self.checkpoints.latest()
        if latest is not None and latest["batch"] == self._applied["batch"]:
            return latest
        entry = self.checkpoints.take(self.group, self._applied)
        self.stats.checkpoints += 1
        return entry

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
                try:
                    batches = self._reader.poll(0.05)
                except LogError as exc:
                    raise LogError(
                        f"cannot replay {self.topics.log} from batch {self.cursor.next_batch}: {exc}") from None
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
                if self._checkpoint_requested.is_set():
                    self.checkpoint()
                if progress is not None:
                    progress(self.stats)
        finally:
            self.close()
        return self.stats

    def apply(self, batch: Batch, cursor: dict) -> None:
        """Execute a batch, publish its outputs, and have it applied (with the next call to
        the workers, or when the log goes quiet)."""
        # Cleared before the call: if it fails, the commit may have landed on some workers
        # only, and committing it again on close would fail; a restart sorts that out.
        commit, self._uncommitted = self._uncommitted, None
        results = self.group.execute(batch, commit)
        if commit is not None:
            self._applied = commit
        self._publish(batch, results)
        self._uncommitted = {"batch": batch.batch_id, "cursor": cursor}
        self.stats.batches += 1
        self.stats.last_batch = batch.batch_id
        if self.checkpoint_every and batch.batch_id % self.checkpoint_every == 0:
            self.checkpoint()

    def _commit_pending(self) -> None:
        if self._uncommitted is not None:
            marker, self._uncommitted = self._uncommitted, None
            self.group.commit(marker)
            self._applied = marker

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
            try:
                self.group.close()
            finally:
                self._lock.release()


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
