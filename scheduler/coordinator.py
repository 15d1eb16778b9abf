"""The coordinator: starts the partition workers, which follow the log on their own
(`scheduler.follower`), and watches them: progress, the checkpoint manifest, stopping.
It is not on the data path: no batch and no output passes through it.

Each worker checkpoints its shard after the batches `checkpoint_every` marks, which the
log decides alike for every partition (recovery/cadence.py); once all have, the
coordinator lists the checkpoint. A checkpoint asked for at any other time holds every
worker at one batch first. On start, shards that disagree are restored from the newest
checkpoint (see `recovery/`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

from ordo.procedures.fingerprint import VersionBoundary
from ordo.procedures.registry import Registry
from ordo.recovery.cadence import DEFAULT_CHECKPOINT_EVERY, Cadence, cadence
from ordo.recovery.checkpoints import CheckpointError, CheckpointStore
from ordo.recovery.restore import AUTO, DataDirLock, check_log_holds, log_head_problem, prepare_shards
from ordo.scheduler.follower import FollowOptions
from ordo.scheduler.group import LocalGroup, WorkerGroup
from ordo.scheduler.liveness import CALL_TIMEOUT, Silence
from ordo.scheduler.outputs import CollectedOutputs
from ordo.scheduler.round import ROUND_TXNS
from ordo.storage.layout import check_layout, mark_publishing
from ordo.log.records import LogCursor
from ordo.log.reader import UNVERIFIED_SHOWN
from ordo.log.secret import log_keys, secret_source
from ordo.broker.topics import Topics

log = logging.getLogger("ordo.engine")


@dataclass(slots=True)
class EngineStats:
    batches: int = 0
    txns: int = 0  # outcomes of the executed batches
    applied_txns: int = 0  # outcomes of the applied batches (execution runs up to a pipeline ahead)
    committed: int = 0
    aborted: int = 0
    rejected: int = 0
    last_batch: int = 0  # applied on every partition
    # executed on every partition: the batch that `txns` and the outcome counts have reached
    # (applying waits for the broker's acknowledgements, a pipeline behind)
    executed_batch: int = 0
    checkpoints: int = 0
    dropped_records: int = 0  # log records passed over: forged, or named by `ordo log skip`


class Coordinator:
    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        data_dir: str,
        scheduler: str = "serial",
        partitions: int = 1,
        registry: Registry | None = None,
        sync: bool = False,
        runtime: str = "auto",
        ray_address: str | None = None,
        cores: list[int] | None = None,
        procedure_modules: tuple[str, ...] = (),
        outputs: CollectedOutputs | None = None,
        checkpoint_every: int | str | Cadence = DEFAULT_CHECKPOINT_EVERY,
        keep_checkpoints: int = 2,
        restore: str = AUTO,
        pipeline_depth: int = 8,
        kept_code: bool = True,
        round_txns: int = ROUND_TXNS,
        publish: bool = True,
        check_copies: bool = False,
    ):
        """`restore`: "auto" (restore only shards that disagree), "checkpoint" or "scratch".
        `outputs`: collect outcomes and change data here instead of publishing them;
        `publish=False` (and no `outputs`): publish them nowhere, and record that the data
        directory is not an engine's own (storage/layout.py); `check_copies`: every output
        published must equal the copy already on the topics under its key (a replay's).
        `checkpoint_every`: K batches, "Ts" (T seconds of log time) or 0 (never).
        `kept_code`: a worker behind the log may run a set the log moved past with the code
        the log keeps of it (procedures/kept.py). `round_txns`: a worker behind the log runs
        waiting batches as one round of up to this many transactions (0: one batch at a
        time; scheduler/round.py)."""
        check_layout(data_dir, partitions, namespace)
        self.bootstrap = bootstrap
        self.topics = Topics(namespace)
        self.stats = EngineStats()
        self._stop = threading.Event()
        self._checkpoint_requested = threading.Event()
        self.checkpoint_every = cadence(checkpoint_every)
        self._lock = DataDirLock(data_dir)
        try:
            if outputs is None:
                mark_publishing(data_dir, publish)
            self.checkpoints = CheckpointStore(data_dir, partitions, keep_checkpoints)
            self.recovery = prepare_shards(
                data_dir, partitions, self.checkpoints, restore, lambda: log_head_problem(bootstrap, self.topics.log)
            )
            self.group = make_group(
                data_dir, partitions, scheduler, registry, sync, runtime, ray_address, cores, procedure_modules
            )
        except BaseException:
            self._lock.release()
            raise
        self.cursor = self._resume_cursor()
        try:
            check_log_holds(bootstrap, self.topics.log, self.cursor)
        except BaseException:
            self._close_group()
            raise
        self.stats.last_batch = self.stats.executed_batch = self.cursor.next_batch - 1
        self.outputs = outputs
        self._options = FollowOptions(
            bootstrap,
            namespace,
            collect=outputs is not None,
            publish=publish,
            check_copies=check_copies and publish,
            checkpoints=self.checkpoint_every,
            checkpoint_root=self.checkpoints.root,
            depth=pipeline_depth,
            log_keys=log_keys(),
            log_secret_source=secret_source(),
            kept_code=kept_code,
            round_txns=round_txns,
        )
        self._started = False
        self._finished = False
        self._boundary_stop = False  # a worker stopped at a boundary: every other is asked to stop
        self._seen_batch = -1
        latest = self.checkpoints.latest()
        self._listed_checkpoint = latest["batch"] if latest else 0
        self._statuses: list[dict] = []
        self._lag_consumer = None  # see log_end
        self._reported_offset = -1  # the newest passed-over log record reported
        self._unsigned_in_row = 0  # records reported in a row as not signed with this engine's secret
        self._unverified_said = 0  # the workers' notes of it said so far
        self._closed = False

    def _resume_cursor(self) -> LogCursor:
        markers = self.group.applied()
        if all(m is None for m in markers):
            return LogCursor()
        batches = {m["batch"] if m else 0 for m in markers}
        if len(batches) != 1:  # prepare_shards made them agree; a worker must have moved on since
            raise RuntimeError(f"shards stopped at different batches {sorted(batches)}")
        return LogCursor.from_dict(markers[0]["cursor"], self.topics.namespace)

    def stop(self) -> None:
        self._stop.set()

    def request_checkpoint(self) -> None:
        """Checkpoint at the next batch boundary (safe from a signal handler or a thread)."""
        self._checkpoint_requested.set()

    # -- running ----------------------------------------------------------------------

    def start(self, until_batch: int | None = None, hold_at: int | None = None) -> None:
        """Start the workers; with `until_batch`, they stop once that batch is applied; with
        `hold_at`, they execute nothing after that batch until `group.hold(None)`."""
        if not self._started:
            self._started = True
            self.group.start(replace(self._options, stop_after=until_batch, hold_at=hold_at))

    def run(self, idle_exit: float | None = None, until_batch: int | None = None, progress=None) -> EngineStats:
        """Follow the log until stopped; with `idle_exit`, also stop after that many seconds
        without a new batch; with `until_batch`, stop once that batch is applied.
        `progress(stats)` is called a few times a second."""
        last_progress = time.monotonic()
        try:
            self.start(until_batch)
            while not self._stop.is_set():
                self.watch(0.05)
                if self.finished:
                    self._stop_at_boundary()
                    break
                if not self._boundary_stop and _diverged(self._statuses):
                    # One worker stopped where the log moves on and another went on with the new
                    # code (its app on disk read differently): all stop, and say why.
                    self._boundary_stop = True
                    self.group.stop()
                if self._checkpoint_requested.is_set():
                    self.checkpoint()
                now = time.monotonic()
                if self.stats.last_batch != self._seen_batch:
                    self._seen_batch, last_progress = self.stats.last_batch, now
                elif idle_exit is not None and now - last_progress > idle_exit:
                    break
                if progress is not None:
                    progress(self.stats)
        finally:
            self.close()
        return self.stats

    def _stop_at_boundary(self) -> None:
        """Every worker stopped where the log moves to a procedure set they do not run:
        checkpoint there, so a restart with that set never needs the code before it, and
        say so."""
        boundaries = [s["boundary"] for s in self._statuses if s.get("boundary")]
        if not boundaries:
            return
        boundary = boundaries[0]
        marker = self.group.applied()[0]
        if self.checkpoint_every.enabled and marker is not None and len(boundaries) == len(self._statuses):
            latest = self.checkpoints.latest()
            if latest is None or latest["batch"] != marker["batch"]:
                self.checkpoints.take(self.group, marker)
                self.stats.checkpoints += 1
        why = next((s["switch_refused"] for s in self._statuses if s.get("switch_refused")), None)
        raise version_boundary(self.topics.log, boundary, self._statuses[0].get("procedure_set"), why)

    def watch(self, seconds: float) -> list[dict]:
        """Let the workers run for up to `seconds`, then take their status (progress,
        checkpoints to list) and return it."""
        self._finished = self.group.drive(seconds)
        self._statuses = self.group.status()
        self._update(self._statuses)
        return self._statuses

    @property
    def statuses(self) -> list[dict]:
        """Every worker's status as the last watch took it (metrics read it from here)."""
        return self._statuses

    def silences(self) -> list[Silence]:
        """The partition workers whose answer the last watch still waited for."""
        return [
            Silence(f"partition {s['partition']}", s.get("pid"), s["unanswered_s"])
            for s in self._statuses
            if s.get("unanswered_s")
        ]

    @property
    def finished(self) -> bool:
        """Whether every worker has stopped."""
        return self._finished

    def _update(self, statuses: list[dict]) -> None:
        stats = self.stats
        stats.last_batch = min(s["applied"] for s in statuses)
        stats.executed_batch = min(s["executed"] for s in statuses)
        stats.committed = sum(s["committed"] for s in statuses)
        stats.aborted = sum(s["aborted"] for s in statuses)
        stats.rejected = sum(s["rejected"] for s in statuses)
        stats.txns = stats.committed + stats.aborted + stats.rejected
        stats.applied_txns = sum(s["applied_txns"] for s in statuses)
        stats.batches = stats.last_batch - (self.cursor.next_batch - 1)
        self._report_dropped(statuses)
        self._list_checkpoints(statuses)

    def _report_dropped(self, statuses: list[dict]) -> None:
        """One line per log record the workers passed over; every worker reads the same log,
        so the one that read furthest speaks for all."""
        ahead = max(statuses, key=lambda s: s["next_offset"])
        self.stats.dropped_records = ahead.get("dropped", 0)  # none before a worker follows the log
        for offset, why in ahead.get("dropped_records", ()):
            if offset > self._reported_offset:
                self._reported_offset = offset
                unsigned = why.startswith("not signed")
                self._unsigned_in_row = self._unsigned_in_row + 1 if unsigned else 0
                if self._unsigned_in_row <= UNVERIFIED_SHOWN:  # then one line says why (LogReader)
                    log.warning("passed over the record at offset %d of %s: %s", offset, self.topics.log, why)
        if not ahead.get("unverified"):
            self._unsigned_in_row = 0
        note = ahead.get("unverified_note")
        if note and note[0] > self._unverified_said:
            self._unverified_said = note[0]
            log.error("%s", note[1])

    def _list_checkpoints(self, statuses: list[dict]) -> None:
        """List the checkpoints every worker has taken since the last one listed."""
        taken = [dict((batch, cursor) for batch, cursor in s["checkpointed"]) for s in statuses]
        common = set(taken[0]).intersection(*taken[1:])
        newest = self._listed_checkpoint
        for batch in sorted(b for b in common if b > newest):
            self.checkpoints.record(batch, taken[0][batch])
            self._listed_checkpoint = batch
            self.stats.checkpoints += 1

    def checkpoint(self) -> dict | None:
        """Checkpoint every shard at one batch: hold every worker after the last batch any
        of them has executed, wait until all have applied it, checkpoint, go on. Returns
        the manifest entry, or None while no batch is applied or once the engine is stopping."""
        self._checkpoint_requested.clear()
        latest = self.checkpoints.latest()
        if not self._started:  # the shards agree (see prepare_shards) and nothing runs
            marker = self.group.applied()[0]
            if marker is None:
                return None
            if latest is not None and latest["batch"] == marker["batch"]:
                return latest
            self.stats.checkpoints += 1
            return self.checkpoints.take(self.group, marker)
        target = max(_reached(s) for s in self.group.status())
        if target < 1:
            return None
        if latest is not None and latest["batch"] == target:
            return latest
        self.group.hold(target)
        try:
            while True:
                statuses = self.watch(0.01)
                beyond = max(_reached(s) for s in statuses)
                if beyond > target:  # a worker went past before the hold reached it: hold there
                    target = beyond
                    self.group.hold(target)
                    continue
                if all(s["applied"] == target and s["unapplied"] == 0 for s in statuses):
                    break
                if self.finished:
                    raise CheckpointError(f"the workers stopped before batch {target} was applied on every shard")
                if self._stop.is_set():
                    return None  # stopping comes first; the workers checkpoint on their own too
                silent = [silence for silence in self.silences() if silence.seconds >= CALL_TIMEOUT]
                if silent:
                    raise CheckpointError(
                        f"{silent[0]}: no checkpoint of batch {target} could be taken; restart the engine to recover"
                    )
            entry = self.checkpoints.take(self.group, self.group.applied()[0])
            self.stats.checkpoints += 1
            self._listed_checkpoint = max(self._listed_checkpoint, target)
            return entry
        finally:
            self.group.hold(None)

    def log_lag(self) -> int | str:
        """Log records not yet read by the slowest worker, counted from where its reader
        stands (past transaction markers), so an idle engine at the log's end reads 0; for
        display only (some brokers misreport watermarks)."""
        if not self._statuses:
            return "?"
        try:
            return max(0, self.log_end(timeout=0.5) - self.read_position())
        except Exception:
            return "?"

    def unapplied_lag(self) -> int | str:
        """Log records past the last batch the slowest worker applied, up to the log's head
        now: what a replay has left, however far its readers have read ahead; for display
        only."""
        if not self._statuses:
            return "?"
        try:
            return max(0, self.log_end(timeout=0.5) - min(s["applied_offset"] for s in self._statuses))
        except Exception:
            return "?"

    def read_position(self) -> int:
        """The log offset every worker has read up to, as the last watch saw it."""
        return min(s["position"] for s in self._statuses)

    def log_end(self, timeout: float) -> int:
        """The log's end offset (its high watermark), asked of the broker; raises if it does
        not answer within `timeout`. The consumer asked is never assigned, so never fetching:
        the broker answers it at once (a consumer with a fetch outstanding would be answered
        only after that fetch)."""
        from confluent_kafka import Consumer, TopicPartition

        from ordo.broker.clients import kafka_config

        if self._lag_consumer is None:
            self._lag_consumer = Consumer(
                kafka_config(self.bootstrap, {"group.id": f"{self.topics.namespace}.lag", "enable.auto.commit": False})
            )
        return self._lag_consumer.get_watermark_offsets(
            TopicPartition(self.topics.log, 0), timeout=timeout, cached=False
        )[1]

    def close(self) -> None:
        """Stop the workers; what they executed is applied once its outputs are out."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._started:
                self.group.stop()
                deadline = time.monotonic() + 60
                while not self.finished:
                    self.watch(0.1)
                    if time.monotonic() > deadline:
                        raise RuntimeError("partition workers did not stop within 60 s")
                if self.outputs is not None:
                    for collected in self.group.collected():
                        self.outputs.merge(collected)
        finally:
            if self._lag_consumer is not None:
                self._lag_consumer.close()
            self._close_group()

    def _close_group(self) -> None:
        try:
            self.group.close()
        finally:
            self._lock.release()


def _reached(status: dict) -> int:
    """The last batch a worker has executed or is executing (the last of its round)."""
    return max(status["executed"], status.get("executing", 0))


def _diverged(statuses: list[dict]) -> bool:
    """Whether a worker stopped at a procedure set's boundary that another executed past."""
    stops = [s["boundary"]["batch"] for s in statuses if s.get("boundary")]
    return bool(stops) and any(s["executed"] >= min(stops) for s in statuses)


def version_boundary(log: str, boundary: dict, ours: int | None, why: str | None = None) -> VersionBoundary:
    from ordo.procedures.fingerprint import short

    batch, identity, version = boundary["batch"], boundary["procedures"], boundary["version"]
    name = f"v{version} ({short(identity)})" if version else short(identity)
    because = f" ({why})" if why else ""
    return VersionBoundary(
        f"{log} runs procedure set {name} from batch {batch}, and this engine runs {short(ours)}{because}: every batch "
        f"before {batch} is applied; to go on, start the engine with the procedures of {name} (after "
        f"`ordo upgrade`, the new --app); to replay across versions, give `ordo recover` each version's app "
        f"(--app-version) (docs/operations.md, 'Upgrading procedures')",
        batch,
        identity,
        version,
    )


def make_group(
    data_dir: str,
    partitions: int,
    scheduler: str,
    registry: Registry | None,
    sync: bool,
    runtime: str,
    ray_address: str | None,
    cores: list[int] | None,
    procedure_modules: tuple[str, ...],
) -> WorkerGroup:
    """`local`: workers in this process; `ray`: one Ray actor per partition; `auto`: Ray
    when there is more than one partition."""
    if runtime == "auto":
        runtime = "ray" if partitions > 1 or ray_address else "local"
    if runtime == "local":
        return LocalGroup(data_dir, partitions, scheduler, registry, sync, procedure_modules)
    if runtime == "ray":
        if registry is not None:
            raise ValueError("Ray workers build their registry from procedure modules, not a Registry object")
        from ordo.scheduler.ray_group import RayGroup

        return RayGroup(data_dir, partitions, scheduler, sync, procedure_modules, ray_address, cores)
    raise ValueError(f"unknown runtime '{runtime}' (local, ray or auto)")
