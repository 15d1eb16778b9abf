"""Live reads measured end to end (docs/benchmarks.md, "Live reads"), on one `ordo run`
of the built-in micro workload and the local broker:

    ordo bench reads [--partitions 2] [--runtime local|ray] [--seconds 10] [--json F]

1. light load: point reads one at a time, nothing else running: p50 and p99;
2. writes alone: a closed loop of `micro_rmw` requests (rounds of 2,000), answered writes/s;
3. the same writes beside a flood of point reads (256 in flight, from a process of its own):
   reads/s answered, and the writes/s answered beside them, as a ratio of (2) from the same run.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from ordo.benchmarks.machine import finish_report, machine
from ordo.broker.local import local_broker
from ordo.client import Client

KEYS = 10_000
WRITE_ROUND = 2_000
READS_IN_FLIGHT = 256


def _engine(bootstrap: str, namespace: str, data_dir: str, partitions: int, runtime: str, scheduler: str):
    command = [
        sys.executable, "-m", "ordo.cli", "run", "--bootstrap-servers", bootstrap, "--namespace", namespace,
        "--data-dir", data_dir, "--partitions", str(partitions), "--runtime", runtime, "--scheduler", scheduler,
        "--quiet",
    ]  # fmt: skip
    return subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def point_reads(client: Client, seconds: float) -> dict:
    rng, latencies = random.Random(1), []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        started = time.perf_counter()
        client.get("micro", rng.randrange(KEYS))
        latencies.append((time.perf_counter() - started) * 1000)
    return {
        "reads": len(latencies),
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(_percentile(latencies, 0.99), 2),
    }


def _write_loop(client: Client, until: float, answered: list[int]) -> None:
    rng = random.Random(2)
    while time.monotonic() < until:
        requests = [
            {"proc": "micro_rmw", "args": {"keys": [rng.randrange(KEYS), rng.randrange(KEYS)]}}
            for _ in range(WRITE_ROUND)
        ]
        sent = client.submit_many(requests).sent
        answered[0] += len(client.wait(sent, timeout=120))


def _read_flood(client: Client, until: float) -> tuple[int, list[float]]:
    """Point reads kept READS_IN_FLIGHT at a time until `until`: each answer sends the next
    read from the thread that took it, so no thread waits on another per read."""
    state, rng, latencies = client.state_reader(), random.Random(3), []
    finished = threading.Event()
    in_flight = [READS_IN_FLIGHT]
    lock = threading.Lock()

    def send() -> None:
        asked = time.perf_counter()
        state.submit("micro", keys=[rng.randrange(KEYS)]).add_done_callback(lambda done: answered(done, asked))

    def answered(done, asked: float) -> None:
        done.result()
        latencies.append((time.perf_counter() - asked) * 1000)
        if time.monotonic() < until:
            send()
            return
        with lock:
            in_flight[0] -= 1
            if not in_flight[0]:
                finished.set()

    for _ in range(READS_IN_FLIGHT):
        send()
    finished.wait(max(0.0, until - time.monotonic()) + 60)
    return len(latencies), latencies


def _flood(bootstrap: str, namespace: str, seconds: float, results) -> None:
    """A process of its own that reads for `seconds` (the writer's process keeps its own
    interpreter lock), and puts its count and latencies on `results`."""
    with Client(bootstrap, namespace) as reader:
        reader.get("micro", 0)
        results.put("ready")
        start = time.monotonic()
        reads, latencies = _read_flood(reader, start + seconds)
        results.put((reads, time.monotonic() - start, latencies))


def writes(bootstrap: str, namespace: str, seconds: float, with_reads: bool) -> dict:
    import multiprocessing

    answered = [0]
    flood = results = None
    if with_reads:
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        flood = context.Process(target=_flood, args=(bootstrap, namespace, seconds, results), daemon=True)
        flood.start()
        assert results.get(timeout=120) == "ready"
    with Client(bootstrap, namespace) as writer:
        started = time.monotonic()
        thread = threading.Thread(target=_write_loop, args=(writer, started + seconds, answered), daemon=True)
        thread.start()
        thread.join(180)
        elapsed = time.monotonic() - started
    result = {"writes_per_s": round(answered[0] / elapsed), "seconds": round(elapsed, 1)}
    if flood is not None and results is not None:
        reads, read_seconds, read_latencies = results.get(timeout=120)
        flood.join(30)
        result.update(
            reads_per_s=round(reads / read_seconds),
            read_p50_ms=round(statistics.median(read_latencies), 1),
            read_p99_ms=round(_percentile(read_latencies, 0.99), 1),
        )
    return result


def run_reads(
    partitions: int = 2,
    runtime: str = "local",
    scheduler: str = "serial",
    seconds: float = 10.0,
    json_path: str | None = None,
) -> dict:
    report: dict = {
        "benchmark": "reads",
        "partitions": partitions,
        "runtime": runtime,
        "scheduler": scheduler,
        "machine": machine(),
    }
    with tempfile.TemporaryDirectory(prefix="ordo-reads-") as root, local_broker() as broker:
        bootstrap, namespace = broker.bootstrap_servers, f"reads-bench-{os.getpid()}"
        engine = _engine(bootstrap, namespace, os.path.join(root, "d"), partitions, runtime, scheduler)
        try:
            with Client(bootstrap, namespace) as client:
                client.wait_for_topics()
                keys = list(range(KEYS))
                warm = [{"proc": "micro_rmw", "args": {"keys": keys[i : i + 10]}} for i in range(0, KEYS, 10)]
                client.wait(client.submit_many(warm).sent, timeout=120)
                client.get("micro", 0)
                report["light"] = point_reads(client, seconds)
            print(f"point reads, one at a time: p50 {report['light']['p50_ms']} ms, p99 {report['light']['p99_ms']} ms")
            report["writes_alone"] = writes(bootstrap, namespace, seconds, with_reads=False)
            report["writes_with_reads"] = writes(bootstrap, namespace, seconds, with_reads=True)
        finally:
            engine.terminate()
            engine.wait(60)
    alone, beside = report["writes_alone"], report["writes_with_reads"]
    report["writes_kept"] = round(beside["writes_per_s"] / max(1, alone["writes_per_s"]), 3)
    print(
        f"writes alone {alone['writes_per_s']:,}/s; beside {beside['reads_per_s']:,} reads/s "
        f"(p50 {beside['read_p50_ms']} ms, p99 {beside['read_p99_ms']} ms): {beside['writes_per_s']:,} writes/s "
        f"({report['writes_kept']:.0%} of alone)"
    )
    return finish_report(report, json_path)
