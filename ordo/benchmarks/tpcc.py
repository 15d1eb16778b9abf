"""`ordo bench tpcc`: TPC-C engine throughput at one or more partition counts, per core,
beside Styx's published figure, with the consistency conditions checked on the result.

The population and the mix are produced and sequenced first (a pre-filled log, routed for
the partition count). The workers apply the load batches, are held there, and the clock
runs from their release until the last worker has applied the last batch: it measures the
transactions of the mix only. Lookups by last name carry the client's reconnaissance
(knob assume=1), as Calvin's clients do it before sequencing; a pre-filled log has no
sequencer left to re-sequence them.
"""

from __future__ import annotations

import os
from collections import Counter
import shutil
import tempfile
import time
from typing import Any

from ordo.benchmarks.machine import finish_report, machine
from ordo.benchmarks.prefill import prefill_log
from ordo.benchmarks.requests import ordering_of
from ordo.benchmarks.runners import _wait_until_applied, shutdown_ray

# Styx (SIGMOD'25, Python on Kafka): about 3,000 TPC-C txn/s with sub-second p99.
STYX_TPCC_TPS = 3_000
DEFAULT_KNOBS = {"warehouses": 2, "customers": 300, "items": 10_000}


def run_tpcc(
    partition_counts: list[int],
    scheduler: str,
    txns: int,
    seed: int,
    knobs: dict,
    max_txns: int,
    json_path: str | None = None,
    baseline: bool = False,
    end_to_end: bool = True,
) -> dict[str, Any]:
    """`ordo bench tpcc` on a broker of its own. `baseline`: also the PostgreSQL baseline
    over the same requests (ordo/benchmarks/tpcc_baseline.py). `end_to_end`: also the
    whole pipeline, where lookups by last name make their reconnaissance pass through the log."""
    from ordo.broker.local import local_broker

    try:
        with local_broker() as broker:
            report = measure_tpcc(
                broker.bootstrap_servers, partition_counts, scheduler, txns, seed, knobs, max_txns, baseline, end_to_end
            )
    finally:
        shutdown_ray()
    return finish_report(report, json_path)


