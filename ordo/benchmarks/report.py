"""The suite's ratios, its targets (BENCHMARKS.md) and the table."""

from __future__ import annotations

import statistics
from typing import Any

from ordo.benchmarks.defaults import DEFAULT_BATCH


def _find(
    report: dict, workload: str, partitions: int, scheduler: str | None = None, batch: int = DEFAULT_BATCH, **knobs
) -> list[dict]:
    found = []
    for run in report["runs"]:
        if run["workload"] != workload or run["partitions"] != partitions or run["batch_size"] != batch:
            continue
        if scheduler is not None and run["scheduler"] != scheduler:
            continue
        if any(run["knobs"].get(k) != v for k, v in knobs.items()):
            continue
        found.append(run)
    return found


def _one(report: dict, workload: str, partitions: int, scheduler: str, field_name: str, **knobs) -> float | None:
    for run in _find(report, workload, partitions, scheduler, **knobs):
        if run.get(field_name):
            return run[field_name]
    return None


def _ratio(a, b) -> float | None:
    return round(a / b, 3) if a and b else None


def ratios(report: dict) -> dict:
    r: dict[str, Any] = {}
    base = [run for run in report["runs"] if "base" in run["tags"] and "engine_tps" in run]
    micro1 = [run for run in base if run["workload"] == "micro" and run["partitions"] == 1]
    if micro1:
        best = max(micro1, key=lambda run: run["engine_tps"])
        r["micro_ci0.0001_1p_best_engine_over_limit"] = best["engine_over_limit"]
        r["micro_ci0.0001_1p_best_scheduler"] = best["scheduler"]

    def engine(partitions: int, scheduler: str, **knobs) -> float | None:
        return _one(report, "micro", partitions, scheduler, "engine_tps", **knobs)

    r["opchain_over_locking_micro_ci0.1"] = _ratio(engine(1, "opchain", hot=10), engine(1, "locking", hot=10))
    r["locking_over_serial_micro_2p_mp50"] = _ratio(engine(2, "locking", mp=0.5), engine(2, "serial", mp=0.5))
    r["vll_over_serial_micro_2p_mp50"] = _ratio(engine(2, "vll", mp=0.5), engine(2, "serial", mp=0.5))
    e2e = [run for run in base if run.get("end_to_end_over_engine")]
    if e2e:
        r["end_to_end_over_engine"] = {
            f"{run['workload']} {run['partitions']}P {run['scheduler']}": run["end_to_end_over_engine"] for run in e2e
        }
        r["end_to_end_over_engine_median"] = round(statistics.median(run["end_to_end_over_engine"] for run in e2e), 3)
        best_micro = max(
            (run for run in e2e if run["workload"] == "micro" and run["partitions"] == 1),
            key=lambda run: run["end_to_end_tps"],
            default=None,
        )
        if best_micro:
            r["end_to_end_over_engine_micro_1p_best"] = best_micro["end_to_end_over_engine"]
    replay = [run for run in base if run.get("replay_over_engine")]
    if replay:
        r["replay_over_engine_median"] = round(statistics.median(run["replay_over_engine"] for run in replay), 3)
        r["replay_over_engine_min"] = min(run["replay_over_engine"] for run in replay)
    latency = [run for run in base if run.get("latency_ms")]
    if latency:
        r["p99_latency_ms_max"] = max(run["latency_ms"]["p99"] for run in latency)
        r["p99_latency_ms_median"] = round(statistics.median(run["latency_ms"]["p99"] for run in latency), 2)
    low = [run for run in base if run.get("latency_low_ms")]
    if low:
        r["p99_low_load_latency_ms_median"] = round(statistics.median(run["latency_low_ms"]["p99"] for run in low), 2)
        r["p50_low_load_latency_ms_median"] = round(statistics.median(run["latency_low_ms"]["p50"] for run in low), 2)
    for workload in ("micro", "sl"):
        baseline = report["baseline"].get(workload, {})
        best = max(
            (
                run
                for run in base
                if run["workload"] == workload and run["partitions"] == 1 and run.get("end_to_end_tps")
            ),
            key=lambda run: run["end_to_end_tps"],
            default=None,
        )
        if best and baseline.get("requests_per_s"):
            r[f"{workload}_end_to_end_over_baseline"] = _ratio(best["end_to_end_tps"], baseline["requests_per_s"])
            r[f"{workload}_end_to_end_over_durable_baseline"] = _ratio(
                best["end_to_end_tps"], baseline.get("durable_requests_per_s")
            )
            r[f"{workload}_engine_over_baseline"] = _ratio(best["engine_tps"], baseline["requests_per_s"])
    for run in (report.get("scale") or {}).get("runs", []):  # ordo bench scale, inside the suite
        if run["partitions"] == 2 and run.get("mp") == 0.0:
            r["scale_vll_2p_over_1p_micro_mp0"] = run["engine_speedup"]
        if run["partitions"] == 2 and "mp_ratio" in run:
            r["scale_vll_2p_mp100_over_mp0"] = run["mp_ratio"]
    # Every scheduler against serial on every log: the matrix behind "scheduler ÷ scheduler".
    by_log: dict[int, dict[str, float]] = {}
    for run in report["runs"]:
        if run.get("engine_tps"):
            by_log.setdefault(run["log"], {})[run["scheduler"]] = run["engine_tps"]
    r["over_serial"] = {}
    for log in report["logs"]:
        tps = by_log.get(log["log"], {})
        if tps.get("serial"):
            r["over_serial"][f"{log['workload']} {log['label']} {log['partitions']}P"] = {
                s: round(v / tps["serial"], 3) for s, v in tps.items() if s != "serial"
            }
    return r


