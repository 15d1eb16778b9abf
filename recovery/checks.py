"""Crash-consistency checks over a stopped (or running) engine's data directory."""

from __future__ import annotations

from ordo.state import open_shards


def applied_markers(data_dir: str) -> list[dict | None]:
    shards = open_shards(data_dir)
    try:
        return [shard.applied() for shard in shards]
    finally:
        for shard in shards:
            shard.close()


def applied_trace(data_dir: str) -> list[dict[int, int]]:
    """Per shard: batch id -> times applied (needs the engine run with ORDO_TRACE_APPLIED=1)."""
    shards = open_shards(data_dir)
    try:
        return [shard.applied_trace() for shard in shards]
    finally:
        for shard in shards:
            shard.close()


def check_applied_once(data_dir: str, last_batch: int) -> None:
    """Every shard applied batches 1..last_batch, each exactly once, in the lineage of its
    current state, and its marker names last_batch. Raises AssertionError otherwise."""
    for partition, (marker, trace) in enumerate(zip(applied_markers(data_dir), applied_trace(data_dir))):
        assert marker is not None and marker["batch"] == last_batch, (partition, marker)
        assert sorted(trace) == list(range(1, last_batch + 1)), (
            f"shard {partition}: applied batches are not 1..{last_batch}: "
            f"missing {sorted(set(range(1, last_batch + 1)) - set(trace))[:10]}, "
            f"extra {sorted(set(trace) - set(range(1, last_batch + 1)))[:10]}"
        )
        twice = {batch: n for batch, n in trace.items() if n != 1}
        assert not twice, f"shard {partition}: batches applied more than once: {dict(list(twice.items())[:10])}"
