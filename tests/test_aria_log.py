"""Aria's order is a property of the log: `ordo run --scheduler aria` stamps its batches,
and every engine and every replay reads a stamped batch in aria's order, whatever its
--scheduler. Recovery, a fresh rebuild and a scheduler swap on the same data directory
all reproduce the outcomes, state and change data of the serial reading of that log."""

import subprocess

import pytest

from ordo.client import Client
from ordo.embedded import read_log
from ordo.procedures.registry import default_registry
from ordo.procedures.workloads import micro, sl
from ordo.scheduler.reference import SerialInterpreter
from ordo.log.records import ARIA, Batch
from ordo.broker.topics import ensure_topics
from tests.helpers import (
    assert_same_as_reference,
    dump_state,
    interpret_log,
    ordo,
    ordo_output,
    read_results,
    reference_state,
    run_engine,
    stop,
)

pytestmark = pytest.mark.slow


def _run(broker, namespace, data_dir, scheduler, requests, seen, client):
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--scheduler",
        scheduler,
        "--max-txns",
        "60",
        "--quiet",
    )
    try:
        client.submit(requests)
        return read_results(broker, f"{namespace}.results", seen)
    finally:
        assert stop(engine) == 0


def test_aria_batches_replay_alike_under_every_scheduler(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=2)
    data_dir = str(tmp_path / "d")
    # Few records: transfers conflict on every key and many abort.
    requests = [
        r
        for pair in zip(sl.generate(500, seed=5, records=12), micro.generate(500, seed=6, keys=30, hot=3))
        for r in pair
    ]
    client = Client(broker, namespace)
    _run(broker, namespace, data_dir, "aria", requests[:700], 700, client)
    # The same data directory continues under another scheduler: its batches are in log order.
    records = _run(broker, namespace, data_dir, "locking", requests[700:], len(requests), client)
    client.close()
    outcomes = {r["id"]: r for r in records}
    assert len(records) == len(outcomes) == len(requests)
    last_batch = max(r["batch"] for r in records)
    log = read_log(broker, namespace, last_batch)
    stamped = [b.batch_id for b in log if b.ordering == ARIA]
    assert stamped and stamped == list(range(1, len(stamped) + 1)) and len(stamped) < len(log)
    reference = interpret_log(broker, namespace, last_batch)
    assert outcomes == {o["id"]: o for o in reference.outcomes}
    assert dump_state(data_dir) == reference_state(reference)
    # Aria's order is not log order: read in log order, this log gives other outcomes.
    in_log_order = SerialInterpreter(default_registry()).apply(
        [Batch(b.batch_id, b.generation, b.time_ms, b.offsets, b.entries) for b in log]
    )
    assert in_log_order.outcomes != reference.outcomes

    # Replays: a rebuild from scratch under each log-order scheduler and under aria.
    for scheduler in ("serial", "vll", "aria"):
        rebuilt = str(tmp_path / f"rebuilt-{scheduler}")
        ordo_output(
            "recover",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            rebuilt,
            "--scheduler",
            scheduler,
            "--from-scratch",
            "--quiet",
            "--idle",
            "1",
            timeout=240,
        )
        assert dump_state(rebuilt) == reference_state(reference), scheduler
    # Change data and outcomes as a replay publishes them.
    outputs, digest = run_engine(broker, namespace, last_batch, tmp_path / "collected", "opchain", 1)
    assert_same_as_reference(outputs, digest, last_batch, reference)


def _answered_by_aria_on_ray(broker: str, namespace: str, data_dir: str, requests: list, *options: str) -> list:
    """`ordo run --scheduler aria` on two Ray partitions until every request is answered."""
    client = Client(broker, namespace)
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--scheduler",
        "aria",
        "--partitions",
        "2",
        "--runtime",
        "ray",
        "--quiet",
        *options,
    )
    try:
        client.submit(requests)
        return read_results(broker, f"{namespace}.results", len(requests), timeout=240)
    finally:
        assert stop(engine, timeout=60) == 0
        client.close()


def test_aria_on_two_ray_partitions_equals_its_serial_reading(broker, namespace, tmp_path):
    """Multi-partition transfers and read-modify-writes homed on one Ray partition read and
    write keys of the other; a rebuild on one partition in-process gives the same."""
    ensure_topics(broker, namespace, request_partitions=2)
    data_dir = str(tmp_path / "d")
    requests = [
        r
        for pair in zip(
            sl.generate(400, seed=7, records=16), micro.generate(400, seed=8, partitions=2, keys=40, hot=4, mp=0.6)
        )
        for r in pair
    ]
    records = _answered_by_aria_on_ray(broker, namespace, data_dir, requests, "--max-txns", "80")
    outcomes = {r["id"]: r for r in records}
    assert len(records) == len(outcomes) == len(requests)
    last_batch = max(r["batch"] for r in records)
    assert all(b.ordering == ARIA for b in read_log(broker, namespace, last_batch))
    reference = interpret_log(broker, namespace, last_batch)
    assert outcomes == {o["id"]: o for o in reference.outcomes}
    assert {o["status"] for o in reference.outcomes} == {"committed", "aborted"}
    assert dump_state(data_dir) == reference_state(reference)
    rebuilt = str(tmp_path / "rebuilt")
    ordo_output(
        "recover",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        rebuilt,
        "--scheduler",
        "locking",
        "--partitions",
        "1",
        "--from-scratch",
        "--quiet",
        "--idle",
        "1",
        timeout=240,
    )
    assert dump_state(rebuilt) == reference_state(reference)
    # Outcomes and change data as 3 partitions in one process publish them.
    outputs, digest = run_engine(broker, namespace, last_batch, tmp_path / "three", "vll", 3)
    assert_same_as_reference(outputs, digest, last_batch, reference)


