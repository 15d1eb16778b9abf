"""`ordo bench` and the PostgreSQL baseline: the baseline computes what the serial
interpretation computes, a single configuration reports every documented figure, and the
suite's plot is drawn from a result set."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ordo.benchmarks.baseline import BaselineUnavailable, PostgresServer, check_serial, run_baseline, serial_state
from ordo.client import Client
from ordo.procedures.workloads import micro, sl
from ordo.broker.topics import ensure_topics
from tests.helpers import ordo_output

ROUNDED = 0.0006  # the report gives ratios to 3 decimals


@pytest.fixture(scope="module")
def postgres():
    try:
        server = PostgresServer(install=True).start()
    except BaselineUnavailable as exc:
        pytest.skip(f"PostgreSQL baseline unavailable: {exc}")
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    "workload, requests",
    [
        ("micro", list(micro.generate(300, 5, hot=20))),
        ("sl", list(sl.generate(300, 5))),
    ],
)
def test_baseline_matches_serial_interpretation(broker, namespace, postgres, workload, requests):
    # Two request partitions: the baseline's consumption order need not be the order in
    # which the requests were produced, so the check must follow the baseline's own order.
    ensure_topics(broker, namespace, request_partitions=2)
    client = Client(broker, namespace)
    client.submit(requests)
    client.close()

    result = run_baseline(broker, namespace, workload, len(requests), postgres)

    assert result.committed + result.aborted == len(requests) and result.rejected == 0
    assert sorted(entry[0] for entry in result.order) == sorted(r["id"] for r in requests)
    if workload == "sl":
        assert result.aborted > 0  # transfers from empty accounts: the check really ran
    check_serial(result)
    assert result.state == serial_state(result.order, workload)
    assert result.state  # not vacuously equal
    some_key = next(iter(result.state))
    result.state[some_key] += 1
    with pytest.raises(AssertionError, match="differs"):
        check_serial(result)


@pytest.mark.slow
def test_bench_single_configuration_reports_every_figure(tmp_path):
    path = tmp_path / "bench.json"
    ordo_output("bench", "micro", "--txns", "2000", "--json", str(path), timeout=180)
    result = json.loads(path.read_text())
    for name in (
        "storage_limit_tps",
        "engine_tps",
        "replay_tps",
        "recovery_tps",
        "end_to_end_tps",
        "engine_over_limit",
        "end_to_end_over_engine",
        "replay_over_engine",
    ):
        assert result[name] > 0, name
    assert result["batches"] >= 2 and result["txns"] == 2000
    assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["p99"]
    assert result["latency_ms"]["rate_rps"] > 0
    assert result["memory_mb"]["engine"] > 0 and result["memory_mb"]["sequencer"] > 0
    assert result["machine"]["cpus"] >= 1


def fake_report() -> dict:
    runs, log = [], 0
    speed = {"serial": 1.0, "locking": 1.3, "vll": 1.2, "opchain": 0.8}
    for hot in (10_000, 100, 10):
        log += 1
        for scheduler, factor in speed.items():
            tags = ["contention", "base"] if hot == 10_000 else ["contention"]
            runs.append(
                {
                    "log": log,
                    "workload": "micro",
                    "knobs": {"hot": hot},
                    "label": f"CI {1 / hot:g}",
                    "partitions": 1,
                    "batch_size": 200,
                    "tags": tags,
                    "scheduler": scheduler,
                    "storage_limit_tps": 50_000,
                    "engine_tps": round(12_000 * factor),
                    "engine_over_limit": 0.24 * factor,
                    "end_to_end_tps": 8_000,
                    "end_to_end_over_engine": 0.66,
                    "replay_tps": 11_000,
                    "replay_over_engine": 0.9,
                    "latency_ms": {"p50": 40.0, "p99": 90.0},
                    "memory_mb": {"engine": 150.0},
                }
            )
    for mp in (0.0, 0.1, 0.5, 1.0):
        log += 1
        for scheduler, factor in speed.items():
            runs.append(
                {
                    "log": log,
                    "workload": "micro",
                    "knobs": {"hot": 10_000, "mp": mp},
                    "label": f"mp {mp:.0%}",
                    "partitions": 2,
                    "batch_size": 200,
                    "tags": ["mp"],
                    "scheduler": scheduler,
                    "storage_limit_tps": 45_000,
                    "engine_tps": round(9_000 * factor * (1 - 0.8 * mp)),
                    "engine_over_limit": 0.2,
                }
            )
    logs = [{"log": n, "workload": "micro", "label": "x", "partitions": 1} for n in range(1, log + 1)]
    return {
        "suite": "quick",
        "started": "2026-01-01T00:00:00",
        "runs": runs,
        "logs": logs,
        "baseline": {"sl": {"requests_per_s": 2_000, "durable_requests_per_s": 1_500, "checked_serial": True}},
        "machine": {"cpus": 2, "cpu_model": "test", "memory_gb": 1, "python": "3", "load_average": [0, 0, 0]},
    }


def test_plot_writes_a_png_from_a_result_set(tmp_path):
    from ordo.benchmarks.plot import plot
    from ordo.benchmarks.report import format_report, ratios, targets

    report = fake_report()
    report["ratios"] = ratios(report)
    report["targets"] = targets(report)
    path = plot(report, str(tmp_path / "plot.png"))
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    assert report["ratios"]["opchain_over_locking_micro_ci0.1"] == pytest.approx(0.8 / 1.3, abs=0.01)
    assert "opchain ÷ locking" in format_report(report)


@pytest.mark.slow
def test_bench_scale_measures_every_partition_count_on_one_log(tmp_path):
    path = tmp_path / "scale.json"
    out = ordo_output(
        "bench",
        "scale",
        "micro",
        "--partitions",
        "1,2",
        "--txns",
        "3000",
        "--max-txns",
        "100",
        "--json",
        str(path),
        timeout=300,
    )
    report = json.loads(path.read_text())
    runs = report["runs"]
    assert [r["partitions"] for r in runs] == [1, 2]
    for run in runs:
        assert run["engine_tps"] > 0 and run["end_to_end_tps"] > 0 and run["batches"] == 30
        assert run["multi_partition_share"] == 0
        cpu = run["cpu_ms_per_ktxn"]
        assert set(cpu) == ({"broker", "driver"} if run["partitions"] == 1 else {"broker", "driver", "workers"})
        # The broker's share of so short a run can be below the 10 ms a clock tick counts,
        # so it is only required to be measured; the engine's own work always shows.
        assert cpu["broker"] >= 0
        assert cpu["driver"] + cpu.get("workers", 0) > 0
    assert runs[0]["cpu_ms_per_ktxn"]["driver"] > runs[1]["cpu_ms_per_ktxn"]["driver"]  # the worker left it
    # End to end, each process's CPU per request: at 2 partitions each Ray worker is its own.
    for run in runs:
        workers = {f"worker {p}" for p in range(run["partitions"])} if run["partitions"] > 1 else set()
        cpu = run["cpu_us_per_request"]
        assert set(cpu) == {"broker", "sequencer", "engine", "client", "all"} | workers
        assert cpu["sequencer"] > 0 and cpu["client"] > 0 and all(us >= 0 for us in cpu.values())
    assert "CPU µs per request" in out
    assert runs[0]["engine_speedup"] == 1.0
    assert runs[1]["engine_speedup"] == pytest.approx(runs[1]["engine_tps"] / runs[0]["engine_tps"], rel=0.01)
    assert "speedup" in out


@pytest.mark.slow
def test_bench_scale_takes_turns_over_rounds_and_compares_multi_partition_shares(tmp_path):
    path = tmp_path / "scale.json"
    out = ordo_output(
        "bench",
        "scale",
        "micro",
        "--partitions",
        "1,2",
        "--mp",
        "0,1",
        "--rounds",
        "3",
        "--txns",
        "2000",
        "--max-txns",
        "100",
        "--scheduler",
        "vll",
        "--no-end-to-end",
        "--json",
        str(path),
        timeout=600,
    )
    report = json.loads(path.read_text())
    runs = report["runs"]
    assert report["rounds"] == 3
    assert [(r["partitions"], r["mp"]) for r in runs] == [(1, 0.0), (2, 0.0), (1, 1.0), (2, 1.0)]
    assert [r["multi_partition_share"] for r in runs] == [0.0, 0.0, 0.0, 1.0]
    for run in runs:
        assert len(run["engine_tps_rounds"]) == 3
        assert run["engine_tps"] == sorted(run["engine_tps_rounds"])[1]  # the median round
    zero, full = runs[1], runs[3]
    assert "mp_ratio" not in zero
    assert full["mp_ratio"] == pytest.approx(full["engine_tps"] / zero["engine_tps"], rel=0.01, abs=ROUNDED)
    assert full["mp_ratio_rounds"] == [
        pytest.approx(a / b, rel=0.01, abs=ROUNDED)
        for a, b in zip(full["engine_tps_rounds"], zero["engine_tps_rounds"])
    ]
    assert zero["engine_speedup_rounds"] == [
        pytest.approx(a / b, rel=0.01, abs=ROUNDED)
        for a, b in zip(zero["engine_tps_rounds"], runs[0]["engine_tps_rounds"])
    ]
    assert "median of 3 rounds" in out and out.count("round 3:") == 4
    table = out[out.index("partitions  engine") :].splitlines()[1:5]
    assert all(row.split()[4:6] == ["-", "-"] for row in table), table  # end to end: not measured


@pytest.mark.slow
def test_bench_sequence_measures_every_sequencer_count_from_the_log(tmp_path):
    path = tmp_path / "sequence.json"
    out = ordo_output(
        "bench",
        "sequence",
        "micro",
        "--sequencers",
        "1,2",
        "--partitions",
        "2",
        "--txns",
        "6000",
        "--max-txns",
        "100",
        "--json",
        str(path),
        timeout=300,
    )
    report = json.loads(path.read_text())
    runs = report["runs"]
    assert [r["sequencers"] for r in runs] == [1, 2]
    for run in runs:
        assert run["requests_per_s"] > 0 and run["rounds"] == [run["requests_per_s"]]
    assert runs[0]["speedup"] == 1.0
    assert runs[1]["speedup"] == pytest.approx(runs[1]["requests_per_s"] / runs[0]["requests_per_s"], rel=0.01)
    assert "requests/s" in out


def test_sequencing_rate_counts_only_what_was_cut_while_every_sequencer_ran():
    from ordo.benchmarks.sequencing import sequencing_rate
    from ordo.log.records import Batch

    def batch(sequencer, time_ms, size):
        return Batch(1, 0, time_ms, {}, [["r", "p", {}]] * size, sequencer=sequencer)

    # Sequencer 1 starts at 100 ms and stops at 1100 ms; sequencer 0 runs on alone on either side.
    batches = [
        batch(0, 0, 50),
        batch(0, 100, 10),
        batch(1, 100, 10),
        batch(0, 600, 20),
        batch(1, 600, 30),
        batch(1, 1100, 40),
        batch(0, 1100, 60),
        batch(0, 2000, 90),
    ]
    assert sequencing_rate(batches) == (20 + 30 + 40 + 60) * 1000 / 1000
    with pytest.raises(ValueError, match="more --txns"):
        sequencing_rate([batch(0, 0, 1), batch(1, 500, 1), batch(0, 400, 1)])


def test_bench_soak_samples_every_process_and_rocksdb_until_every_request_is_answered(tmp_path):
    out = tmp_path / "soak.json"
    text = ordo_output(
        "bench", "soak", "micro", "--rate", "200", "--seconds", "12", "--every", "4", "--json", str(out), timeout=300
    )
    report = json.loads(out.read_text())
    samples = report["samples"]
    assert len(samples) >= 4 and samples[-1]["answered"] == 2400
    assert [s["answered"] for s in samples] == sorted(s["answered"] for s in samples)
    assert {"engine", "sequencer", "broker"} <= set(samples[-1]["rss_mb"])
    assert samples[-1]["rss_mb"]["engine"] > 20
    assert set(samples[-1]["rocksdb_mb"]) == {"block_cache", "memtables", "table_readers"}
    assert set(report["growth_mb_per_100k"]) == set(samples[-1]["rss_mb"])
    assert "resident growth, MB per 100,000 requests" in text
    assert report["engine_exit"] == 0


def test_bench_soak_bounces_the_broker_and_checks_every_request_once_against_a_serial_reading(tmp_path, fault_report):
    out = tmp_path / "soak.json"
    # A bounce lasts as long as the node takes to stop and start again: 10 s on a quiet machine,
    # 40 to 90 s on a busy one, so how many fit in the soak depends on the day. The first comes
    # 5 s in; a node killed outright is bounced here on a quiet machine and, whatever the day, in
    # test_broker_faults (SIGTERM and SIGKILL in turn under load).
    rate, seconds = 100, 60
    text = ordo_output(
        "bench",
        "soak",
        "micro",
        "--rate",
        str(rate),
        "--seconds",
        str(seconds),
        "--every",
        "10",
        "--bounce-broker-every",
        "5",
        "--broker-down",
        "5",
        "--json",
        str(out),
        timeout=580,
    )
    report = json.loads(out.read_text())
    bounces, check = report["bounces"], report["check"]
    assert bounces and [b["how"] for b in bounces] == [("SIGTERM", "SIGKILL")[i % 2] for i in range(len(bounces))]
    assert all(b["down_s"] >= 5 for b in bounces)
    assert check == {**check, "answered": rate * seconds, "answered_twice": 0, "state_equals_serial_reading": True}
    assert report["engine_exit"] == 0
    assert f"{len(bounces)} broker bounce(s); answering again after" in text
    fault_report(
        f"{len(bounces)} broker bounces ({', '.join(b['how'] for b in bounces)}, 5 s away each) under "
        f"ordo bench soak at {rate}/s: {rate * seconds:,} requests answered once, state equal to the serial "
        f"reading; answering again {', '.join(str(b['resume_s']) for b in bounces)} s after each"
    )


def test_bench_soak_tells_a_request_its_producer_wrote_twice_from_one_answered_twice(broker, namespace):
    """Two records of one id are two requests (the repeat answered `duplicate request id`);
    two outcomes of a request written once are a double answer."""
    from confluent_kafka import Producer

    from ordo.benchmarks.soak import _one_then_duplicates, _records_of

    ensure_topics(broker, namespace, 2)
    topic = f"{namespace}.requests"
    producer = Producer({"bootstrap.servers": broker})
    for request_id in ("a", "a", "b", "c"):
        producer.produce(topic, json.dumps({"id": request_id, "proc": "p", "args": {}}).encode(), key=request_id)
    producer.produce(topic, b"not json")
    assert producer.flush(30) == 0
    assert _records_of(broker, topic, {"a", "b"}) == {"a": 2, "b": 1}
    repeat = ["rejected", "duplicate request id 'a'", 9, 0]
    assert _one_then_duplicates([["committed", None, 3, 1], repeat])
    assert not _one_then_duplicates([["committed", None, 3, 1], ["committed", None, 3, 1]])


def test_bench_soak_refuses_a_rate_it_cannot_send():
    result = subprocess.run(
        [sys.executable, "-m", "ordo.cli", "bench", "soak", "micro", "--rate", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ordo bench: ordo bench soak needs --rate, --seconds and --every above 0"
    ]
