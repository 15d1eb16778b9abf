"""`ordo bench latency`: the open-loop schedule, the figures of one rate, and the real
command end to end (YCSB-T at a low rate, two partitions, the local runtime)."""

from __future__ import annotations

import json
import os

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


def test_open_loop_wakes_once_a_tick_and_sends_nothing_early():
    now = [0.0]
    sent, sleeps = [], []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    scheduled = open_loop(lambda i: sent.append(now[0]), 10_000, 100, clock=lambda: now[0], sleep=sleep, tick=0.001)
    assert len(sleeps) == 10  # 100 requests due over 10 ms: a wake-up a millisecond
    assert all(s >= scheduled[i] - 1e-12 for i, s in enumerate(sent))
    assert max(s - scheduled[i] for i, s in enumerate(sent)) <= 0.001 + 1e-9


def test_hops_add_up_to_the_latency():
    row = hop_times(10.0, 10_002, 10.004, 10_009, 10.015, 10_030, 10.041)
    assert sum(row[h] for h in HOPS) == pytest.approx(row["latency"]) == pytest.approx(41)
    assert [round(row[h]) for h in HOPS] == [2, 2, 5, 6, 15, 11]


def test_the_first_fifth_of_a_run_is_not_timed():
    scheduled = [(f"r{i}", 10.0 + i / 100) for i in range(100)]
    # The first requests wait on a pipeline just under way: 500 ms more, all in execution.
    outcomes = {
        k: (
            t + 0.02 + (0.5 if i < 20 else 0) + (0.1 if i == 98 else 0),
            int(t * 1000) + 12 + (500 if i < 20 else 0),
            0,
            "committed",
        )
        for i, (k, t) in enumerate(scheduled[:99])
    }
    requested = {k: int(t * 1000) + 1 for k, t in scheduled}
    acknowledged = {k: t + 0.003 for k, t in scheduled}
    logged = {k: (int(t * 1000) + 6, i) for i, (k, t) in enumerate(scheduled)}
    readable = {i: t + 0.008 for i, (_, t) in enumerate(scheduled)}
    run = summarize(100, 1, scheduled, outcomes, requested, acknowledged, logged, readable)
    assert (run["requests"], run["answered"], run["timed"], run["timed_after_pct"]) == (100, 99, 79, 20)
    assert sum(h["share_pct"] for h in run["hops"].values()) == pytest.approx(100, abs=0.3)
    assert run["latency_ms"]["p50"] <= run["latency_ms"]["p99"] <= run["latency_ms"]["max"] < 200
    assert run["hops"]["request"]["p50_ms"] == pytest.approx(2, abs=1)
    # What the timing leaves out still shows: the first fifth waited half a second.
    assert run["early_latency_ms"]["p50"] == pytest.approx(520, abs=2)
    # The one slow request among the timed ones lost its time in delivery: the tail's shares say so.
    assert run["tail"]["requests"] == 1
    assert run["tail"]["share_pct"]["delivery"] > 80


@pytest.mark.slow
def test_bench_latency_end_to_end(tmp_path):
    path = tmp_path / "latency.json"
    # YCSB-T as Styx runs it, every transfer between the two partitions.
    out = ordo_output(
        "bench",
        "latency",
        "ycsbt",
        "--rate",
        "100",
        "--seconds",
        "3",
        "--partitions",
        "2",
        "--knob",
        "mp=1",
        "--knob",
        "records=2000",
        "--scheduler",
        "vll",
        "--runtime",
        "local",
        "--json",
        str(path),
        "--broker-warmup",
        "15",
        timeout=300,
    )
    assert "where the time goes" in out and "p99 ms" in out
    # One round of 15 s, however busy the JVM's compiler of a broker just started still is.
    assert "warming up the broker: 15 s" in out and "JIT compiler took" in out
    report = json.loads(path.read_text())
    assert report["workload"] == "ycsbt" and report["partitions"] == 2 and report["machine"]["cpus"] >= 1
    assert report["knobs"] == {"mp": 1.0, "records": 2000}
    assert "load_average_end" in report["machine"]
    warmup = report["broker_warmup"]
    assert warmup["seconds"] == 15 and len(warmup["jit_share_by_round"]) == 1
    assert warmup["jit_share_by_round"][0] > 0  # a broker just started compiles under its first traffic
    [run] = report["runs"]
    assert run["rate_rps"] == 100 and run["requests"] == 300
    assert run["answered"] == run["requests"]  # every request answered
    assert run["timed"] == run["requests"] - run["requests"] // 5  # and traced, after the first fifth
    assert sum(run["statuses"].values()) == run["requests"]
    assert run["achieved_rps"] > 0
    latency = run["latency_ms"]
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert set(run["hops"]) == set(HOPS)
    for hop in run["hops"].values():
        assert hop["p50_ms"] <= hop["p99_ms"]
    assert sum(hop["share_pct"] for hop in run["hops"].values()) == pytest.approx(100, abs=0.5)
    # The pipeline's own hops take time; the client's send lag may round to nothing.
    for hop in ("request", "commit"):
        assert run["hops"][hop]["share_pct"] > 0
    # The workers may read a batch before the client's own log follower does: execution alone
    # can read below nothing on a busy machine, never execution and delivery together.
    assert run["hops"]["execution"]["share_pct"] + run["hops"]["delivery"]["share_pct"] > 0
    assert run["result_timestamps"] == "CreateTime"
    assert run["tail"]["requests"] >= 1
    assert sum(run["tail"]["share_pct"].values()) == pytest.approx(100, abs=0.5)
    assert 0 < run["early_latency_ms"]["p50"] <= run["early_latency_ms"]["p99"]
    assert "the slowest 1 %" in out
    # Every process's CPU per request: the broker's, the sequencer's, the engine's (its two
    # workers run in it here), the client's; a short run's share can be below a clock tick.
    cpu = run["cpu_us_per_request"]
    assert set(cpu) == {"broker", "sequencer", "engine", "client", "all"}
    assert all(us >= 0 for us in cpu.values()) and cpu["engine"] > 0 and cpu["sequencer"] > 0
    assert cpu["all"] == pytest.approx(sum(us for role, us in cpu.items() if role != "all"), abs=0.5)
    assert "CPU µs per request, by process" in out


def test_the_jit_compiler_is_read_from_the_jvms_own_threads():
    from ordo.benchmarks.machine import jit_compiler_cpu_s

    assert jit_compiler_cpu_s(None) is None
    assert jit_compiler_cpu_s(2**22 + 1) is None  # above Linux's largest pid: no such process
    assert jit_compiler_cpu_s(os.getpid()) == 0.0  # Python has no compiler threads
