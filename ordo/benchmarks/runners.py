"""The runs a benchmark measures: the engine over a pre-filled log, a replay, and the
whole pipeline end to end with a client process (throughput, latency and memory)."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

from ordo.benchmarks.defaults import LATENCY_LOAD, PACED_MAX_RATE, PACED_SEED, WARMUP_SEED
from ordo.benchmarks.load_client import client_main
from ordo.benchmarks.memory import MemoryWatch, reset_own_peak
from ordo.benchmarks.prefill import Log, new_namespace
from ordo.benchmarks.requests import encode_requests, ordering_of, workload_requests


@dataclass
class EngineRun:
    tps: float
    txns: int
    batches: int
    seconds: float
    # CPU seconds each process spent while the clock ran: "broker", "driver" (this process:
    # the coordinator, and the worker itself with one in-process partition), "workers".
    cpu: dict[str, float] | None = None
    # aria batches: transactions run, and the share the first pass did not decide (the fallback)
    aria: dict[str, float] | None = None


class CpuWatch:
    """CPU time (user + system) of named processes between `start` and `stop`."""

    def __init__(self, pids: dict[str, list[int]]):
        import psutil

        self._processes = {name: [psutil.Process(pid) for pid in ids] for name, ids in pids.items() if ids}
        self._start: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        import psutil

        total = {}
        for name, processes in self._processes.items():
            seconds = 0.0
            for process in processes:
                try:
                    times = process.cpu_times()
                    seconds += times.user + times.system
                except psutil.Error:  # gone: what it used is lost to the figure
                    pass
            total[name] = seconds
        return total

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, float]:
        end = self._now()
        return {name: round(end[name] - self._start[name], 3) for name in end}


def process_roles(coordinator, sequencer_pid: int | None, client_pid: int | None, broker_pid: int | None) -> dict:
    """The pids of each process an end-to-end run uses, by role: the broker, the sequencer,
    the engine (this process: the coordinator, and the partition workers run in it), each
    partition worker of its own process (`worker P`), the client."""
    where = getattr(coordinator.group, "where", None)
    roles: dict[str, list[int]] = {"broker": [broker_pid] if broker_pid else [], "sequencer": [sequencer_pid or 0]}
    roles["engine"] = [os.getpid()]
    for status in where() if where is not None else ():
        roles[f"worker {status['partition']}"] = [status["pid"]]
    roles["client"] = [client_pid or 0]
    return {role: pids for role, pids in roles.items() if all(pids) and pids}


def per_request_us(cpu_s: dict[str, float], requests: int) -> dict[str, float]:
    """CPU microseconds per request, by role, and their sum ('all')."""
    if not requests:
        return {}
    figures = {role: round(seconds * 1e6 / requests, 1) for role, seconds in cpu_s.items()}
    figures["all"] = round(sum(cpu_s.values()) * 1e6 / requests, 1)
    return figures


def engine_throughput(
    bootstrap: str,
    log: Log,
    scheduler: str,
    partitions: int,
    directory: str,
    seconds: float | None = None,
    broker_pid: int | None = None,
    modules: tuple[str, ...] = (),
) -> EngineRun:
    """Transactions/s of the engine over a pre-filled log: the partition workers follow it
    as they always do (read their slices from Kafka, execute, publish the outputs, apply).
    Every worker first applies batch 1 and is held there: that batch pays for connecting
    to the broker and starting up, whatever the log's length. The clock starts when they
    are released and stops when the last worker has applied the last batch, or, with
    `seconds`, the batch every worker is held at once that much time has passed.
    `txns` counts every applied batch, the first included. With `broker_pid`, the CPU time
    of the broker, the workers and this process over the timed stretch is measured too."""
    from ordo.scheduler.coordinator import Coordinator

    sizes = {batch.batch_id: len(batch) for batch, _ in log.batches()}
    if len(sizes) < 2:
        raise ValueError("the engine's clock needs a log of at least two batches (more txns or a smaller --max-txns)")
    coordinator = Coordinator(bootstrap, log.namespace, directory, scheduler, partitions, procedure_modules=modules)
    try:
        coordinator.start(hold_at=1)
        _wait_until_applied(coordinator, 1)
        watch = None
        if broker_pid is not None:
            where = getattr(coordinator.group, "where", None)
            workers = [w["pid"] for w in where()] if where is not None else []
            watch = CpuWatch({"broker": [broker_pid], "driver": [os.getpid()], "workers": workers})
            watch.start()
        started = time.monotonic()
        coordinator.group.hold(log.last_batch)
        last = log.last_batch
        while not all(s["applied"] >= last for s in coordinator.watch(0.1)):
            if seconds is not None and time.monotonic() - started >= seconds:
                last = max(s["executed"] for s in coordinator.watch(0))
                coordinator.group.hold(last)
                _wait_until_applied(coordinator, last)
                break
        statuses = coordinator.watch(0)
        elapsed = max(s["applied_at"] for s in statuses) - started
        cpu = watch.stop() if watch is not None else None
    finally:
        coordinator.close()
    timed = sum(sizes[b] for b in range(2, last + 1))
    return EngineRun(timed / elapsed, timed + sizes[1], last, elapsed, cpu, aria_figures(statuses))


def aria_figures(statuses: list[dict]) -> dict[str, float] | None:
    """Over every batch the workers ran with aria: how many transactions, how many went to
    the fallback, and that share (the first pass's conflict rate)."""
    transactions = sum(s.get("aria", (0, 0))[0] for s in statuses)
    if not transactions:
        return None
    fallbacks = sum(s["aria"][1] for s in statuses)
    return {"transactions": transactions, "fallbacks": fallbacks, "conflict_rate": round(fallbacks / transactions, 4)}


def _wait_until_applied(coordinator, batch_id: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not all(s["applied"] >= batch_id and s["unapplied"] == 0 for s in coordinator.watch(0.005)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers did not apply batch {batch_id} within {timeout:.0f} s")


def replay_throughput(
    bootstrap: str, log: Log, scheduler: str, partitions: int, directory: str, modules: tuple[str, ...] = ()
) -> tuple[float, float]:
    """`ordo.recover.recover` rebuilding a fresh data directory from the whole log (as
    `ordo recover --from-scratch` does): (transactions/s from the first replayed batch to
    the last, transactions/s as recovery reports it, which also counts starting the
    workers, connecting and the first fetch)."""
    from ordo.recover import recover

    report = recover(
        bootstrap,
        log.namespace,
        directory,
        scheduler,
        partitions,
        mode="scratch",
        idle=1.0,
        quiet=True,
        procedure_modules=modules,
    )
    if report.to_batch < log.last_batch:
        raise RuntimeError(f"replay stopped at batch {report.to_batch} of {log.last_batch}")
    return report.steady_txns_per_s, report.txns_per_s


def end_to_end(
    bootstrap: str,
    workload: str,
    knobs: dict,
    requests: list[dict],
    scheduler: str,
    partitions: int,
    batch_size: int,
    directory: str,
    phases: list[tuple[str, float, float]] = (("latency_ms", LATENCY_LOAD, 3.0),),
    modules: tuple[str, ...] = (),
    max_delay_ms: float | tuple[float, float | None] | None = None,
    broker_pid: int | None = None,
) -> dict:
    """Sequencer (child process), engine (this process; Ray workers with 2+ partitions) and
    a client process on a fresh namespace: end-to-end throughput, latency at half of it,
    peak memory per process, and each process's CPU time per request over the client's run
    (the broker's too, with `broker_pid`). `max_delay_ms`: the sequencer's epochs, as
    `sequencer_config` takes them (None: its default)."""
    import multiprocessing
    import queue

    from ordo.services import SequencerProcess
    from ordo.scheduler.coordinator import Coordinator
    from ordo.broker.topics import ensure_topics

    namespace = new_namespace("e2e")
    ensure_topics(bootstrap, namespace, request_partitions=1)
    warmup = encode_requests(workload_requests(workload, 20, WARMUP_SEED, knobs, partitions))
    paced_count = int(sum(load * seconds for _, load, seconds in phases) * PACED_MAX_RATE) + 100
    paced = encode_requests(workload_requests(workload, paced_count, PACED_SEED, knobs, partitions))
    reset = reset_own_peak()
    coordinator = Coordinator(bootstrap, namespace, directory, scheduler, partitions, procedure_modules=modules)
    sequencer = SequencerProcess(
        bootstrap,
        namespace,
        sequencer_config(max_delay_ms, max_txns=batch_size, partitions=partitions, ordering=ordering_of(scheduler)),
        modules,
    )
    engine_error: list[BaseException] = []

    def run_engine() -> None:
        try:
            coordinator.run()
        except BaseException as exc:
            engine_error.append(exc)

    engine = threading.Thread(target=run_engine, daemon=True)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    client = context.Process(
        target=client_main,
        args=(bootstrap, namespace, warmup, encode_requests(requests), paced, list(phases), out),
        daemon=True,
    )
    workers = getattr(coordinator.group, "where", None)
    roles = {"engine": [os.getpid()], "sequencer": [], "workers": [w["pid"] for w in workers()] if workers else []}
    watch = None
    try:
        sequencer.start()
        roles["sequencer"] = [sequencer.pid]
        engine.start()
        client.start()
        watch = MemoryWatch(roles, {"sequencer", "workers"} | ({"engine"} if reset else set())).start()
        cpu = CpuWatch(process_roles(coordinator, sequencer.pid, client.pid, broker_pid))
        cpu.start()
        result = None
        deadline = time.monotonic() + 600
        while result is None:
            try:
                result = out.get(timeout=0.5)
            except queue.Empty:
                if engine_error:
                    raise RuntimeError(f"engine failed: {engine_error[0]!r}") from engine_error[0]
                if not client.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the benchmark client ended without a result")
        memory = watch.stop()
        cpu_s = cpu.stop()
        if "error" in result:
            raise RuntimeError(f"benchmark client: {result['error']}")
    finally:
        if watch is not None:
            watch.stop()
        coordinator.stop()
        if engine.ident is not None:
            engine.join(120)
        else:
            coordinator.close()
        sequencer.stop()
        client.join(10)
        if client.is_alive():
            client.kill()
    result["memory_mb"] = memory
    result["cpu_us_per_request"] = per_request_us(cpu_s, len(warmup) + len(requests) + len(paced))
    return result


def sequencer_config(epochs: float | tuple[float, float | None] | None, **settings):
    """A benchmark's sequencer settings: `epochs` the epoch length in ms where one is given,
    (shortest, longest or None for the default) for epochs that follow the rate, None for
    the default."""
    from ordo.sequencer.sequencer import SequencerConfig

    if isinstance(epochs, (tuple, list)):
        shortest, longest = epochs
        return SequencerConfig(longest, min_delay_ms=shortest, **settings)
    return SequencerConfig(epochs, **settings)


def rounded(values: dict) -> dict:
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in values.items()}


def shutdown_ray() -> None:
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