def test_ycsbt_without_analyze_runs_end_to_end_on_two_partitions(broker, namespace, tmp_path):
    """examples/ycsbt.py declares only a home key; on 2 Ray partitions under aria every
    request is answered once and the state is the serial reading's (in log order:
    tests/test_found_keys.py)."""
    from ordo.procedures.loading import load_registry
    from ordo.procedures.workloads import ycsbt

    ensure_topics(broker, namespace, request_partitions=2)
    data_dir = str(tmp_path / "d")
    requests = list(ycsbt.generate(800, seed=3, records=60, partitions=2, mp=0.5))
    records = _answered_by_aria_on_ray(
        broker, namespace, data_dir, requests, "--app", "examples.ycsbt:app", "--max-txns", "100"
    )
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in requests)
    assert {r["status"] for r in records} == {"committed"}
    last_batch = max(r["batch"] for r in records)
    reference = interpret_log(broker, namespace, last_batch, load_registry(["examples.ycsbt:app"]))
    assert {r["id"]: r for r in records} == {o["id"]: o for o in reference.outcomes}
    state = dump_state(data_dir)
    assert state == reference_state(reference)
    assert sum(state.values()) == ycsbt.START * len(state)  # transfers move value, never make it


def test_the_engine_benchmark_reports_aria_first_pass_conflicts(broker, tmp_path):
    """ycsbt without ANALYZE over few keys: the log is stamped aria, the engine runs it, and
    the figures say how many transactions the first pass sent to the fallback."""
    from ordo.benchmarks.prefill import prefill_log
    from ordo.benchmarks.requests import ordering_of, procedure_modules, workload_requests
    from ordo.benchmarks.runners import engine_throughput

    knobs = {"records": 50, "analyze": 0}
    modules = procedure_modules("ycsbt", knobs)
    assert modules == ("ordo.procedures.workloads.ycsbt_open",)
    requests = workload_requests("ycsbt", 600, 1, knobs, 1)
    log = prefill_log(broker, requests, 100, "aria-bench", 1, ordering_of("aria"), modules)
    run = engine_throughput(broker, log, "aria", 1, str(tmp_path / "engine"), modules=modules)
    assert run.aria["transactions"] == 600 and 0 < run.aria["fallbacks"] < 600
    assert run.aria["conflict_rate"] == round(run.aria["fallbacks"] / 600, 4)
    plain = prefill_log(broker, requests, 100, "locking-bench", 1, ordering_of("locking"))
    assert engine_throughput(broker, plain, "locking", 1, str(tmp_path / "locking")).aria is None


def test_aria_engine_sigkilled_ends_as_if_it_never_crashed(broker, namespace, tmp_path, monkeypatch):
    """An aria-ordered log, its engine (2 partitions, local) killed again and again and
    restarted from checkpoints and replays: every outcome and change record, re-emitted or
    not, is the serial reading's."""
    import signal
    import time

    from tests.test_recovery_crash import Feeder, check_against_serial_run, crash_seed, traffic

    monkeypatch.setenv("ORDO_TRACE_APPLIED", "1")
    _, rng = crash_seed()
    ensure_topics(broker, namespace, request_partitions=2)
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    data_dir = str(tmp_path / "data")
    engine_args = (
        "--data-dir",
        data_dir,
        "--partitions",
        "2",
        "--runtime",
        "local",
        "--scheduler",
        "aria",
        "--checkpoint-every",
        "3",
        "--keep-checkpoints",
        "2",
        "--quiet",
    )
    requests = traffic(2400, 2, 11)
    sequencer = ordo("sequence", *kafka, "--max-txns", "40", "--ordering", "aria")
    feeder = Feeder(broker, namespace, requests, chunk=100, pause=0.1)
    feeder.start()
    try:
        for _ in range(4):
            engine = ordo("execute", *kafka, *engine_args, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(1.0, 3.0))
            assert engine.poll() is None
            engine.send_signal(signal.SIGKILL)
            engine.wait()
        feeder.join()
        # The killed engines may have published every outcome already: the last engine has caught
        # up once it answers a request sent after all of them.
        probe = {**requests[-1], "id": "after-the-feed"}
        feeder.client.submit([probe])
        requests.append(probe)
        engine = ordo("execute", *kafka, *engine_args, stderr=subprocess.DEVNULL)
        try:
            read_results(broker, f"{namespace}.results", len(requests), timeout=120)
        finally:
            assert stop(engine) == 0
    finally:
        stop(sequencer)
    assert all(b.ordering == ARIA for b in read_log(broker, namespace, 1))
    check_against_serial_run(broker, namespace, data_dir, requests)
