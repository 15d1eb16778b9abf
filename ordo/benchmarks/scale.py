"""`ordo bench scale`: engine and end-to-end throughput of one request log at several
partition counts, in one run, with the ratios to the smallest count.

The requests are generated once, aimed at the largest partition count (micro places its
keys by partition), and each partition count gets the same requests sequenced into the
same batches, routed for that count. What differs between runs is only the number of
partition workers. Each worker is pinned to its own core while there are cores; beyond
the machine's cores, workers share them (the figures then say so).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from ordo.benchmarks.machine import finish_report, machine
from ordo.benchmarks.prefill import prefill_log
from ordo.benchmarks.report import cell
from ordo.benchmarks.requests import multi_partition_share, ordering_of, procedure_modules, workload_requests
from ordo.benchmarks.runners import end_to_end, engine_throughput, shutdown_ray

# Published per-core figures of the closest peer (Styx, SIGMOD'25: YCSB-T on 1-CPU workers,
# 32 workers): 198,493 txn/s at 0 % multi-partition, 105,762 at 100 %.
STYX_PER_CORE = {0.0: 198_493 / 32, 1.0: 105_762 / 32}


def cpu_per_ktxn(engine) -> dict[str, float]:
    timed = engine.tps * engine.seconds
    if not engine.cpu or not timed:
        return {}
    return {name: round(seconds * 1e6 / timed, 1) for name, seconds in engine.cpu.items()}


def run_scale(
    workload: str,
    partition_counts: list[int],
    scheduler: str,
    txns: int,
    seed: int,
    knobs: dict,
    max_txns: int,
    end_to_end_too: bool = True,
    json_path: str | None = None,
    rounds: int = 1,
    mp_shares: list[float] | None = None,
    max_delay_ms: float | tuple[float, float | None] | None = None,
) -> dict[str, Any]:
    """With `rounds` > 1 every configuration runs that many times, the configurations
    taking turns round by round, and each reports its median run: a shared machine's slow
    spells then fall on every configuration alike instead of on whichever ran during them.
    `mp_shares` (micro) measures several multi-partition shares in the same run."""
    from ordo.broker.local import local_broker

    if not partition_counts or any(p < 1 for p in partition_counts):
        raise ValueError("--partitions takes a comma-separated list of counts >= 1, e.g. 1,2,4")
    if rounds < 1:
        raise ValueError("--rounds takes a count >= 1")
    if mp_shares and workload != "micro":
        raise ValueError("--mp applies to micro only")
    counts = sorted(set(partition_counts))
    widest = counts[-1]
    shares = list(dict.fromkeys(mp_shares)) if mp_shares else [knobs.get("mp")]
    if workload == "micro":
        knobs = {"partitions": widest, **knobs}
    cores = len(os.sched_getaffinity(0))
    report: dict[str, Any] = {
        "workload": workload,
        "scheduler": scheduler,
        "knobs": knobs,
        "txns": txns,
        "batch_size": max_txns,
        "rounds": rounds,
        "machine": machine(),
        "runs": [],
    }
    root = tempfile.mkdtemp(prefix="ordo-scale-")
    say = lambda text="": print(text, flush=True)  # noqa: E731
    say(
        f"ordo bench scale {workload} ({scheduler}): {txns:,} txns, partitions {counts}"
        + (f", multi-partition shares {shares}" if mp_shares else "")
        + f", {cores} cores"
        + (f", {rounds} rounds" if rounds > 1 else "")
    )
    modules = procedure_modules(workload, knobs)
    try:
        with local_broker() as broker:
            bootstrap = broker.bootstrap_servers
            configurations = []
            for share in shares:
                share_knobs = knobs if share is None else {**knobs, "mp": share}
                requests = workload_requests(workload, txns, seed, share_knobs, widest)
                for partitions in counts:
                    log = prefill_log(
                        bootstrap, requests, max_txns, "scale", partitions, ordering_of(scheduler), modules
                    )
                    configurations.append((share, share_knobs, requests, partitions, log))
            measured: list[list] = [[] for _ in configurations]
            for round_ in range(rounds):
                for i, (share, _, _, partitions, log) in enumerate(configurations):
                    engine = engine_throughput(
                        bootstrap,
                        log,
                        scheduler,
                        partitions,
                        os.path.join(root, f"engine-{i}-{round_}"),
                        broker_pid=broker.pid,
                        modules=modules,
                    )
                    measured[i].append(engine)
                    if rounds > 1:
                        say(
                            f"    round {round_ + 1}: {partitions} partition(s)"
                            + (f", mp {share}" if mp_shares else "")
                            + f": {engine.tps:,.0f} txn/s"
                        )
            for i, (share, share_knobs, requests, partitions, log) in enumerate(configurations):
                engine = median_run(measured[i])
                run: dict[str, Any] = {
                    "partitions": partitions,
                    "multi_partition_share": round(multi_partition_share(requests, partitions), 3),
                    "engine_tps": round(engine.tps),
                    "engine_tps_per_core": round(engine.tps / min(partitions, cores)),
                    "batches": log.last_batch,
                    "cores_used": min(partitions, cores),
                    # CPU milliseconds per 1,000 transactions, by process, over the timed stretch
                    "cpu_ms_per_ktxn": cpu_per_ktxn(engine),
                }
                if mp_shares:
                    run["mp"] = share
                if engine.aria is not None:
                    run["aria"] = engine.aria
                if rounds > 1:
                    run["engine_tps_rounds"] = [round(e.tps) for e in measured[i]]
                if end_to_end_too:
                    e2e = end_to_end(
                        bootstrap,
                        workload,
                        share_knobs,
                        requests,
                        scheduler,
                        partitions,
                        max_txns,
                        os.path.join(root, f"e2e-{i}"),
                        phases=[],
                        modules=modules,
                        max_delay_ms=max_delay_ms,
                        broker_pid=broker.pid,
                    )
                    run["end_to_end_tps"] = round(e2e["end_to_end_tps"])
                    # CPU microseconds per request, by process, over the end-to-end run
                    run["cpu_us_per_request"] = e2e["cpu_us_per_request"]
                report["runs"].append(run)
                say(format_run(run))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutdown_ray()
    add_ratios(report["runs"])
    finish_report(report, json_path)
    say()
    say(format_report(report))
    return report


def median_run(runs: list):
    """The run with the median engine throughput (the lower middle one of an even count)."""
    return sorted(runs, key=lambda e: e.tps)[(len(runs) - 1) // 2]


def add_ratios(runs: list[dict[str, Any]]) -> None:
    """Speedups against the smallest partition count at the same multi-partition share,
    round by round too; with several shares, each run's throughput against the first share
    at the same partition count (`mp_ratio`: 100 % against 0 % multi-partition)."""
    by_share: dict[Any, list[dict]] = {}
    for run in runs:
        by_share.setdefault(run.get("mp"), []).append(run)
    first_share = next(iter(by_share))
    for share, group in by_share.items():
        base = group[0]
        for run in group:
            run["engine_speedup"] = round(run["engine_tps"] / base["engine_tps"], 3)
            if "engine_tps_rounds" in run:
                run["engine_speedup_rounds"] = [
                    round(tps / b, 3) for tps, b in zip(run["engine_tps_rounds"], base["engine_tps_rounds"])
                ]
            if "end_to_end_tps" in run and base.get("end_to_end_tps"):
                run["end_to_end_speedup"] = round(run["end_to_end_tps"] / base["end_to_end_tps"], 3)
            if share != first_share:
                reference = next(r for r in by_share[first_share] if r["partitions"] == run["partitions"])
                run["mp_ratio"] = round(run["engine_tps"] / reference["engine_tps"], 3)
                if "engine_tps_rounds" in run:
                    run["mp_ratio_rounds"] = [
                        round(tps / b, 3) for tps, b in zip(run["engine_tps_rounds"], reference["engine_tps_rounds"])
                    ]


def format_run(run: dict[str, Any]) -> str:
    line = (
        f"  {run['partitions']:>3} partition(s): engine {run['engine_tps']:>9,} txn/s "
        f"({run['engine_tps_per_core']:,}/core, {run['multi_partition_share']:.0%} multi-partition)"
    )
    if "end_to_end_tps" in run:
        line += f", end to end {run['end_to_end_tps']:>9,} req/s"
    cpu = run.get("cpu_ms_per_ktxn")
    if cpu:
        line += "; CPU ms per 1,000 txns: " + ", ".join(f"{name} {ms:,.0f}" for name, ms in cpu.items())
    if run.get("cpu_us_per_request"):
        line += "; end to end, CPU µs per request: " + per_process(run["cpu_us_per_request"])
    if "aria" in run:
        line += f"; aria: {run['aria']['conflict_rate']:.1%} of txns to the fallback"
    return line


def per_process(figures: dict[str, float]) -> str:
    return ", ".join(f"{role} {value:,.1f}" for role, value in figures.items())


def format_report(report: dict[str, Any]) -> str:
    several = any("mp" in run for run in report["runs"])
    lines = [
        f"{report['workload']} | {report['scheduler']} | {report['txns']:,} txns | "
        f"{report['machine']['cpus']} cores"
        + (f" | median of {report['rounds']} rounds" if report.get("rounds", 1) > 1 else ""),
        f"{'partitions':>10} {'engine txn/s':>13} {'per core':>9} {'speedup':>8} {'e2e req/s':>10} "
        f"{'speedup':>8} {'mp share':>9}" + (f" {'÷ first mp':>10}" if several else ""),
    ]
    for run in report["runs"]:
        line = (
            f"{run['partitions']:>10} {run['engine_tps']:>13,} {run['engine_tps_per_core']:>9,} "
            f"{run['engine_speedup']:>8.2f} {cell(run.get('end_to_end_tps'), ',', 10)} "
            f"{cell(run.get('end_to_end_speedup'), '.2f', 8)} {run['multi_partition_share']:>9.0%}"
        )
        if several:
            line += f" {run['mp_ratio']:>10.2f}" if "mp_ratio" in run else f" {'':>10}"
        lines.append(line)
    return "\n".join(lines)
