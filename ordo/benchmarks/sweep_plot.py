"""The load sweep as a picture: p50 and p99 against the offered rate, one line per
configuration (`ordo bench latency`'s reports), each configuration's knee marked: the
first rate whose outcomes per second fall short of what was offered."""

from __future__ import annotations

from typing import Any

# Answered per second below this share of the offered rate: the pipeline did not keep up.
KEPT_UP = 0.97
# A median above this is a queue, not a pipeline: requests wait behind a backlog even where
# it is drained before the run ends (so answered/s still reaches the offered rate).
QUEUED_MS = 250.0


def knee(report: dict[str, Any]) -> float | None:
    """The lowest offered rate this configuration did not keep up with, None if it kept up
    with every one."""
    for run in sorted(report["runs"], key=lambda run: run["rate_rps"]):
        if (
            run["answered"] < run["requests"]
            or (run["achieved_rps"] or 0) < KEPT_UP * run["rate_rps"]
            or (run["latency_ms"]["p50"] or 0) > QUEUED_MS
        ):
            return run["rate_rps"]
    return None


def label(report: dict[str, Any]) -> str:
    mp = report.get("knobs", {}).get("mp")
    share = "" if mp is None or report["partitions"] == 1 else f", {100 * mp:g} % mp"
    rounds = ", one batch at a time" if report.get("round_txns") == 0 else ""
    return f"{report['partitions']} partition(s), {report['scheduler']}{share}{rounds}"


def plot_sweep(reports: list[dict[str, Any]], path: str) -> str:
    from ordo.extras import require

    require("matplotlib", "bench", "the sweep plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 5), sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, report in enumerate(reports):
        runs = sorted(report["runs"], key=lambda run: run["rate_rps"])
        rates = [run["rate_rps"] for run in runs]
        colour = colours[i % len(colours)]
        bend = knee(report)
        for axis, percentile in zip(axes, ("p50", "p99")):
            values = [run["latency_ms"][percentile] for run in runs]
            axis.plot(rates, values, marker="o", color=colour, linewidth=2, label=label(report))
            if bend is not None:
                at = rates.index(bend)
                axis.plot([bend], [values[at]], marker="X", markersize=13, color=colour, linestyle="none")
    for axis, percentile in zip(axes, ("p50", "p99")):
        axis.set_yscale("log")
        axis.set_xlabel("offered requests/s (open loop)")
        axis.set_ylabel(f"{percentile} latency, ms (log scale)")
        axis.grid(True, which="both", alpha=0.25)
    axes[0].legend(fontsize=8, loc="upper left")
    machine = reports[0].get("machine", {}) if reports else {}
    figure.suptitle(
        f"Ordo latency against load ({reports[0]['workload'] if reports else ''}); X: the knee, the first rate "
        f"answered below {KEPT_UP:.0%} of offered or with a median above {QUEUED_MS:g} ms\n{machine.get('cpu_model', '?')}, {machine.get('cpus', '?')} "
        f"vCPUs, {(reports[0].get('started') or '')[:10] if reports else ''}",
        fontsize=10,
    )
    figure.tight_layout(rect=(0, 0, 1, 0.92))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
