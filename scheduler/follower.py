"""A partition worker following the log on its own (Calvin's log forwarding): it reads
`<ns>.log`, takes its slice of every batch, executes it, publishes its own outcomes and
change data, and applies the batch to its shard once the broker has acknowledged them.

No process carries batches to the workers or outputs back from them, so adding
partitions adds readers, executors and producers, and nothing is serialized through
one process.

Pipelining: a batch executes while the outputs of the batches before it are still in
flight (up to `depth` batches). The rules stay those of one batch at a time: a batch is
applied only after all of its outputs are acknowledged, batches are applied in log order,
and each applied batch carries its marker in the same atomic write.

Checkpoints are taken by each worker on its own, after the batches the log itself marks
for every partition alike (recovery/cadence.py); the coordinator lists a checkpoint once
every partition has taken it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from ordo.procedures.ollp import RECONNOITRED, RESTARTED, first_pass
from ordo.procedures.environment import differences_here
from ordo.procedures.fingerprint import (
    ENVIRONMENT,
    describe,
    differences,
    identities,
    is_versioned,
    refused_start,
    set_id,
)
from ordo.procedures.kept import registry_from
from ordo.procedures.registry import Registry
from ordo.procedures.reload import registry_for
from ordo.log.versions import current_set, kept_code, logged_set
from ordo.recovery.cadence import Cadence
from ordo.recovery.checkpoints import shard_checkpoint_path
from ordo.scheduler.execution import ABORTED, COMMITTED
from ordo.scheduler.outputs import (
    CollectedOutputs,
    CopyCheck,
    KafkaOutputs,
    OutputLost,
    OutputSink,
    UnpublishedOutputs,
)
from ordo.scheduler.reads import ReadServer
from ordo.scheduler.round import ROUND_BATCHES, ROUND_TXNS, joins
from ordo.scheduler.worker import PartitionWorker
from ordo.log.records import Batch, LogCursor, LogError, Start
from ordo.log.secret import use_keys
from ordo.log.reader import LogReader
from ordo.broker.topics import Topics

KEPT_CHECKPOINT_REPORTS = 16
KEPT_DROPPED_REPORTS = 16  # passed-over log records a status names; the coordinator asks many times a second
log = logging.getLogger("ordo.engine")
MEMORY_EVERY = 1.0  # seconds between two reads of a worker's memory for its status
READS_WAIT = 0.005  # how long one log poll may block while reads wait for the log to be read on

# Upper bounds (seconds) of the batch latency histogram in the status (ordo/metrics.py).
BATCH_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class FollowOptions:
    """How every partition worker follows the log (the same for all of them)."""

    bootstrap: str
    namespace: str
    collect: bool = False  # keep outputs in memory (tests, comparisons) instead of Kafka
    publish: bool = True  # publish outputs to the namespace's topics (else, with collect False, nowhere)
    check_copies: bool = False  # refuse an output that differs from the copy already published (a replay)
    checkpoints: Cadence = Cadence()  # which batches to checkpoint after (recovery/cadence.py)
    checkpoint_root: str | None = None  # the data directory's checkpoint folder
    depth: int = 8  # executed batches whose outputs may be in flight at once
    idle_wait: float = 0.05  # how long one log poll may block when nothing is ready
    stop_after: int | None = None  # stop once this batch is applied
    hold_at: int | None = None  # execute nothing after this batch until released
    in_place: bool = True  # at a procedure set's boundary, go on with its code where it is at hand
    kept_code: bool = True  # that code may be the log's own, for a set the log has moved past
    log_keys: tuple[bytes, ...] | None = None  # the driver's log secrets (log/secret.py), for workers
    log_secret_source: str = ""  # where the driver found them
    # Waiting batches executed as one round, up to this many transactions (scheduler/round.py);
    # 0: one batch at a time.
    round_txns: int = ROUND_TXNS


class LogFollower:
    def __init__(self, worker: PartitionWorker, options: FollowOptions, sink: OutputSink | None = None):
        self.worker = worker
        self.options = options
        self.partition = worker.partition
        topics = Topics(options.namespace)
        if sink is None:
            sink = (
                CollectedOutputs()
                if options.collect
                else KafkaOutputs(
                    options.bootstrap,
                    topics,
                    copies=CopyCheck(options.bootstrap, topics) if options.check_copies else None,
                )
                if options.publish
                else UnpublishedOutputs()
            )
        self.sink = sink
        if options.log_keys is not None:
            use_keys(options.log_keys, options.log_secret_source)
        marker = worker.applied()
        self.cursor = LogCursor.from_dict(marker["cursor"], options.namespace) if marker else LogCursor()
        self.procedure_set = set_id(describe(worker.registry))
        # the only set this worker runs batches with, in every form a log may name it
        self.procedure_sets = identities(worker.registry)
        # Generations (start record offsets) of a log from before versions whose start record
        # names procedures this worker lacks: one of their batches that needs them stops it.
        self._foreign_generations: dict[int, list[str]] = {}
        self.boundary: dict | None = None  # where the log moved to another procedure set
        self.switches: list[tuple[int, int]] = []  # (batch, set) where this worker upgraded in place
        self.switch_refused: str | None = None  # why it could not, at the boundary
        self.applied = self.executed = self.cursor.next_batch - 1
        self._last_time_ms = self.cursor.time_ms  # the log time of the last batch taken (0: none yet)
        self.executing = self.executed  # the last batch of the round being executed
        self._reader = LogReader(
            options.bootstrap,
            topics.log,
            self.cursor,
            f"{options.namespace}.engine-{self.partition}",
            self._check_procedures,
            self._dropped,
            on_unverified=self._unverified,
        )
        # Log records passed over (forged, or named by a skip record): how many, the latest ones.
        self.dropped = 0
        self.dropped_records: deque[tuple[int, str]] = deque(maxlen=KEPT_DROPPED_REPORTS)
        self.unverified_note: tuple[int, str] | None = None  # (how many so far, the latest) for the coordinator
        self._ready: deque[tuple[Batch, dict]] = deque()  # read, not yet executed
        # executed: (batch id, cursor after it, outcomes, whether to checkpoint after it)
        self._unapplied: deque[tuple[int, dict, int, bool]] = deque()
        self.hold_at = options.hold_at  # execute no batch after this one until released
        self.stop_after = options.stop_after
        self._stopping = False
        self.running = False
        self.error: str | None = None
        self.applied_at = 0.0  # time.monotonic() when the last batch was applied
        self.applied_offset = self.cursor.next_offset  # the log offset after the last batch applied
        # Outcomes of the applied batches: `counts` grows as batches execute, which runs up to
        # a pipeline ahead of `applied`; a rate over applied batches needs this one.
        self.applied_txns = 0
        self.counts = {COMMITTED: 0, ABORTED: 0, "rejected": 0, RESTARTED: 0, RECONNOITRED: 0}
        self.checkpointed: deque[tuple[int, dict]] = deque(maxlen=KEPT_CHECKPOINT_REPORTS)  # (batch, cursor)
        self.busy_s = 0.0  # time spent executing batches
        self.rounds = 0  # executions: a batch alone, or several batches as one round
        # Sequencer's batch time -> executed here: counts per bucket (the last: beyond them), sum.
        self.latency_counts = [0] * (len(BATCH_LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self._memory_at, self._memory_seen = float("-inf"), {}
        # Live reads of what this shard has applied (scheduler/reads.py), where outputs go to Kafka.
        self.reads = (
            ReadServer(
                options.bootstrap,
                options.namespace,
                worker,
                busy=lambda: bool(self._ready),
                behind=lambda: max(0, self.cursor.next_batch - 1 - self.applied),
            )
            if isinstance(sink, KafkaOutputs)
            else None
        )

    # -- control, from the coordinator ------------------------------------------------

    def stop(self) -> None:
        """Stop after the batch being executed; what was executed is still applied."""
        self._stopping = True

    def status(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "executed": self.executed,
            "executing": self.executing,
            "applied": self.applied,
            "applied_at": self.applied_at,
            "applied_offset": self.applied_offset,
            "applied_txns": self.applied_txns,
            "unapplied": len(self._unapplied),
            "next_offset": self.cursor.next_offset,
            "read_batch": self.cursor.next_batch - 1,  # the newest batch read, executed or not
            "position": self._reader.position(),
            # read and not yet executed, the round being executed included
            "ready": len(self._ready) + (self.executing - self.executed),
            "committed": self.counts[COMMITTED],
            "aborted": self.counts[ABORTED],
            "rejected": self.counts["rejected"],
            "restarted": self.counts[RESTARTED],
            "reconnoitred": self.counts[RECONNOITRED],
            "busy_s": self.busy_s,
            "rounds": self.rounds,
            "latency_counts": list(self.latency_counts),
            "latency_sum": self.latency_sum,
            "checkpointed": list(self.checkpointed),
            "dropped": self.dropped,
            "dropped_records": list(self.dropped_records),
            "unverified": self.cursor.unverified,
            "unverified_note": self.unverified_note,
            "running": self.running,
            "error": self.error,
            "memory": self.worker.memory(),
            "aria": self.worker.aria_counts(),
            "boundary": self.boundary,
            "switches": list(self.switches),
            "switch_refused": self.switch_refused,
            "procedure_set": self.procedure_set,
            "reads_served": self.reads.served if self.reads is not None else 0,
        }

    # -- the loop -----------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        self.running = True
        try:
            try:
                await self._follow()
                await self._apply_delivered(limit=0)
            except OutputLost:
                # A broker restarted without its data refuses writes to topics it never had,
                # often before the log's watch has seen the other cluster: that loss is the cause.
                self._reader.check_broker_now()
                raise
        except BaseException as exc:
            self.error = (
                f"partition {self.partition}: {exc}"
                if str(exc)
                else f"partition {self.partition}: {type(exc).__name__}"
            )
            raise
        finally:
            self.running = False
            self._reader.close()
            if self.reads is not None:
                self.reads.close()
        return self.status()

    async def _follow(self) -> None:
        while not self._stopping:
            if self.stop_after is not None and self.executed >= self.stop_after:
                return
            if self.hold_at is not None and self.executed >= self.hold_at:
                await self._apply_delivered(limit=0)
                await asyncio.sleep(0.002)
                continue
            if self._at_boundary():
                return
            if self.reads is not None and self.reads.waiting:
                self._resolve_reads()
            if not self._ready and not self._read(0):
                if self._unapplied:
                    await self._apply_delivered(limit=0)
                else:
                    self._read(READS_WAIT if self.reads is not None and self.reads.waiting else self.options.idle_wait)
                await asyncio.sleep(0)  # let control calls and peers' reads in
                continue
            if self._at_boundary():
                return
            await self._execute(*self._take_round())
            # A batch may run to its end without suspending (no remote reads to wait for):
            # yield once per batch, so control calls and peers are served under load too.
            await asyncio.sleep(0)

    def _resolve_reads(self) -> None:
        """Reads for every batch below a log offset, given the batches read and not applied."""
        reads = self.reads
        assert reads is not None
        pending = [(batch_id, cursor["next_offset"]) for batch_id, cursor, _, _ in self._unapplied]
        pending += [(batch.batch_id, cursor["next_offset"]) for batch, cursor in self._ready]
        reads.resolve(self._reader.position(), pending)
        reads.expire(time.time())

    def _at_boundary(self) -> bool:
        """Whether the next batch belongs to a procedure set other than this worker's (its
        batch says so, or an upgrade record came before it): stop before it, as every
        partition does at the same batch. A log from before versions names no set in its
        batches: a batch of a generation whose start record names procedures this worker
        lacks stops it, unless nothing in it needs them (every entry rejected)."""
        if self._ready:
            batch = self._ready[0][0]
            identity = batch.procedures
            if identity is None:
                problems = self._foreign_generations.get(batch.generation)
                if problems and any(proc is not None for _, proc, _ in batch.entries):
                    raise refused_start(problems)
                return False
            at = batch.batch_id
        else:
            named = self.cursor.procedures
            if self.cursor.upgraded is None or named is None:
                return False
            identity, at = named[1], self.cursor.next_batch
        if identity in self.procedure_sets or self._switch(identity, at):
            return False
        version = self.cursor.versions.get(identity)
        self.boundary = {"batch": at, "procedures": identity, "version": version}
        return True

    def _switch(self, identity: int, at: int) -> bool:
        """An upgrade in place: go on with the set `identity` names from batch `at` when this
        process ran it before or its app's files on disk are it now (procedures/reload.py)."""
        if not self.options.in_place:
            return False
        kept = (lambda: self._kept_code(identity)) if self.options.kept_code else None
        registry, how = registry_for(identity, self.worker.procedure_modules, self.worker.registry, kept)
        if registry is None and self.options.kept_code and self._behind(identity):
            registry = self._kept(identity)  # a set the log has moved past is history: any app's
        if registry is None:
            self.switch_refused = how + self._environment_note(identity)
            return False
        self.worker.use(registry)
        self.procedure_set = set_id(describe(registry))
        self.procedure_sets = identities(registry)
        self.switches.append((at, identity))
        return True

    def _environment_note(self, identity: int) -> str:
        """Where set `identity` was recorded in an environment this process does not have
        (a library it imported before the library changed), that difference."""
        try:
            found = logged_set(self.options.bootstrap, self.options.namespace, identity, 10)
        except Exception:
            return ""
        if found is None or ENVIRONMENT not in found[0]:
            return ""
        differing = differences_here(found[0][ENVIRONMENT])
        return (
            f"; this process runs in another environment than the set's ({'; '.join(differing)})" if differing else ""
        )

    def _behind(self, identity: int) -> bool:
        """Whether the log has moved past set `identity` already (an engine catching up): its
        code is then history, and the log's own. As far as this worker has read, else as the
        log's end says."""
        if identity not in self.cursor.named_at:
            return False
        named = self.cursor.procedures
        if named is not None and named[1] != identity:
            return True
        try:
            now = current_set(self.options.bootstrap, Topics(self.options.namespace).log, 10)
        except Exception:
            return False
        return now is not None and now.identity != identity

    def _kept_code(self, identity: int) -> bytes | None:
        """The code the log keeps of set `identity`, where it keeps it."""
        if identity not in self.cursor.named_at:
            return None
        try:
            return kept_code(
                self.options.bootstrap, self.options.namespace, identity, at=self.cursor.named_at[identity]
            )
        except Exception:
            return None

    def _kept(self, identity: int) -> Registry | None:
        """The set `identity` from the code the log keeps of it, whichever app's it is."""
        packed = self._kept_code(identity)
        return registry_from(packed, identity) if packed else None

    def _check_procedures(self, start: Start) -> None:
        """A start record of a log from before versions names its procedure set by its
        arguments only: note a generation this worker could not run. (A versioned log's
        batches name their set themselves.)"""
        if start.procedures is not None and not is_versioned(start.procedures):
            problems = differences(start.procedures, describe(self.worker.registry, code=False))
            if problems:
                lane = self.cursor.lanes.get(start.sequencer)
                if lane is not None:
                    self._foreign_generations[lane[0]] = problems

    def _dropped(self, offset: int, why: str) -> None:
        self.dropped += 1
        self.dropped_records.append((offset, why))

    def _unverified(self, line: str) -> None:
        said = self.unverified_note[0] if self.unverified_note else 0
        self.unverified_note = (said + 1, line)

    def _read(self, timeout: float) -> int:
        try:
            batches = self._reader.poll(timeout, 1000)
        except LogError as exc:
            raise LogError(f"cannot replay {self._reader.topic} from batch {self.cursor.next_batch}: {exc}") from None
        self._ready.extend(batches)
        return len(batches)

    def _take_round(self) -> tuple[list[tuple[Batch, dict]], bool]:
        """The next batch, with the batches waiting after it that may run in its round
        (scheduler/round.py): one batch when the engine keeps up, several when it lags;
        and whether to checkpoint after the round (a batch to checkpoint ends its round)."""
        ready = self._ready
        taken = [ready.popleft()]
        first = taken[0][0]
        checkpoint = self._checkpoint_after(first)
        limit = self.options.round_txns
        if not limit or checkpoint or self._held_after(first.batch_id):
            return taken, checkpoint
        if len(ready) < ROUND_BATCHES:
            self._read(0)
        txns = len(first)
        while ready and len(taken) < ROUND_BATCHES:
            batch = ready[0][0]
            txns += len(batch)
            if txns > limit or not joins(first, batch):
                break
            taken.append(ready.popleft())
            checkpoint = self._checkpoint_after(batch)
            if checkpoint or self._held_after(batch.batch_id):
                break
        return taken, checkpoint

    def _checkpoint_after(self, batch: Batch) -> bool:
        """Whether `batch`, taken now, is one to checkpoint after (recovery/cadence.py); its
        time becomes the one before the next batch's."""
        due = self.options.checkpoints.due(batch.batch_id, batch.time_ms, self._last_time_ms)
        self._last_time_ms = batch.time_ms
        return due

    def _held_after(self, batch_id: int) -> bool:
        """Whether the worker is to stop or hold after `batch_id`, which then ends its round."""
        return (
            (self.stop_after is not None and batch_id >= self.stop_after)
            or (self.hold_at is not None and batch_id >= self.hold_at)
            or (self.reads is not None and self.reads.ends_round(batch_id))
        )

    async def _execute(self, taken: list[tuple[Batch, dict]], checkpoint: bool) -> None:
        started = time.perf_counter()
        batches = [batch for batch, _ in taken]
        self.executing = batches[-1].batch_id
        results = await self.worker.execute_round(batches, upcoming=self._ready[0][0] if self._ready else None)
        self.busy_s += time.perf_counter() - started
        self.rounds += 1
        now = time.time()
        counts, outcomes = self.counts, 0
        for batch, result in zip(batches, results):
            self._observe_latency(now - batch.time_ms / 1000)
            self.sink.publish(
                batch.batch_id, len(batch), result.outcomes, result.changes, result.streamed, time_ms=batch.time_ms
            )
            for outcome in result.outcomes:
                status = outcome.status
                if status == RESTARTED and first_pass(outcome.result):
                    status = RECONNOITRED
                counts[status] += 1
            outcomes += len(result.outcomes)
        last, cursor = taken[-1]
        self._unapplied.append((last.batch_id, cursor, outcomes, checkpoint))
        self.executed = last.batch_id
        if log.isEnabledFor(logging.DEBUG):
            what = (
                f"batch {last.batch_id}"
                if len(batches) == 1
                else f"batches {batches[0].batch_id}-{last.batch_id} (one round)"
            )
            log.debug(
                "partition %d: %s executed (%d outcomes, %d changes) in %.1f ms, %.1f ms after it was cut",
                self.partition,
                what,
                outcomes,
                sum(len(result.changes) for result in results),
                (time.perf_counter() - started) * 1000,
                max(0.0, now * 1000 - batches[0].time_ms),
            )
        await self._apply_delivered(limit=self.options.depth)

    def _observe_latency(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.latency_sum += seconds
        for i, bound in enumerate(BATCH_LATENCY_BUCKETS):
            if seconds <= bound:
                self.latency_counts[i] += 1
                return
        self.latency_counts[-1] += 1

    async def _apply_delivered(self, limit: int) -> None:
        """Apply, in order, the executed batches whose outputs are acknowledged; wait for
        acknowledgements while more than `limit` batches are left unapplied."""
        unapplied, sink = self._unapplied, self.sink
        while unapplied:
            batch_id, cursor, outcomes, checkpoint = unapplied[0]
            if not sink.delivered(batch_id):
                if len(unapplied) <= limit:
                    return
                # Outputs a broker that lost its data never acknowledges: say so, do not wait.
                self._reader.check_broker()
                sink.wait(0.002)
                await asyncio.sleep(0)
                continue
            unapplied.popleft()
            self.worker.commit({"batch": batch_id, "cursor": cursor})
            self.applied = batch_id
            log.debug(
                "partition %d: batch %d applied to the shard (its outputs acknowledged)", self.partition, batch_id
            )
            self.applied_at = time.monotonic()
            self.applied_offset = cursor["next_offset"]
            self.applied_txns += outcomes
            if self.reads is not None:
                self.reads.applied(batch_id)
            if checkpoint and self.options.checkpoint_root:
                self._checkpoint(batch_id, cursor)

    def _checkpoint(self, batch_id: int, cursor: dict) -> None:
        path = shard_checkpoint_path(self.options.checkpoint_root, batch_id, self.partition)
        if os.path.exists(path):  # an earlier attempt at this batch, cut short
            shutil.rmtree(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.worker.checkpoint(path)
        self.checkpointed.append((batch_id, cursor))

    def close(self) -> None:
        self.sink.close()