TARGETS = [
    (
        "engine, micro CI 0.0001, 1P, best scheduler ÷ storage limit",
        "micro_ci0.0001_1p_best_engine_over_limit",
        ">=",
        0.30,
    ),
    ("end to end ÷ engine, micro 1P (best scheduler)", "end_to_end_over_engine_micro_1p_best", ">=", 0.60),
    ("end to end ÷ engine, median of the grid", "end_to_end_over_engine_median", ">=", 0.60),
    ("end to end ÷ PostgreSQL baseline, sl", "sl_end_to_end_over_baseline", ">=", 10),
    ("opchain ÷ locking, micro CI 0.1", "opchain_over_locking_micro_ci0.1", ">=", 2),
    ("locking ÷ serial, micro 2P, 50 % multi-partition", "locking_over_serial_micro_2p_mp50", ">", 1),
    ("vll ÷ serial, micro 2P, 50 % multi-partition", "vll_over_serial_micro_2p_mp50", ">", 1),
    ("replay ÷ engine (median of the grid)", "replay_over_engine_median", ">=", 1),
    ("p99 latency at half load, ms (worst of the grid)", "p99_latency_ms_max", "<=", 50),
    ("p99 latency at half load, ms (median of the grid)", "p99_latency_ms_median", "<=", 50),
    ("p99 latency at 10 % load, ms (median of the grid)", "p99_low_load_latency_ms_median", "<=", 50),
    ("scale: 2 ÷ 1 partitions, micro 0 % mp (vll)", "scale_vll_2p_over_1p_micro_mp0", ">=", 1.6),
    ("scale: 100 % ÷ 0 % mp on 2 partitions (vll)", "scale_vll_2p_mp100_over_mp0", ">=", 0.5),
]


def targets(report: dict) -> list[dict]:
    r = report["ratios"]
    rows = []
    for text, key, op, goal in TARGETS:
        value = r.get(key)
        met = None if value is None else {">=": value >= goal, ">": value > goal, "<=": value <= goal}[op]
        rows.append({"figure": text, "key": key, "measured": value, "target": f"{op} {goal}", "met": met})
    return rows


