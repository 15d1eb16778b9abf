"""The partition worker: one RocksDB shard and one scheduler. A plain class, so it runs
in-process as well as wrapped as a Ray actor."""

from __future__ import annotations

import gc
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ordo.procedures.ollp import restarts_of
from ordo.procedures.loading import load_registry
from ordo.procedures.registry import Registry
from ordo.scheduler.base import Scheduler, make_scheduler
from ordo.scheduler.batch import BatchExecution, Outcome, PreparedTxn, ReadExchange, prepare
from ordo.scheduler.round import merge, offsets_of, split
from ordo.log.records import ARIA, Batch
from ordo.storage.overlay import BatchOverlay
from ordo.storage.partitioning import Partitioner
from ordo.storage.layout import LAYOUT_FILE, check_layout, layout_partitions, shard_path  # noqa: F401 (re-exported)
from ordo.storage.rocks import RocksShard


def resident_bytes() -> int:
    """The resident set of this process (Linux), 0 where /proc cannot tell."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def relax_garbage_collection() -> None:
    """A batch allocates hundreds of thousands of short-lived, acyclic objects; CPython's
    default thresholds would run a cycle collection every 700 of them. Collect far less
    often, and never rescan what was alive before the engine started."""
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def count_restarts(txns: list, outcomes: list[Outcome]) -> None:
    """Give each outcome of a re-sequenced kind of transaction (a dependent one, or one
    without ANALYZE) its restart count (from its request)."""
    restarts = {
        t.index: restarts_of(t.args)
        for t in txns
        if t.procedure is not None and (t.procedure.reconnoiter is not None or t.procedure.analyze is None)
    }
    if restarts:
        for outcome in outcomes:
            outcome.restarts = restarts.get(outcome.index, 0)


@dataclass(slots=True)
class PartitionResult:
    partition: int
    outcomes: list[Outcome] = field(default_factory=list)
    changes: list[list] = field(default_factory=list)
    streamed: list[list] = field(default_factory=list)


class PartitionWorker:
    def __init__(
        self,
        data_dir: str,
        partition: int,
        partitions: int,
        scheduler: str,
        registry: Registry | None = None,
        exchange: ReadExchange | None = None,
        sync: bool = False,
        procedure_modules: tuple[str, ...] = (),
    ):
        relax_garbage_collection()
        self.partition = partition
        self.procedure_modules = tuple(procedure_modules)
        self._partitions = partitions
        self.use(registry or load_registry(procedure_modules))
        self._prepared_ahead: tuple[int, tuple] | None = None  # (batch id, what prepare returned)
        self.scheduler = make_scheduler(scheduler)
        self._aria: Scheduler | None = None  # for aria-stamped batches under another scheduler
        self.exchange = exchange
        self.shard = RocksShard(shard_path(data_dir, partition), sync=sync)
        # Executed batches (or rounds) not yet applied, oldest first: (last batch id, first
        # batch id, encoded writes); and the newest unapplied value of each key they wrote:
        # key -> (batch id, value).
        self._unapplied: deque[tuple[int, int, dict[bytes, bytes | None]]] = deque()
        self._unapplied_values: dict[bytes, tuple[int, Any]] = {}

    def use(self, registry: Registry) -> None:
        """Run the batches from here on with `registry`'s procedures (an upgrade in place)."""
        self.registry = registry
        tables = registry.tables.values()
        self.partitioner = Partitioner.for_tables(self._partitions, {t.name: t.partitioner for t in tables})
        self.defaults = {t.name: t.default for t in tables}
        self._prepared_ahead = None  # prepared with the procedures before

    def applied(self) -> dict[str, Any] | None:
        return self.shard.applied()

    def owner(self, table: str, key: Any, encoded: bytes) -> int:
        return self.partitioner.of(table, key, encoded)

    async def execute(
        self, batch: Batch, commit: dict[str, Any] | None = None, upcoming: Batch | None = None
    ) -> PartitionResult:
        """Run this partition's share of `batch` on an overlay; nothing reaches the shard
        until `commit`. `commit`, if given, first applies the oldest executed batch. Batches
        executed before this one and not yet applied are read through their overlays.
        `upcoming`, the batch that follows, is prepared while this one waits for peers."""
        return (await self.execute_round([batch], commit, upcoming))[0]

    async def execute_round(
        self, batches: Sequence[Batch], commit: dict[str, Any] | None = None, upcoming: Batch | None = None
    ) -> list[PartitionResult]:
        """`execute` for consecutive batches run as one round (scheduler/round.py): one
        result per batch; one write to the shard, committed as the round's last batch."""
        if commit is not None:
            self.commit(commit)
        prepared = [self._prepared(batch) for batch in batches]
        first = batches[0]
        if len(batches) == 1:
            offsets = [0]
            txns = prepared[0][0]
        else:
            offsets = offsets_of(batches)
            txns = merge(prepared, offsets)
        overlay = BatchOverlay(self.shard, self._unapplied_values)
        overlay.prefetch(key for txn in txns for key in txn.local_reads)
        execution = BatchExecution(
            first,
            self.partition,
            overlay,
            self.defaults,
            self.owner,
            self.exchange,
            self.registry.range_tables,
            self.partitioner.partitions,
        )
        mailbox = None if self.exchange is None else self.exchange.mailbox
        if upcoming is not None and mailbox is not None:
            mailbox.on_wait = lambda: self._prepare_ahead(upcoming)
        try:
            await self.scheduler_for(first).run_batch(txns, execution)
        finally:
            if mailbox is not None:
                mailbox.on_wait = None
        count_restarts(txns, execution.outcomes)
        if self.exchange is not None:
            self.exchange.flush()
        last = batches[-1].batch_id
        self._unapplied.append((last, first.batch_id, overlay.encoded_writes()))
        self._unapplied_values.update((key, (last, value)) for key, value in overlay.written())
        partition = self.partition
        if len(batches) == 1:
            return [
                PartitionResult(partition, prepared[0][1] + execution.outcomes, execution.changes, execution.streamed)
            ]
        return [
            PartitionResult(partition, rejected + outcomes, changes, streamed)
            for (_, rejected), (outcomes, changes, streamed) in zip(
                prepared, split(offsets, execution.outcomes, execution.changes, execution.streamed)
            )
        ]

    def _prepared(self, batch: Batch) -> tuple[list[PreparedTxn], list[Outcome]]:
        ahead = self._prepared_ahead
        self._prepared_ahead = None
        if ahead is not None and ahead[0] == batch.batch_id:
            return ahead[1]
        return prepare(batch, self.registry, self.partitioner, self.partition)

    def aria_counts(self) -> tuple[int, int]:
        """(transactions homed here in aria batches, how many of them the first pass did not decide)."""
        aria = self.scheduler if self.scheduler.name == "aria" else self._aria
        return (aria.transactions, aria.fallbacks) if aria is not None else (0, 0)

    def scheduler_for(self, batch: Batch) -> Scheduler:
        """An aria-stamped batch runs under aria whatever this worker's scheduler (its serial
        order is aria's, scheduler/aria.py); any other batch under this worker's own."""
        if batch.ordering is None:
            return self.scheduler
        if batch.ordering != ARIA:
            raise RuntimeError(
                f"batch {batch.batch_id} asks for ordering {batch.ordering!r}, which this engine "
                "does not know: run a version of Ordo that does"
            )
        if self.scheduler.name == "aria":
            return self.scheduler
        if self._aria is None:
            self._aria = make_scheduler("aria")
        return self._aria

    def _prepare_ahead(self, batch: Batch) -> None:
        """Decode and ANALYZE the next batch while this one waits for its peers' reads
        (preparing depends on the batch alone, not on the state). A batch that cannot be
        prepared is left for its turn, which reports why."""
        try:
            self._prepared_ahead = (batch.batch_id, prepare(batch, self.registry, self.partitioner, self.partition))
        except Exception:
            self._prepared_ahead = None

    @property
    def unapplied(self) -> int:
        return len(self._unapplied)

    def commit(self, marker: dict[str, Any]) -> None:
        """Apply the oldest executed batch and its marker in one atomic write."""
        if not self._unapplied or marker["batch"] != self._unapplied[0][0]:
            raise RuntimeError(f"partition {self.partition}: no executed batch {marker['batch']} to commit")
        applied = self.applied()
        if applied is not None and applied["batch"] >= marker["batch"]:
            raise RuntimeError(f"partition {self.partition}: batch {marker['batch']} is already applied")
        batch_id, first, writes = self._unapplied.popleft()
        self.shard.apply_batch(writes, marker, first if first != batch_id else None)
        values = self._unapplied_values
        for key in writes:  # now in the shard, unless a later unapplied batch wrote it again
            if values[key][0] == batch_id:
                del values[key]

    def memory(self) -> dict[str, int]:
        """This worker's process resident set and its shard's RocksDB memory, in bytes."""
        return {"resident": resident_bytes(), **self.shard.memory()}

    def checkpoint(self, path: str) -> dict[str, Any] | None:
        """A RocksDB checkpoint of the applied state (an executed, uncommitted batch lives
        only in memory, so it is not in it); returns the applied marker it holds."""
        marker = self.applied()
        self.shard.checkpoint(path)
        return marker

    def close(self) -> None:
        self.shard.close()
