"""Reading a data directory: dump and digest over every shard, safe while the engine runs."""

from __future__ import annotations

import heapq
from typing import Any, Iterator

from scheduler.worker import layout_partitions, shard_path
from storage.digest import combine
from storage.keys import decode_key
from storage.rocks import RocksShard
from storage.values import decode_value


def open_shards(data_dir: str) -> list[RocksShard]:
    return [RocksShard(shard_path(data_dir, p), read_only=True) for p in range(layout_partitions(data_dir))]


def records(data_dir: str, table: str | None = None) -> Iterator[dict[str, Any]]:
    """Every stored record in key order, merged across shards."""
    shards = open_shards(data_dir)
    try:
        for raw_key, raw_value in heapq.merge(*(shard.items(table) for shard in shards)):
            name, key = decode_key(raw_key)
            yield {"table": name, "key": key, "value": decode_value(raw_value)}
    finally:
        for shard in shards:
            shard.close()


def digest(data_dir: str) -> tuple[int, int]:
    """(combined digest, applied batch id) of a data directory."""
    shards = open_shards(data_dir)
    try:
        applied = [shard.applied() for shard in shards]
        return combine(shard.digest() for shard in shards), min((a or {}).get("batch", 0) for a in applied)
    finally:
        for shard in shards:
            shard.close()