def format_run(run: dict) -> str:
    if "error" in run and "engine_tps" not in run:
        return f"{run['scheduler']:<8} failed: {run['error']}"
    text = f"{run['scheduler']:<8} engine {run['engine_tps']:>7,} txn/s ({run['engine_over_limit']:.2f} × limit)"
    if "replay_tps" in run:
        text += f" | replay {run['replay_over_engine']:.2f} × engine"
    if "end_to_end_tps" in run:
        lat = run["latency_ms"]
        text += (
            f" | e2e {run['end_to_end_tps']:>6,} req/s ({run['end_to_end_over_engine']:.2f} × engine)"
            f" | half load p50 {lat['p50']:.0f} p99 {lat['p99']:.0f} ms"
        )
        if "latency_low_ms" in run:
            text += f", 10 % load p99 {run['latency_low_ms']['p99']:.0f} ms"
    if "memory_mb" in run:
        text += " | " + " ".join(f"{k} {v:.0f}MB" for k, v in run["memory_mb"].items() if v)
    if "error" in run:
        text += f" | failed: {run['error']}"
    return text


def cell(value: Any, spec: str, width: int) -> str:
    """One column of a results table: the figure, or a dash where it was not measured, so
    that nothing unmeasured reads as a measured 0."""
    return (format(value, spec) if value is not None else "-").rjust(width)


def format_report(report: dict) -> str:
    lines = []
    header = (
        f"{'workload':<9}{'knobs':<24}{'P':>2} {'sched':<8}{'limit':>8}{'engine':>8}{'÷lim':>6}"
        f"{'replay':>8}{'÷eng':>6}{'e2e':>7}{'÷eng':>6}{'p50ms':>7}{'p99ms':>7}{'p99@10%':>8}"
        f"{'MB eng/seq/wrk':>16}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for run in report["runs"]:
        if "engine_tps" not in run:
            lines.append(
                f"{run['workload']:<9}{run['label'][:23]:<24}{run['partitions']:>2} {run['scheduler']:<8}"
                f" failed: {run.get('error', '?')}"
            )
            continue
        lat = run.get("latency_ms") or {}
        low = run.get("latency_low_ms") or {}
        mem = run.get("memory_mb") or {}
        memory = "/".join(f"{mem[k]:.0f}" for k in ("engine", "sequencer", "workers") if mem.get(k)) if mem else ""
        lines.append(
            f"{run['workload']:<9}{run['label'][:23]:<24}{run['partitions']:>2} {run['scheduler']:<8}"
            f"{run['storage_limit_tps']:>8,}{run['engine_tps']:>8,}{run['engine_over_limit']:>6.2f}"
            f"{cell(run.get('replay_tps'), ',', 8)}{cell(run.get('replay_over_engine'), '.2f', 6)}"
            f"{cell(run.get('end_to_end_tps'), ',', 7)}{cell(run.get('end_to_end_over_engine'), '.2f', 6)}"
            f"{cell(lat.get('p50'), '.1f', 7)}{cell(lat.get('p99'), '.1f', 7)}{cell(low.get('p99'), '.1f', 8)}"
            f"{memory:>16}"
        )
    lines.append("")
    for workload, b in report["baseline"].items():
        if isinstance(b, dict) and "requests_per_s" in b:
            lines.append(
                f"PostgreSQL baseline, {workload}: {b['requests_per_s']:,} req/s (synchronous_commit off), "
                f"{b.get('durable_requests_per_s', 0):,} req/s (on, the default); "
                f"state = serial interpretation: {b['checked_serial']}, = engine: {b.get('checked_engine')}"
            )
        elif workload == "error" or isinstance(b, dict):
            lines.append(f"PostgreSQL baseline {workload}: {b if isinstance(b, str) else b.get('error')}")
    lines.append("")
    lines.append(f"{'target (BENCHMARKS.md)':<58}{'measured':>10}  {'target':<8} met")
    for row in report["targets"]:
        value = "n/a" if row["measured"] is None else f"{row['measured']:g}"
        met = "-" if row["met"] is None else ("yes" if row["met"] else "NO")
        lines.append(f"{row['figure']:<58}{value:>10}  {row['target']:<8} {met}")
    machine = report["machine"]
    lines.append("")
    lines.append(
        f"machine: {machine['cpus']} × {machine['cpu_model']}, {machine['memory_gb']} GB, Python "
        f"{machine['python']}; load average {machine['load_average']} at start, "
        f"{machine.get('load_average_end')} at end"
    )
    return "\n".join(lines)
