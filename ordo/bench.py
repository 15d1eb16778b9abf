"""`ordo bench`: engine throughput, end-to-end throughput and the storage limit of
BENCHMARKS.md, measured in one run on the same requests, reported as a table and JSON."""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import threading
import time

import msgpack
from rocksdict import WriteBatch

from ordo.client import Client
from ordo.embedded import SequencerThread
from ordo.services import SequencerProcess
from procedures.registry import default_registry
from procedures.workloads import ALL_WORKLOADS
from scheduler.coordinator import Coordinator
from sequencer.broker import LocalBroker
from sequencer.sequencer import SequencerConfig
from sequencer.topics import ensure_topics
from storage.keys import encode_key
from storage.rocks import RocksShard


def storage_limit(requests: list[dict], batch_size: int, directory: str) -> float:
    """Transactions/s of the tightest loop over RocksDB: per batch one multi-get of the
    keys read, the writes applied as +1 increments, one WriteBatch."""
    registry = default_registry()
    batches = []
    for start in range(0, len(requests), batch_size):
        reads, writes = [], []
        for request in requests[start:start + batch_size]:
            _, read_set, write_set = registry.analyze(request["proc"], request["args"])
            reads.extend(encode_key(t, k) for t, k in read_set)
            writes.append([encode_key(t, k) for t, k in write_set])
        batches.append((list(dict.fromkeys(reads)), writes))
    shard = RocksShard(directory)
    db = shard._db
    packb, unpackb = msgpack.packb, msgpack.unpackb
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
    elapsed = time.perf_counter() - started
    shard.close()
    return len(requests) / elapsed


def engine_throughput(bootstrap: str, requests: list[dict], scheduler: str, partitions: int,
                      config: SequencerConfig, directory: str) -> tuple[float, int]:
    """Transactions/s from a pre-filled log to applied state (no client, no sequencer on the clock)."""
    namespace = f"bench-engine-{scheduler}-{os.getpid()}-{time.monotonic_ns()}"
    ensure_topics(bootstrap, namespace, request_partitions=1)
    client = Client(bootstrap, namespace)
    client.submit(requests)
    client.close()
    sequencer = SequencerThread(bootstrap, namespace, config).start()
    sequencer.wait_for(len(requests))
    last_batch = sequencer.sequencer.next_batch - 1
    sequencer.stop()
    coordinator = Coordinator(bootstrap, namespace, directory, scheduler, partitions)
    started = time.perf_counter()
    coordinator.run(until_batch=last_batch)
    return len(requests) / (time.perf_counter() - started), last_batch


def end_to_end_throughput(bootstrap: str, requests: list[dict], scheduler: str, partitions: int,
                          config: SequencerConfig, directory: str) -> float:
    """Requests/s from the first request produced until every outcome is on <ns>.results."""
    namespace = f"bench-e2e-{scheduler}-{os.getpid()}-{time.monotonic_ns()}"
    ensure_topics(bootstrap, namespace, request_partitions=1)
    coordinator = Coordinator(bootstrap, namespace, directory, scheduler, partitions)
    sequencer = SequencerProcess(bootstrap, namespace, config)
    sequencer.start()
    time.sleep(1.0)  # let the sequencer process start before the clock runs
    client = Client(bootstrap, namespace)
    expected = len(requests)

    def stop_when_done(stats):
        if stats.txns >= expected:
            coordinator.stop()

    started = time.perf_counter()
    feeder = threading.Thread(target=client.submit, args=(requests,), daemon=True)
    feeder.start()
    stats = coordinator.run(progress=stop_when_done, idle_exit=60)
    elapsed = time.perf_counter() - started
    feeder.join()
    sequencer.stop()
    client.close()
    if stats.txns < expected:
        raise RuntimeError(f"end-to-end run saw {stats.txns} of {expected} outcomes")
    return expected / elapsed


def run_bench(workload: str, scheduler: str, partitions: int, txns: int, seed: int, knobs: dict,
              max_txns: int, json_path: str | None) -> int:
    module = ALL_WORKLOADS[workload]
    requests = list(module.generate(txns, seed, **knobs))
    config = SequencerConfig(max_txns=max_txns)
    root = tempfile.mkdtemp(prefix="ordo-bench-")
    try:
        limit = storage_limit(requests, max_txns, os.path.join(root, "limit"))
        with LocalBroker() as broker:
            engine, batches = engine_throughput(broker.bootstrap_servers, requests, scheduler, partitions,
                                                config, os.path.join(root, "engine"))
            e2e = end_to_end_throughput(broker.bootstrap_servers, requests, scheduler, partitions, config,
                                        os.path.join(root, "e2e"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "workload": workload,
        "knobs": knobs,
        "scheduler": scheduler,
        "partitions": partitions,
        "txns": txns,
        "batches": batches,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()},
        "storage_limit_tps": round(limit),
        "engine_tps": round(engine),
        "end_to_end_tps": round(e2e),
        "engine_over_limit": round(engine / limit, 3),
        "end_to_end_over_engine": round(e2e / engine, 3),
    }
    print(f"{workload} {knobs or ''} | {scheduler} | {partitions} partition(s) | {txns:,} txns in {batches} batches")
    print(f"  {'storage limit':<22}{limit:>12,.0f} txn/s")
    print(f"  {'engine':<22}{engine:>12,.0f} txn/s   {engine / limit:6.2f} x limit")
    print(f"  {'end to end':<22}{e2e:>12,.0f} req/s   {e2e / engine:6.2f} x engine")
    print(json.dumps(result))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return 0
