"""What an engine does with its shards before the partition workers open them.

- The shards' applied markers all name the same batch: continue from there (a normal
  restart; the log is replayed from that batch on).
- Otherwise — shards stopped at different batches (one worker's commit landed, another's
  did not), a shard is missing or cannot be opened, or the user asked for it — every
  shard is replaced by its copy in the newest complete checkpoint, and the log is replayed
  from the checkpoint's batch.
- With no checkpoint, every shard is wiped and the log is replayed from its beginning
  (as for new shards, which need nothing done).

Replacing a shard is crash-safe: the copy is built beside it, the old shard is renamed
away, the copy renamed in. A crash in between leaves a shard missing or the shards
disagreeing, and the next start restores again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from recovery.checkpoints import CheckpointError, CheckpointStore, copy_checkpoint, fsync_dir
from scheduler.worker import shard_path
from sequencer.log import LogCursor
from sequencer.reader import log_consumer
from storage.rocks import RocksShard

AUTO = "auto"  # continue if the shards agree, else restore (or rebuild)
CHECKPOINT = "checkpoint"  # restore from the newest checkpoint whatever the shards say
SCRATCH = "scratch"  # wipe the shards and rebuild from the beginning of the log
MODES = (AUTO, CHECKPOINT, SCRATCH)

_STAGING = ".restoring"
_DISCARDED = ".discarded"
LOCK_FILE = "ordo.lock"


class RecoveryError(RuntimeError):
    """The shards cannot be brought back: the message says why and what to do."""


@dataclass(slots=True)
class ShardState:
    partition: int
    marker: dict[str, Any] | None = None
    problem: str | None = None  # "missing", "unreadable (…)"; None: opened (marker None: nothing applied)


@dataclass(slots=True)
class Plan:
    action: str  # "resume", "fresh", "restore" or "rebuild"
    reason: str
    checkpoint: dict[str, Any] | None = None
    cleaned: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.action == "restore":
            return f"restored every shard from the checkpoint of batch {self.checkpoint['batch']} ({self.reason})"
        if self.action == "rebuild":
            return f"wiped the shards to rebuild them from the beginning of the log ({self.reason})"
        return self.reason


def inspect_shards(data_dir: str, partitions: int) -> list[ShardState]:
    states = []
    for p in range(partitions):
        path = shard_path(data_dir, p)
        if not os.path.isdir(path) or not os.listdir(path):
            states.append(ShardState(p, problem="missing"))
            continue
        try:
            with RocksShard(path, read_only=True) as shard:
                states.append(ShardState(p, shard.applied()))
        except Exception as exc:
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            states.append(ShardState(p, problem=f"unreadable ({first_line[:200]})"))
    return states


def _disagreement(states: list[ShardState]) -> str | None:
    """Why these shards cannot simply continue; None if they can."""
    broken = [f"shard {s.partition} is {s.problem}" for s in states if s.problem]
    if broken:
        return "; ".join(broken)
    batches = {s.partition: (s.marker or {}).get("batch", 0) for s in states}
    if len(set(batches.values())) > 1:
        return "shards stopped at different batches " + ", ".join(f"{p}: {b}" for p, b in batches.items())
    return None


def prepare_shards(data_dir: str, partitions: int, store: CheckpointStore, mode: str = AUTO) -> Plan:
    """Bring the shards to a state all of them agree on (see the module docstring).
    Call it before any worker opens a shard, holding the data directory's lock."""
    if mode not in MODES:
        raise ValueError(f"unknown recovery mode '{mode}' ({', '.join(MODES)})")
    cleaned = _clean_staging(data_dir, partitions) + store.clean()
    if mode == SCRATCH:
        _wipe(data_dir, partitions)
        return Plan("rebuild", "asked to rebuild from scratch", cleaned=cleaned)
    latest = store.latest()
    if mode == CHECKPOINT:
        if latest is None:
            raise RecoveryError(f"no complete checkpoint in {data_dir}: start without --from-checkpoint, "
                                "or rebuild the shards from the log with --from-scratch")
        restore(data_dir, store, latest)
        return Plan("restore", "asked to restore from a checkpoint", latest, cleaned)
    states = inspect_shards(data_dir, partitions)
    if all(s.marker is None and s.problem in (None, "missing") for s in states):
        if latest is None:
            return Plan("fresh", "new shards", cleaned=cleaned)
        reason = "no shard holds applied state"
    else:
        reason = _disagreement(states)
        if reason is None:
            batch = states[0].marker["batch"]
            return Plan("resume", f"shards agree: applied through batch {batch}", cleaned=cleaned)
    if latest is not None:
        restore(data_dir, store, latest)
        return Plan("restore", reason, latest, cleaned)
    _wipe(data_dir, partitions)
    return Plan("rebuild", f"{reason}; no checkpoint", cleaned=cleaned)


def restore(data_dir: str, store: CheckpointStore, entry: dict[str, Any]) -> None:
    for p, source in enumerate(store.shard_dirs(entry)):
        target = shard_path(data_dir, p)
        staging = target + _STAGING
        if os.path.exists(staging):
            shutil.rmtree(staging)
        try:
            copy_checkpoint(source, staging)
        except OSError as exc:
            raise CheckpointError(f"cannot copy checkpoint {source}: {exc}") from None
        _replace(target, staging)
    fsync_dir(data_dir)
    batches = [(s.marker or {}).get("batch") if not s.problem else s.problem
               for s in inspect_shards(data_dir, store.partitions)]
    if any(b != entry["batch"] for b in batches):
        raise CheckpointError(f"checkpoint of batch {entry['batch']} restored shards at {batches}")


def _replace(target: str, staging: str | None) -> None:
    discarded = target + _DISCARDED
    if os.path.exists(discarded):
        shutil.rmtree(discarded)
    if os.path.exists(target):
        os.rename(target, discarded)
    if staging is not None:
        os.rename(staging, target)
    if os.path.exists(discarded):
        shutil.rmtree(discarded)


def _wipe(data_dir: str, partitions: int) -> None:
    for p in range(partitions):
        _replace(shard_path(data_dir, p), None)
    fsync_dir(data_dir)


def _clean_staging(data_dir: str, partitions: int) -> list[str]:
    removed = []
    for p in range(partitions):
        for suffix in (_STAGING, _DISCARDED):
            path = shard_path(data_dir, p) + suffix
            if os.path.exists(path):
                shutil.rmtree(path)
                removed.append(path)
    return removed


class DataDirLock:
    """One engine per data directory: restoring shards under a running engine would
    destroy them. The kernel drops the lock when the process dies, however it dies."""

    def __init__(self, data_dir: str):
        os.makedirs(data_dir, exist_ok=True)
        self._file = open(os.path.join(data_dir, LOCK_FILE), "a")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise RecoveryError(f"another engine is using {data_dir}") from None

    def release(self) -> None:
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()


def check_log_holds(bootstrap: str, topic: str, cursor: LogCursor) -> None:
    """Fail clearly when the log has been truncated past where replay must start. A
    consumer asked for an offset the log no longer holds would otherwise jump to the end
    and see nothing wrong until the next batch. Only a low watermark above the cursor is
    acted on; a broker that cannot say is caught later by the batch-id check."""
    consumer = log_consumer(bootstrap, f"{topic}.recovery-check")
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5, cached=False)
    except Exception:
        return
    finally:
        consumer.close()
    if low > cursor.next_offset:
        raise RecoveryError(
            f"the log no longer holds batch {cursor.next_batch}: replay must start at offset "
            f"{cursor.next_offset} of {topic}, which begins at offset {low} now")
