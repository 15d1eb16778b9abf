"""The suite's plot: engine throughput vs contention and vs multi-partition share."""

from __future__ import annotations

from ordo.benchmarks.defaults import DEFAULT_BATCH, SCHEDULERS


def _thousands(value: float, _position=None) -> str:
    return f"{value / 1000:g}k" if value >= 1000 else f"{value:g}"


COLOURS = {"serial": "#4d4d4d", "locking": "#1f77b4", "vll": "#2ca02c", "opchain": "#d62728"}


def plot(report: dict, path: str) -> str:
    """Engine throughput vs contention index (micro, 1 partition) and vs multi-partition
    share (micro, 2 partitions): one line per scheduler, the storage limit dashed."""
    from ordo.extras import require

    require("matplotlib", "bench", "the benchmark plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    runs = [
        run
        for run in report["runs"]
        if run.get("engine_tps") and run["workload"] == "micro" and run["batch_size"] == DEFAULT_BATCH
    ]
    panels = [
        (
            "contention",
            "contention index (1 / hot records), micro, 1 partition",
            lambda run: 1 / run["knobs"]["hot"],
            True,
            [run for run in runs if run["partitions"] == 1 and "contention" in run["tags"]],
        ),
        (
            "mp",
            "multi-partition transactions (%), micro, 2 partitions",
            lambda run: 100 * run["knobs"].get("mp", 0),
            False,
            [run for run in runs if run["partitions"] == 2 and "mp" in run["tags"]],
        ),
    ]
    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, (_, xlabel, x_of, log_x, chosen) in zip(axes, panels):
        for scheduler in SCHEDULERS:
            points = sorted((x_of(run), run["engine_tps"]) for run in chosen if run["scheduler"] == scheduler)
            if points:
                axis.plot(*zip(*points), marker="o", label=scheduler, color=COLOURS.get(scheduler), linewidth=2)
        limits = sorted({(x_of(run), run["storage_limit_tps"]) for run in chosen})
        if limits:
            axis.plot(*zip(*limits), linestyle="--", color="#999999", label="storage limit")
        if log_x:
            axis.set_xscale("log")
        # Log scale: the storage limit and a slow scheduler differ by two orders of magnitude.
        axis.set_yscale("log")
        axis.yaxis.set_major_formatter(ticker.FuncFormatter(_thousands))
        axis.yaxis.set_minor_formatter(
            ticker.FuncFormatter(lambda v, _: _thousands(v, _) if str(round(v))[0] in "235" else "")
        )
        axis.set_xlabel(xlabel)
        axis.set_ylabel("engine throughput (txn/s, log scale)")
        axis.grid(True, which="major", alpha=0.35)
        axis.grid(True, which="minor", alpha=0.12)
    handles: dict = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    figure.legend(
        list(handles.values()), list(handles), loc="lower center", ncol=len(handles), fontsize=10, frameon=False
    )
    machine = report.get("machine", {})
    figure.suptitle(
        f"Ordo engine throughput ({report.get('suite', '')} suite, {machine.get('cpus', '?')} cores, "
        f"{report.get('started', '')[:10]})",
        fontsize=11,
    )
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
