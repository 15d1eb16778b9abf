"""`ordo bench WORKLOAD`: one configuration, every figure from one run."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from ordo.benchmarks.baseline import measure_baseline
from ordo.benchmarks.machine import machine
from ordo.benchmarks.prefill import prefill_log
from ordo.benchmarks.requests import multi_partition_share, ordering_of, procedure_modules, workload_requests
from ordo.benchmarks.runners import end_to_end, engine_throughput, replay_throughput, rounded, shutdown_ray
from ordo.benchmarks.storage_limit import storage_limit


def run_bench(
    workload: str,
    scheduler: str,
    partitions: int,
    txns: int,
    seed: int,
    knobs: dict,
    max_txns: int,
    json_path: str | None,
    baseline: bool = False,
) -> int:
    """`ordo bench WORKLOAD`: one configuration, everything measured in one run over the
    same `txns` requests (the engine and the replay over all of them, no time box)."""
    from ordo.broker.local import local_broker

    requests = workload_requests(workload, txns, seed, knobs, partitions)
    root = tempfile.mkdtemp(prefix="ordo-bench-")
    result: dict[str, Any] = {
        "workload": workload,
        "knobs": knobs,
        "scheduler": scheduler,
        "partitions": partitions,
        "txns": txns,
        "batch_size": max_txns,
        "multi_partition_share": round(multi_partition_share(requests, partitions), 3),
        "machine": machine(),
    }
    try:
        limit = storage_limit(requests, max_txns, os.path.join(root, "limit"))
        with local_broker() as broker:
            bootstrap = broker.bootstrap_servers
            modules = procedure_modules(workload, knobs)
            log = prefill_log(bootstrap, requests, max_txns, "engine", partitions, ordering_of(scheduler), modules)
            engine = engine_throughput(
                bootstrap, log, scheduler, partitions, os.path.join(root, "engine"), modules=modules
            )
            replay, recovery = replay_throughput(
                bootstrap, log, scheduler, partitions, os.path.join(root, "replay"), modules
            )
            e2e = end_to_end(
                bootstrap,
                workload,
                knobs,
                requests,
                scheduler,
                partitions,
                max_txns,
                os.path.join(root, "e2e"),
                modules=modules,
            )
            if baseline:
                result["baseline"] = measure_baseline(
                    bootstrap, log, workload, engine.txns, os.path.join(root, "engine"), install=True
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutdown_ray()
    result.update(
        {
            "batches": log.last_batch,
            "storage_limit_tps": round(limit),
            "engine_tps": round(engine.tps),
            "replay_tps": round(replay),
            "recovery_tps": round(recovery),
            "end_to_end_tps": round(e2e["end_to_end_tps"]),
            "engine_over_limit": round(engine.tps / limit, 3),
            "end_to_end_over_engine": round(e2e["end_to_end_tps"] / engine.tps, 3),
            "replay_over_engine": round(replay / engine.tps, 3),
            "latency_ms": rounded(e2e["latency_ms"]),
            "memory_mb": e2e["memory_mb"],
        }
    )
    if engine.aria is not None:
        result["aria"] = engine.aria
    if result.get("baseline", {}).get("requests_per_s"):
        result["end_to_end_over_baseline"] = round(e2e["end_to_end_tps"] / result["baseline"]["requests_per_s"], 3)
    lat = result["latency_ms"]
    print(
        f"{workload} {knobs or ''} | {scheduler} | {partitions} partition(s) | {txns:,} txns in "
        f"{log.last_batch} batches"
    )
    print(f"  {'storage limit':<22}{limit:>12,.0f} txn/s")
    print(f"  {'engine':<22}{engine.tps:>12,.0f} txn/s   {engine.tps / limit:6.2f} x limit")
    print(f"  {'replay':<22}{replay:>12,.0f} txn/s   {replay / engine.tps:6.2f} x engine")
    print(
        f"  {'end to end':<22}{e2e['end_to_end_tps']:>12,.0f} req/s   "
        f"{e2e['end_to_end_tps'] / engine.tps:6.2f} x engine"
    )
    print(
        f"  {'latency at half load':<22}{lat['p50']:>9.1f} ms p50 {lat['p99']:8.1f} ms p99  "
        f"({lat['rate_rps']:,.0f} req/s)"
    )
    if engine.aria is not None:
        print(
            f"  {'aria first pass':<22}{engine.aria['conflict_rate']:>12.1%} conflicts   "
            f"{engine.aria['fallbacks']:,} of {engine.aria['transactions']:,} txns to the fallback"
        )
    print(f"  {'peak memory':<22}" + ", ".join(f"{k} {v:,.0f} MB" for k, v in result["memory_mb"].items() if v))
    if "baseline" in result:
        b = result["baseline"]
        if "requests_per_s" in b:
            print(
                f"  {'PostgreSQL baseline':<22}{b['requests_per_s']:>12,.0f} req/s   "
                f"end to end {result.get('end_to_end_over_baseline', 0):.2f} x baseline"
            )
        else:
            print(f"  {'PostgreSQL baseline':<22}unavailable: {b.get('error')}")
    print(json.dumps(result))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return 0
