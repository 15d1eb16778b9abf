"""`ordo bench latency`: the open-loop schedule, the figures of one rate, and the real
command end to end (a low rate, one partition, the local runtime)."""

from __future__ import annotations

import json

import pytest

from ordo.benchmarks.latency import HOPS, hop_times, open_loop, summarize
from tests.helpers import ordo_output


def test_open_loop_keeps_its_schedule_when_a_send_stalls():
    now = [100.0]
    sent = []

    def send(i):
        sent.append(now[0])
        if i == 2:
            now[0] += 0.5  # a stalled send: the ones due meanwhile go at once, and keep their times

    scheduled = open_loop(send, 10, 8, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert scheduled == pytest.approx([100 + i / 10 for i in range(8)])
    assert sent == pytest.approx([100.0, 100.1, 100.2, 100.7, 100.7, 100.7, 100.7, 100.7])


def test_hops_add_up_to_the_latency():
    row = hop_times(10.0, 10_002, 10_015, 10_030, 10.041)
    assert sum(row[h] for h in HOPS) == pytest.approx(row["latency"]) == pytest.approx(41)
    scheduled = [(f"r{i}", 10.0 + i / 100) for i in range(100)]
    outcomes = {k: (t + 0.02 + (0.1 if i == 99 else 0), int(t * 1000) + 12, 0, "committed")
                for i, (k, t) in enumerate(scheduled[:99])}
    requested = {k: int(t * 1000) + 1 for k, t in scheduled}
    logged = {k: int(t * 1000) + 6 for k, t in scheduled}
    run = summarize(100, 1, scheduled, outcomes, requested, logged)
    assert (run["requests"], run["answered"], run["timed"]) == (100, 99, 99)
    assert sum(h["share_pct"] for h in run["hops"].values()) == pytest.approx(100, abs=0.3)
    assert run["latency_ms"]["p50"] <= run["latency_ms"]["p99"] <= run["latency_ms"]["max"]


@pytest.mark.slow
def test_bench_latency_end_to_end(tmp_path):
    path = tmp_path / "latency.json"
    out = ordo_output("bench", "latency", "micro", "--rate", "100", "--seconds", "3", "--partitions", "1",
                      "--scheduler", "vll", "--runtime", "local", "--json", str(path), timeout=300)
    assert "where the time goes" in out and "p99 ms" in out
    report = json.loads(path.read_text())
    assert report["workload"] == "micro" and report["partitions"] == 1 and report["machine"]["cpus"] >= 1
    assert "load_average_end" in report["machine"]
    [run] = report["runs"]
    assert run["rate_rps"] == 100 and run["requests"] == 300
    assert run["answered"] == run["timed"] == run["requests"]  # every request answered and traced
    assert sum(run["statuses"].values()) == run["requests"]
    assert run["achieved_rps"] > 0
    latency = run["latency_ms"]
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert set(run["hops"]) == set(HOPS)
    for hop in run["hops"].values():
        assert hop["p50_ms"] <= hop["p99_ms"]
    assert sum(hop["share_pct"] for hop in run["hops"].values()) == pytest.approx(100, abs=0.5)
    # The pipeline's own hops take time; the client's send lag may round to nothing.
    for hop in ("sequencing", "execution", "delivery"):
        assert run["hops"][hop]["share_pct"] > 0
    assert run["result_timestamps"] == "CreateTime"
