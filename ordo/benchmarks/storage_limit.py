"""The storage limit: the same writes straight into RocksDB, one WriteBatch per batch."""

from __future__ import annotations

import os
import shutil
import time


def storage_limit(requests: list[dict], batch_size: int, directory: str, repeats: int = 3) -> float:
    """Transactions/s of the tightest loop over RocksDB: per batch one multi-get of the
    keys read, the writes applied as +1 increments, one WriteBatch. The best of `repeats`
    passes, each into a fresh database: it is a ceiling, and a short loop is easily
    disturbed."""
    import msgpack
    from rocksdict import WriteBatch

    from ordo.procedures.registry import default_registry
    from ordo.storage.keys import encode_key
    from ordo.storage.rocks import RocksShard

    registry = default_registry()
    batches = []
    for start in range(0, len(requests), batch_size):
        reads, writes = [], []
        for request in requests[start : start + batch_size]:
            _, read_set, write_set = registry.analyze(request["proc"], request["args"])
            reads.extend(encode_key(t, k) for t, k in read_set)
            writes.append([encode_key(t, k) for t, k in write_set])
        batches.append((list(dict.fromkeys(reads)), writes))
    packb, unpackb = msgpack.packb, msgpack.unpackb
    best = float("inf")
    for attempt in range(repeats):
        path = os.path.join(directory, str(attempt))
        shard = RocksShard(path)
        db = shard._db
        started = time.perf_counter()
        for reads, writes in batches:
            values = {k: (0 if raw is None else unpackb(raw)) for k, raw in zip(reads, db.get(reads))}
            for txn_writes in writes:
                for key in txn_writes:
                    values[key] = values.get(key, 0) + 1
            batch = WriteBatch(raw_mode=True)
            for key, value in values.items():
                batch.put(key, packb(value))
            db.write(batch)
        best = min(best, time.perf_counter() - started)
        shard.close()
        shutil.rmtree(path, ignore_errors=True)
    return len(requests) / best
