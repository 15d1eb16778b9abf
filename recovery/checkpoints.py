"""Checkpoints of all shards at one batch boundary, listed in a manifest.

Layout under the data directory:

    checkpoints.json                    the manifest: complete checkpoints, oldest first
    checkpoints/batch-000000000120/
        shard-0/ shard-1/ …             RocksDB checkpoints (SST files hard-linked)

A checkpoint directory becomes usable only when the manifest, rewritten atomically
(temp file, fsync, rename, fsync of the directory), lists it. A crash while shards are
being checkpointed therefore leaves a directory that no manifest names; `clean` removes
such leftovers on start, so a cut-short checkpoint is never restored.

Each shard's checkpoint holds the shard's own applied marker (batch id and log cursor):
restoring it says by itself where the log replay resumes.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Protocol

MANIFEST = "checkpoints.json"
ROOT = "checkpoints"
FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint could not be taken or restored."""


class Checkpointable(Protocol):
    partitions: int

    def checkpoint(self, paths: list[str]) -> list[dict[str, Any] | None]: ...


def checkpoint_name(batch: int) -> str:
    return f"batch-{batch:012d}"


def shard_checkpoint_path(root: str, batch: int, partition: int) -> str:
    """Where a shard's checkpoint of `batch` lives under the checkpoint folder `root`."""
    return os.path.join(root, checkpoint_name(batch), f"shard-{partition}")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomically(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


class CheckpointStore:
    def __init__(self, data_dir: str, partitions: int, keep: int = 2):
        if keep < 1:
            raise ValueError("--keep-checkpoints must be at least 1")
        self.data_dir = data_dir
        self.partitions = partitions
        self.keep = keep
        self.root = os.path.join(data_dir, ROOT)
        self.manifest_path = os.path.join(data_dir, MANIFEST)

    # -- reading -------------------------------------------------------------

    def entries(self) -> list[dict[str, Any]]:
        """Complete checkpoints, oldest first."""
        if not os.path.exists(self.manifest_path):
            return []
        try:
            with open(self.manifest_path) as f:
                manifest = json.load(f)
        except ValueError as exc:
            raise CheckpointError(f"{self.manifest_path} is unreadable: {exc}") from None
        return list(manifest.get("checkpoints", []))

    def shard_dirs(self, entry: dict[str, Any]) -> list[str]:
        return [os.path.join(self.data_dir, path) for path in entry["shards"]]

    def latest(self) -> dict[str, Any] | None:
        """The newest listed checkpoint whose shard directories are all present."""
        for entry in reversed(self.entries()):
            if entry["partitions"] == self.partitions and all(map(os.path.isdir, self.shard_dirs(entry))):
                return entry
        return None

    # -- writing -------------------------------------------------------------

    def take(self, group: Checkpointable, marker: dict[str, Any]) -> dict[str, Any]:
        """Checkpoint every shard of `group`, all of which have applied `marker`'s batch and
        nothing later, then list the checkpoint in the manifest and prune old ones."""
        batch = marker["batch"]
        directory = os.path.join(self.root, checkpoint_name(batch))
        if os.path.exists(directory):  # an earlier attempt at this batch, cut short
            shutil.rmtree(directory)
        os.makedirs(directory)
        started = time.perf_counter()
        markers = group.checkpoint([shard_checkpoint_path(self.root, batch, p) for p in range(self.partitions)])
        if any(m is None or m["batch"] != batch for m in markers):
            shutil.rmtree(directory, ignore_errors=True)
            raise CheckpointError(f"shards are not all at batch {batch}: {[m and m['batch'] for m in markers]}")
        return self.record(batch, marker["cursor"], time.perf_counter() - started)

    def record(self, batch: int, cursor: dict[str, Any], seconds: float | None = None) -> dict[str, Any]:
        """List the checkpoint of `batch`, whose shard directories are all written, in the
        manifest, and prune old ones."""
        entry = {
            "batch": batch,
            "cursor": cursor,
            "partitions": self.partitions,
            "shards": [os.path.join(ROOT, checkpoint_name(batch), f"shard-{p}") for p in range(self.partitions)],
            "created": time.time(),
        }
        if seconds is not None:
            entry["seconds"] = round(seconds, 4)
        entries = [e for e in self.entries() if e["batch"] != batch] + [entry]
        entries.sort(key=lambda e: e["batch"])
        kept, pruned = entries[-self.keep :], entries[: -self.keep]
        self._write(kept)
        for old in pruned:  # unlisted first, removed after: a crash between leaves only litter
            shutil.rmtree(os.path.join(self.root, checkpoint_name(old["batch"])), ignore_errors=True)
        return entry

    def _write(self, entries: list[dict[str, Any]]) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        write_json_atomically(self.manifest_path, {"format": FORMAT, "checkpoints": entries})

    def clean(self) -> list[str]:
        """Remove what no manifest entry names: checkpoints cut short, pruned ones whose
        removal was interrupted, a manifest temp file. Returns what was removed."""
        removed = []
        tmp = f"{self.manifest_path}.tmp"
        if os.path.exists(tmp):
            os.remove(tmp)
            removed.append(tmp)
        if not os.path.isdir(self.root):
            return removed
        listed = {checkpoint_name(e["batch"]) for e in self.entries()}
        for name in sorted(os.listdir(self.root)):
            if name not in listed:
                path = os.path.join(self.root, name)
                if os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
                removed.append(path)
        return removed


def copy_checkpoint(source: str, target: str) -> None:
    """A private, writable copy of a RocksDB checkpoint: SST files are immutable, so they
    are hard-linked (cheap); everything else (MANIFEST, WAL, CURRENT, OPTIONS) is copied,
    because the restored shard appends to or replaces those."""
    os.makedirs(target)
    for name in os.listdir(source):
        src, dst = os.path.join(source, name), os.path.join(target, name)
        if name.endswith(".sst"):
            try:
                os.link(src, dst)
                continue
            except OSError:  # another file system, or no hard links: copy instead
                pass
        shutil.copy2(src, dst)
    for name in os.listdir(target):
        with open(os.path.join(target, name), "rb") as f:
            os.fsync(f.fileno())
    fsync_dir(target)
