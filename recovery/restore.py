"""What an engine does with its shards before the partition workers open them.

- The shards' applied markers all name the same batch: continue from there (a normal
  restart; the log is replayed from that batch on).
- Otherwise — shards stopped at different batches (one worker's commit landed, another's
  did not), a shard is missing or cannot be opened, or the user asked for it — every
  shard is replaced by its copy in the newest complete checkpoint, and the log is replayed
  from the checkpoint's batch.
- With no checkpoint, every shard is wiped and the log is replayed from its beginning
  (as for new shards, which need nothing done) — but only once the log is seen to begin
  with a sequencer's start record: shards holding state are never wiped for a log that
  cannot rebuild them (emptied by a broker that lost it, or its head deleted).

A checkpoint can be broken: a file of it missing or damaged. Checkpoints are tried newest
first; one whose copy cannot be made, opened, or read through with every block's checksum
verified is reported on stderr in one line and the next older one is tried. When none
works, the shards are rebuilt from the beginning of the log (the engine then checks that
the log still holds it), or, if a checkpoint was asked for, recovery stops and says why.

Replacing the shards is crash-safe: every shard's copy is built and checked beside it
before any live shard is touched; then each old shard is renamed away and its copy
renamed in. A crash in between leaves a shard missing or the shards disagreeing, and the
next start restores again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from confluent_kafka import TopicPartition

from ordo.recovery.checkpoints import CheckpointError, CheckpointStore, copy_checkpoint, fsync_dir
from ordo.storage.layout import shard_path
from ordo.log.records import LogCursor
from ordo.log.reader import log_consumer
from ordo.storage.rocks import RocksShard, ShardCorrupt

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


def prepare_shards(
    data_dir: str,
    partitions: int,
    store: CheckpointStore,
    mode: str = AUTO,
    log_head: Callable[[], str | None] | None = None,
) -> Plan:
    """Bring the shards to a state all of them agree on (see the module docstring).
    Call it before any worker opens a shard, holding the data directory's lock.
    `log_head` says what is wrong with the log's beginning (None: it holds the first
    batch); it is asked before shards holding state are wiped."""
    if mode not in MODES:
        raise ValueError(f"unknown recovery mode '{mode}' ({', '.join(MODES)})")
    cleaned = _clean_staging(data_dir, partitions) + store.clean()
    if mode == SCRATCH:
        _wipe_for_rebuild(data_dir, partitions, log_head)
        return Plan("rebuild", "asked to rebuild from scratch", cleaned=cleaned)
    if mode == CHECKPOINT:
        restored, broken = restore_newest_usable(data_dir, store)
        if restored is None:
            if broken:
                raise RecoveryError(
                    f"no usable checkpoint in {data_dir} ({'; '.join(broken)}): "
                    "rebuild the shards from the log with --from-scratch"
                )
            raise RecoveryError(
                f"no complete checkpoint in {data_dir}: start without --from-checkpoint, "
                "or rebuild the shards from the log with --from-scratch"
            )
        return Plan("restore", _noting("asked to restore from a checkpoint", broken), restored, cleaned)
    states = inspect_shards(data_dir, partitions)
    if all(s.marker is None and s.problem in (None, "missing") for s in states):
        if store.latest() is None:
            return Plan("fresh", "new shards", cleaned=cleaned)
        reason = "no shard holds applied state"
    else:
        reason = _disagreement(states)
        if reason is None:
            batch = states[0].marker["batch"]
            return Plan("resume", f"shards agree: applied through batch {batch}", cleaned=cleaned)
    restored, broken = restore_newest_usable(data_dir, store)
    if restored is not None:
        return Plan("restore", _noting(reason, broken), restored, cleaned)
    _wipe_for_rebuild(data_dir, partitions, log_head)
    if broken:
        return Plan("rebuild", f"{reason}; no usable checkpoint", cleaned=cleaned)
    return Plan("rebuild", f"{reason}; no checkpoint", cleaned=cleaned)


def _noting(reason: str, broken: list[str]) -> str:
    if not broken:
        return reason
    return f"{reason}; skipped {len(broken)} unusable newer checkpoint(s)"


def restore_newest_usable(
    data_dir: str, store: CheckpointStore, stream=None
) -> tuple[dict[str, Any] | None, list[str]]:
    """Restore every shard from the newest checkpoint that works, trying older ones in
    turn. Returns that checkpoint's entry (None if none worked) and, for each one that did
    not, why; each is also reported on `stream` as it is skipped."""
    candidates = [e for e in reversed(store.entries()) if e["partitions"] == store.partitions]
    broken: list[str] = []
    for i, entry in enumerate(candidates):
        try:
            restore(data_dir, store, entry)
            return entry, broken
        except CheckpointError as exc:
            broken.append(f"batch {entry['batch']}: {exc}")
            following = (
                f"trying the one of batch {candidates[i + 1]['batch']}"
                if i + 1 < len(candidates)
                else "no older checkpoint"
            )
            print(
                f"checkpoint of batch {entry['batch']} is unusable ({exc}); {following}",
                file=stream or sys.stderr,
                flush=True,
            )
    return None, broken


def restore(data_dir: str, store: CheckpointStore, entry: dict[str, Any]) -> None:
    """Replace every shard by its copy in checkpoint `entry`, or raise CheckpointError and
    leave the shards as they were."""
    batch = entry["batch"]
    staged = []
    try:
        for p, source in enumerate(store.shard_dirs(entry)):
            staging = shard_path(data_dir, p) + _STAGING
            if os.path.exists(staging):
                shutil.rmtree(staging)
            staged.append(staging)
            try:
                copy_checkpoint(source, staging)
            except OSError as exc:
                raise CheckpointError(f"cannot copy shard {p}: {_first_line(exc)}") from None
            problem = _check_copy(staging, batch)
            if problem is not None:
                raise CheckpointError(f"shard {p} {problem}")
    except BaseException:
        for staging in staged:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    for p, staging in enumerate(staged):
        _replace(shard_path(data_dir, p), staging)
    fsync_dir(data_dir)


def _check_copy(path: str, batch: int) -> str | None:
    """What is wrong with a shard's copy of the checkpoint of `batch`, or None. Reading
    it through finds what opening it does not: a block whose bytes no longer match its
    checksum (SST files are hard-linked, so such damage is shared by every checkpoint and
    shard that links the file). That costs one read of the shard's data per restore,
    which is rare and followed by a replay anyway."""
    try:
        with RocksShard(path, read_only=True) as shard:
            marker = shard.applied()
            for _ in shard.items():
                pass
    except ShardCorrupt as exc:
        return f"is corrupt: {exc.detail}"
    except Exception as exc:
        return f"cannot be read: {_first_line(exc)}"
    found = (marker or {}).get("batch")
    if found != batch:
        return f"holds batch {found}, not {batch}"
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


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


def _wipe_for_rebuild(data_dir: str, partitions: int, log_head: Callable[[], str | None] | None) -> None:
    held = [s for s in inspect_shards(data_dir, partitions) if s.marker is not None]
    if held and log_head is not None:
        problem = log_head()
        if problem is not None:
            through = max(s.marker["batch"] for s in held)
            raise RecoveryError(
                f"not rebuilding the shards from the log: {problem}; the shards hold state through batch "
                f"{through} and are left as they are (see docs/operations.md, 'Broker lost')"
            )
    _wipe(data_dir, partitions)


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
            f"{cursor.next_offset} of {topic}, which begins at offset {low} now"
        )


def log_head_problem(bootstrap: str, topic: str, timeout: float = 10.0) -> str | None:
    """What keeps the log from rebuilding state from its beginning, or None: its first
    record must be a sequencer's start record at offset 0. Read, not inferred from
    watermarks."""
    from ordo.log.records import START, LogError, SecretMismatch, Unauthenticated, decode, decode_before_places
    from ordo.log.reader import log_identity
    from ordo.broker.topics import Topics

    consumer = log_consumer(bootstrap, f"{topic}.head-check")
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        message = None
        deadline = time.monotonic() + timeout
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is not None:
                return f"{topic} cannot be read from its beginning ({message.error().str()})"
    finally:
        consumer.close()
    if message is None:
        return f"{topic} holds no record"
    namespace = Topics.namespace_of_log(topic)
    try:
        kind, _ = decode(message.value(), namespace, None)
    except Unauthenticated:
        try:  # a log written before tags covered where a record belongs
            kind, _ = decode_before_places(message.value(), namespace)
        except LogError:
            try:
                log_identity(bootstrap, topic, timeout, f"{topic}.head-check")
            except SecretMismatch as exc:
                return str(exc)
            return (
                f"{topic} begins with a record not signed with this engine's log secret: sequencers and "
                f"engines must share one (docs/operations.md, 'The log secret')"
            )
    except LogError:
        kind = None
    if message.offset() != 0 or kind != START:
        return f"{topic} does not begin with a sequencer's start record (its head was deleted?)"
    return None
