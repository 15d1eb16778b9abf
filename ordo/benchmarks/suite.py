"""`ordo bench suite`: the grid of BENCHMARKS.md (every workload × scheduler × partition
count, plus sweeps of contention, multi-partition share, Zipf skew and batch size)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from ordo.benchmarks.baseline import BaselineUnavailable, PostgresServer, measure_baseline
from ordo.benchmarks.defaults import DEFAULT_BATCH, LATENCY_LOAD, SCHEDULERS, SEED
from ordo.benchmarks.machine import machine
from ordo.benchmarks.plot import plot
from ordo.benchmarks.prefill import prefill_log
from ordo.benchmarks.report import format_report, format_run, ratios, targets
from ordo.benchmarks.requests import multi_partition_share, ordering_of, workload_requests
from ordo.benchmarks.runners import end_to_end, engine_throughput, replay_throughput, rounded, shutdown_ray
from ordo.benchmarks.scale import run_scale
from ordo.benchmarks.storage_limit import storage_limit
from ordo.benchmarks.tpcc import STYX_TPCC_TPS, measure_tpcc


@dataclass
class Spec:
    """One request log and what to measure on it."""

    workload: str
    knobs: dict
    partitions: int
    batch_size: int = DEFAULT_BATCH
    tags: tuple[str, ...] = ()
    full: bool = False  # also replay, end to end, latency and memory (else the engine only)
    baseline: bool = False


@dataclass
class Plan:
    name: str
    txns: int  # per log of single-partition txns; logs of multi-partition txns get fewer
    min_txns: int
    engine_seconds: float  # each engine run's time box
    replay_seconds: float  # a replay log holds about this long of the median engine's work
    burst_seconds: float  # the end-to-end burst holds about this long of the engine's work
    phases: list[tuple[str, float, float]]  # latency: (figure, share of end-to-end throughput, seconds)
    specs: list[Spec]


def plan_suite(quick: bool) -> Plan:
    specs: list[Spec] = []
    for partitions in (1, 2):
        for workload in ("micro", "sl", "gs", "ob", "tp"):
            knobs: dict = {}
            tags = ("base",)
            if workload == "micro":
                knobs = {"hot": 10_000, "mp": 0.1} if partitions == 2 else {"hot": 10_000}
                tags += ("contention", "batch") if partitions == 1 else ("mp",)
            elif workload == "sl" and partitions == 1:
                tags += ("theta",)
            full = not quick or (workload in ("micro", "sl") and partitions == 1)
            specs.append(
                Spec(
                    workload,
                    knobs,
                    partitions,
                    tags=tags,
                    full=full,
                    baseline=partitions == 1 and workload in ("micro", "sl"),
                )
            )
    for hot in (10,) if quick else (100, 10):
        specs.append(Spec("micro", {"hot": hot}, 1, tags=("contention",)))
    for mp in (0.0, 0.5) if quick else (0.0, 0.5, 1.0):
        specs.append(Spec("micro", {"hot": 10_000, "mp": mp}, 2, tags=("mp",)))
    if not quick:
        for theta in (0.0, 0.99):
            specs.append(Spec("sl", {"theta": theta}, 1, tags=("theta",)))
        for batch in (50, 1000):
            specs.append(Spec("micro", {"hot": 10_000}, 1, batch_size=batch, tags=("batch",)))
    # Ray starts with the first two-partition run and stays up: the one-partition runs
    # come first so that they have the cores to themselves.
    specs.sort(key=lambda s: s.partitions)
    if quick:
        return Plan("quick", 6000, 1000, 0.5, 0.5, 0.75, [("latency_ms", LATENCY_LOAD, 1.0)], specs)
    return Plan(
        "full", 20_000, 2000, 1.5, 1.5, 1.5, [("latency_ms", LATENCY_LOAD, 2.0), ("latency_low_ms", 0.1, 1.0)], specs
    )


def run_suite(quick: bool = False, out_dir: str = "bench-results", schedulers: tuple[str, ...] = SCHEDULERS) -> int:
    """`ordo bench suite`: the grid of BENCHMARKS.md, a table, JSON and a plot."""
    from ordo.broker.local import local_broker

    from ordo.extras import require

    require("matplotlib", "bench", "ordo bench suite (its plot)")  # before the grid, not after it
    plan = plan_suite(quick)
    os.makedirs(out_dir, exist_ok=True)
    began = time.time()
    report: dict[str, Any] = {
        "suite": plan.name,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "settings": {
            "txns_per_log": plan.txns,
            "min_txns_per_log": plan.min_txns,
            "batch_size": DEFAULT_BATCH,
            "engine_seconds": plan.engine_seconds,
            "replay_seconds": plan.replay_seconds,
            "burst_seconds": plan.burst_seconds,
            "latency_phases": plan.phases,
            "seed": SEED,
        },
        "logs": [],
        "runs": [],
        "baseline": {},
    }
    say = lambda text="": print(text, flush=True)  # noqa: E731
    say(
        f"ordo bench suite ({plan.name}): {len(plan.specs)} logs × {len(schedulers)} schedulers on "
        f"{report['machine']['cpus']} cores, load average {report['machine']['load_average']}"
    )
    root = tempfile.mkdtemp(prefix="ordo-suite-")
    server = None
    try:
        if any(s.baseline for s in plan.specs):
            try:
                server = PostgresServer(install=True).start()
            except BaselineUnavailable as exc:
                report["baseline"]["error"] = str(exc)
                say(f"baseline unavailable: {exc}")
        with local_broker() as broker:
            for number, spec in enumerate(plan.specs, 1):
                _run_spec(broker.bootstrap_servers, spec, plan, schedulers, root, server, report, say, number)
            # TPC-C beside Styx's published figure: its own population, NewOrder and Payment.
            report["tpcc"] = measure_tpcc(
                broker.bootstrap_servers,
                [1, 2],
                "locking",
                2000 if quick else 6000,
                SEED,
                {},
                DEFAULT_BATCH,
                end_to_end=not quick,
                say=say,
            )
        # Scale-out: one log at 1 and 2 partitions, 0 % and 100 % multi-partition, rounds taking turns.
        say()
        report["scale"] = run_scale(
            "micro",
            [1, 2],
            "vll",
            6000 if quick else 60_000,
            SEED,
            {"hot": 10_000},
            DEFAULT_BATCH,
            end_to_end_too=False,
            rounds=1 if quick else 3,
            mp_shares=[0.0, 1.0],
        )
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutdown_ray()
    report["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    report["duration_s"] = round(time.time() - began, 1)
    report["ratios"] = ratios(report)
    report["targets"] = targets(report)
    json_path = os.path.join(out_dir, "bench.json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=2)
    plot_path = os.path.join(out_dir, "bench-plot.png")
    plot(report, plot_path)
    say()
    say(format_report(report))
    say(
        "TPC-C (locking): "
        + "; ".join(
            f"{run['partitions']} partition(s) {run['engine_tps']:,} txn/s, {run['engine_tps_per_core']:,} per core"
            for run in report["tpcc"]["runs"]
        )
        + f" (Styx: {STYX_TPCC_TPS:,} txn/s)"
    )
    say(f"\nwrote {json_path} and {plot_path} ({report['duration_s']:.0f} s)")
    return 0


def _log_size(spec: Spec, plan: Plan, share: float) -> int:
    # Multi-partition txns run several times slower (a read exchange between workers), so
    # a shorter log still outlasts every scheduler's time box; a whole number of batches.
    count = max(plan.min_txns, round(plan.txns * (1 - 0.8 * share)))
    return max(spec.batch_size * 3, count - count % spec.batch_size)


def _run_spec(
    bootstrap: str, spec: Spec, plan: Plan, schedulers, root: str, server, report: dict, say, number: int
) -> None:
    began = time.monotonic()
    share = multi_partition_share(
        workload_requests(spec.workload, 500, SEED, spec.knobs, spec.partitions), spec.partitions
    )
    count = _log_size(spec, plan, share)
    requests = workload_requests(spec.workload, count, SEED, spec.knobs, spec.partitions)
    limit = storage_limit(requests, spec.batch_size, os.path.join(root, f"limit-{number}"))
    shutil.rmtree(os.path.join(root, f"limit-{number}"), ignore_errors=True)
    log = prefill_log(bootstrap, requests, spec.batch_size, "engine", spec.partitions)
    # aria runs its own log: the same requests, its batches stamped with aria's ordering.
    logs = {None: log}

    def log_for(scheduler: str, kind: str, chosen: list[dict], cache: dict):
        ordering = ordering_of(scheduler)
        if ordering not in cache:
            cache[ordering] = prefill_log(bootstrap, chosen, spec.batch_size, kind, spec.partitions, ordering)
        return cache[ordering]

    label = describe_knobs(spec)
    entry = {
        "log": number,
        "workload": spec.workload,
        "knobs": spec.knobs,
        "label": label,
        "partitions": spec.partitions,
        "txns": count,
        "batch_size": spec.batch_size,
        "batches": log.last_batch,
        "multi_partition_share": round(share, 3),
        "storage_limit_tps": round(limit),
        "tags": list(spec.tags),
    }
    report["logs"].append(entry)
    say(
        f"[{number}] {spec.workload} {label}, {spec.partitions}P: log of {count} txns in {log.last_batch} "
        f"batches, {share:.0%} multi-partition; storage limit {limit:,.0f} txn/s"
    )
    runs = {}
    for scheduler in schedulers:
        run = {
            **{
                k: entry[k]
                for k in (
                    "log",
                    "workload",
                    "knobs",
                    "label",
                    "partitions",
                    "batch_size",
                    "multi_partition_share",
                    "storage_limit_tps",
                    "tags",
                )
            },
            "scheduler": scheduler,
        }
        runs[scheduler] = run
        report["runs"].append(run)
        directory = os.path.join(root, f"{number}-{scheduler}-engine")
        try:
            engine = engine_throughput(
                bootstrap,
                log_for(scheduler, "engine", requests, logs),
                scheduler,
                spec.partitions,
                directory,
                plan.engine_seconds,
            )
            run.update(
                {
                    "engine_tps": round(engine.tps),
                    "engine_txns": engine.txns,
                    "engine_over_limit": round(engine.tps / limit, 3),
                }
            )
            if engine.aria is not None:
                run["aria"] = engine.aria
            if spec.baseline and scheduler == "serial" and server is not None:
                report["baseline"][spec.workload] = measure_baseline(
                    bootstrap, log, spec.workload, engine.txns, directory, server=server
                )
        except Exception as exc:  # one failed configuration is reported; the grid goes on
            run["error"] = f"engine: {type(exc).__name__}: {exc}"
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    if spec.full:
        rates = [run["engine_tps"] for run in runs.values() if run.get("engine_tps")]
        size = round(statistics.median(rates) * plan.replay_seconds) if rates else count
        size = min(count, max(spec.batch_size * 3, size - size % spec.batch_size))
        replay_logs: dict = {}
        for scheduler, run in runs.items():
            if "engine_tps" not in run:
                continue
            directory = os.path.join(root, f"{number}-{scheduler}-replay")
            try:
                replay, recovery = replay_throughput(
                    bootstrap,
                    log_for(scheduler, "replay", requests[:size], replay_logs),
                    scheduler,
                    spec.partitions,
                    directory,
                )
                run.update(
                    {
                        "replay_txns": size,
                        "replay_tps": round(replay),
                        "recovery_tps": round(recovery),
                        "replay_over_engine": round(replay / run["engine_tps"], 3),
                    }
                )
            except Exception as exc:
                run["error"] = f"replay: {type(exc).__name__}: {exc}"
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            directory = os.path.join(root, f"{number}-{scheduler}-e2e")
            burst = min(count, max(400, round(run["engine_tps"] * plan.burst_seconds)))
            try:
                e2e = end_to_end(
                    bootstrap,
                    spec.workload,
                    spec.knobs,
                    requests[:burst],
                    scheduler,
                    spec.partitions,
                    spec.batch_size,
                    directory,
                    plan.phases,
                )
                run.update(
                    {
                        "end_to_end_requests": burst,
                        "end_to_end_tps": round(e2e["end_to_end_tps"]),
                        "end_to_end_over_engine": round(e2e["end_to_end_tps"] / run["engine_tps"], 3),
                        "memory_mb": e2e["memory_mb"],
                    }
                )
                for name, _, _ in plan.phases:
                    run[name] = rounded(e2e[name])
            except Exception as exc:
                run["error"] = f"end to end: {type(exc).__name__}: {exc}"
            finally:
                shutil.rmtree(directory, ignore_errors=True)
    for run in runs.values():
        say("    " + format_run(run))
    entry["seconds"] = round(time.monotonic() - began, 1)
    say(f"    ({entry['seconds']:.0f} s)")


def describe_knobs(spec: Spec) -> str:
    parts = []
    knobs = spec.knobs
    if "hot" in knobs:
        parts.append(f"CI {1 / knobs['hot']:g}")
    if "mp" in knobs:
        parts.append(f"mp {knobs['mp']:.0%}")
    if "theta" in knobs:
        parts.append(f"θ {knobs['theta']:g}")
    if spec.batch_size != DEFAULT_BATCH:
        parts.append(f"batch {spec.batch_size}")
    return ", ".join(parts) or "defaults"