def measure_tpcc(
    bootstrap: str,
    partition_counts: list[int],
    scheduler: str,
    txns: int,
    seed: int,
    knobs: dict,
    max_txns: int,
    baseline: bool = False,
    end_to_end: bool = True,
    say=lambda text="": print(text, flush=True),
) -> dict[str, Any]:
    """The measurements of `ordo bench tpcc` on a running broker (also part of the suite)."""
    from ordo.procedures.workloads import tpcc

    knobs = {**DEFAULT_KNOBS, **knobs, "assume": 1}
    requests = list(tpcc.generate(txns, seed, **knobs))
    plain = list(tpcc.generate(txns, seed, **{**knobs, "assume": 0}))
    loads = sum(1 for r in requests if r["proc"].startswith("tpcc_load_"))
    cores = len(os.sched_getaffinity(0))
    report: dict[str, Any] = {
        "workload": "tpcc",
        "scheduler": scheduler,
        "knobs": knobs,
        "txns": txns,
        "load_requests": loads,
        "batch_size": max_txns,
        "machine": machine(),
        "runs": [],
        "styx_tps": STYX_TPCC_TPS,
    }
    say(
        f"ordo bench tpcc ({scheduler}): {txns:,} txns after {loads} load requests, knobs {knobs}, "
        f"partitions {partition_counts}, {cores} cores"
    )
    root = tempfile.mkdtemp(prefix="ordo-tpcc-")
    try:
        for partitions in sorted(set(partition_counts)):
            started = time.monotonic()
            log = prefill_log(bootstrap, requests, max_txns, "tpcc", partitions, ordering_of(scheduler))
            prefill_s = time.monotonic() - started
            directory = os.path.join(root, f"p{partitions}")
            run = _measure(bootstrap, log, scheduler, partitions, directory, loads)
            run["prefill_s"] = round(prefill_s, 1)
            run["engine_tps_per_core"] = round(run["engine_tps"] / min(partitions, cores))
            run["cores_used"] = min(partitions, cores)
            run["conditions"] = _conditions(directory)
            report["runs"].append(run)
            say(format_run(run))
            if end_to_end:
                run["end_to_end"] = _end_to_end(
                    bootstrap, plain, loads, scheduler, partitions, max_txns, os.path.join(root, f"e2e{partitions}")
                )
                say(format_end_to_end(run["end_to_end"]))
        if baseline:
            report["baseline"] = _baseline(bootstrap, log, loads)
            say(format_baseline(report["baseline"]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report


def _measure(bootstrap: str, log, scheduler: str, partitions: int, directory: str, loads: int) -> dict[str, Any]:
    """Release the workers held after the last batch holding a load request; time the rest."""
    from ordo.scheduler.coordinator import Coordinator

    batches = [batch for batch, _ in log.batches()]
    seen, load_batch = 0, batches[0].batch_id
    for batch in batches:
        if seen >= loads:
            break
        seen += len(batch)
        load_batch = batch.batch_id
    timed = sum(len(b) for b in batches if b.batch_id > load_batch)
    if not timed:
        raise ValueError("no batch of the mix follows the load: more --txns or a smaller --max-txns")
    coordinator = Coordinator(bootstrap, log.namespace, directory, scheduler, partitions)
    try:
        coordinator.start(hold_at=load_batch)
        _wait_until_applied(coordinator, load_batch, timeout=1800)
        started = time.monotonic()
        coordinator.group.hold(log.last_batch)
        while not all(s["applied"] >= log.last_batch for s in coordinator.watch(0.1)):
            pass
        statuses = coordinator.watch(0)
        elapsed = max(s["applied_at"] for s in statuses) - started
        committed = sum(s["committed"] for s in statuses)
        aborted = sum(s["aborted"] for s in statuses)
    finally:
        coordinator.close()
    return {
        "partitions": partitions,
        "engine_tps": round(timed / elapsed),
        "timed_txns": timed,
        "seconds": round(elapsed, 2),
        "batches": log.last_batch,
        "load_batches": load_batch,
        "committed": committed,
        "aborted": aborted,
    }


def _end_to_end(
    bootstrap: str, requests: list[dict], loads: int, scheduler: str, partitions: int, max_txns: int, directory: str
) -> dict[str, Any]:
    """Sequencer, engine and client: the load first (waited for), then the mix, timed from
    its first request sent to its last outcome."""
    from ordo.benchmarks.dependent import Pipeline, restart_figures

    mix = requests[loads:]
    with Pipeline(bootstrap, "tpcc-e2e", scheduler, partitions, max_txns, directory) as pipeline:
        pipeline.run(requests[:loads], timeout=1800)
        outcomes, elapsed = pipeline.run(mix)
    return {
        "txns": len(mix),
        "tps": round(len(mix) / elapsed),
        "seconds": round(elapsed, 2),
        "statuses": dict(Counter(o["status"] for o in outcomes.values())),
        **restart_figures(mix, outcomes),
        "conditions": _conditions(directory),
    }


def format_end_to_end(result: dict[str, Any]) -> str:
    held = "hold" if not result["conditions"] else f"{len(result['conditions'])} VIOLATED"
    return (
        f"    end to end: {result['tps']:,} txn/s ({result['dependent']:,} lookups by last name passed the log "
        f"twice, {result['restarted']} restarted); consistency conditions {held}"
    )


def _baseline(bootstrap: str, log, loads: int) -> dict[str, Any]:
    from ordo.benchmarks.baseline import BaselineUnavailable, PostgresServer
    from ordo.benchmarks.tpcc_baseline import run_tpcc_baseline

    try:
        server = PostgresServer(install=True).start()
    except BaselineUnavailable as exc:
        return {"error": str(exc)}
    try:
        return run_tpcc_baseline(bootstrap, log.namespace, log.requests, loads, server)
    finally:
        server.stop()


def format_baseline(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"  PostgreSQL baseline unavailable: {result['error']}"
    held = "hold" if not result["conditions"] else f"{len(result['conditions'])} VIOLATED"
    return (
        f"  PostgreSQL baseline (one SERIALIZABLE transaction per request, same procedures): "
        f"{result['tps']:,} txn/s, {result['txns']:,} txns in {result['seconds']} s, "
        f"{result['retries']} retries; consistency conditions {held}"
    )


def _conditions(directory: str) -> list[str]:
    from ordo.state import records
    from ordo.procedures.workloads.tpcc_consistency import violations

    return violations(records(directory))


def format_run(run: dict[str, Any]) -> str:
    held = "hold" if not run["conditions"] else f"{len(run['conditions'])} VIOLATED"
    return (
        f"  {run['partitions']} partition(s): {run['engine_tps']:,} txn/s engine, "
        f"{run['engine_tps_per_core']:,} per core (Styx: {STYX_TPCC_TPS:,} txn/s), "
        f"{run['timed_txns']:,} txns in {run['seconds']} s; consistency conditions {held}"
    )
