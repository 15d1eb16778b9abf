"""The load sweep's knee and picture (ordo/benchmarks/sweep_plot.py), from reports shaped
as `ordo bench latency --json` writes them."""

from ordo.benchmarks.sweep_plot import knee, label, plot_sweep


def _run(rate, answered_per_s, p50, p99, requests=None, answered=None):
    requests = requests or int(rate * 10)
    return {
        "rate_rps": rate,
        "requests": requests,
        "answered": requests if answered is None else answered,
        "achieved_rps": answered_per_s,
        "latency_ms": {"p50": p50, "p99": p99},
    }


def _report(runs, partitions=2, mp=1.0, round_txns=2048):
    return {
        "workload": "ycsbt",
        "scheduler": "vll",
        "partitions": partitions,
        "knobs": {"mp": mp},
        "round_txns": round_txns,
        "started": "2026-11-28 04:00:00",
        "machine": {"cpu_model": "AMD EPYC", "cpus": 2},
        "runs": runs,
    }


def test_the_knee_is_the_first_rate_answered_short_of_offered_or_queued():
    kept_up = _report([_run(1000, 999, 12, 40), _run(2000, 1996, 15, 80)])
    short = _report([_run(1000, 999, 12, 40), _run(4000, 3100, 900, 2000), _run(2000, 1990, 14, 70)])
    queued = _report([_run(1000, 1000, 12, 40), _run(2000, 1960, 1056, 1939)])
    lost = _report([_run(1000, 1000, 12, 40, requests=10_000, answered=9_990)])
    assert knee(kept_up) is None
    assert knee(short) == 4000  # in rate order, whatever the runs' order
    assert knee(queued) == 2000  # drained before the end, but behind a queue throughout
    assert knee(lost) == 1000


def test_labels_name_the_configuration_and_one_batch_at_a_time():
    assert label(_report([], round_txns=0)) == "2 partition(s), vll, 100 % mp, one batch at a time"
    assert label(_report([], partitions=1, mp=None)) == "1 partition(s), vll"


def test_the_sweep_is_drawn_with_every_configuration(tmp_path):
    reports = [
        _report([_run(1000, 999, 12, 40), _run(2000, 1700, 3782, 4283)], round_txns=0),
        _report([_run(1000, 999, 11, 35), _run(2000, 1990, 20, 90)]),
    ]
    path = plot_sweep(reports, str(tmp_path / "sweep.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
