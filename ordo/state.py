"""Reading a data directory: dump and digest over every shard, safe while the engine runs.

A shard that RocksDB finds damaged stops both with one line naming the shard and what to
do: a dump cut short or a digest of part of the state would look like real answers."""

from __future__ import annotations

import heapq
from typing import Any, Iterator

from ordo.storage.layout import layout_partitions, shard_path
from ordo.storage.digest import combine
from ordo.storage.keys import decode_key
from ordo.storage.rocks import RocksShard, ShardCorrupt
from ordo.storage.values import decode_value


class CorruptShardError(RuntimeError):
    """A shard of the data directory is damaged; the message says what to do."""


def _corrupt(data_dir: str, exc: ShardCorrupt) -> CorruptShardError:
    partitions = layout_partitions(data_dir)
    shard = next((f"shard {p}" for p in range(partitions) if shard_path(data_dir, p) == exc.path), "a shard")
    return CorruptShardError(
        f"{shard} ({exc.path}) is corrupt: {exc.detail}. Its records cannot be trusted: stop the engine, then "
        f"restore the shards from a checkpoint with `ordo recover --from-checkpoint --data-dir {data_dir} "
        f"--bootstrap-servers H:P --namespace NS`, or rebuild them from the log with "
        f"`ordo recover --from-scratch` and the same options (a checkpoint can share damaged files with the "
        f"shard; see docs/operations.md)"
    )


def open_shards(data_dir: str) -> list[RocksShard]:
    shards: list[RocksShard] = []
    try:
        for p in range(layout_partitions(data_dir)):
            shards.append(RocksShard(shard_path(data_dir, p), read_only=True))
    except ShardCorrupt as exc:
        for shard in shards:
            shard.close()
        raise _corrupt(data_dir, exc) from None
    except BaseException:
        for shard in shards:
            shard.close()
        raise
    return shards


def records(data_dir: str, table: str | None = None) -> Iterator[dict[str, Any]]:
    """Every stored record in key order, merged across shards."""
    shards = open_shards(data_dir)
    try:
        for raw_key, raw_value in heapq.merge(*(shard.items(table) for shard in shards)):
            name, key = decode_key(raw_key)
            yield {"table": name, "key": key, "value": decode_value(raw_value)}
    except ShardCorrupt as exc:
        raise _corrupt(data_dir, exc) from None
    finally:
        for shard in shards:
            shard.close()


def table_names(data_dir: str) -> list[str]:
    """The tables with at least one stored record, across every shard."""
    shards = open_shards(data_dir)
    try:
        return sorted({name for shard in shards for name in shard.table_names()})
    except ShardCorrupt as exc:
        raise _corrupt(data_dir, exc) from None
    finally:
        for shard in shards:
            shard.close()


def digest(data_dir: str) -> tuple[int, int]:
    """(combined digest, applied batch id) of a data directory."""
    shards = open_shards(data_dir)
    try:
        applied = [shard.applied() for shard in shards]
        return combine(shard.digest() for shard in shards), min((a or {}).get("batch", 0) for a in applied)
    except ShardCorrupt as exc:
        raise _corrupt(data_dir, exc) from None
    finally:
        for shard in shards:
            shard.close()
