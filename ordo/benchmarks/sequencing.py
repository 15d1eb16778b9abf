"""`ordo bench sequence`: how many requests per second S sequencers put into the log, for
several S in one run, to find where one sequencer becomes the ceiling.

Each configuration gets a fresh namespace (the largest S request partitions, so every count
splits the requests alike) and S sequencer processes, as `ordo run --sequencers S` starts
them. Once every one of them has written its start-up snapshot (it consumes from then on),
the requests are produced in one go: processes start at different speeds, and requests
waiting before then would let the first one run alone. The rate is read from the log
itself: every batch carries its sequencer's clock at the cut, so the rate counts the entries
of the batches cut while every sequencer was cutting (from the latest first batch to the
earliest last one), without the start or the drain at the end.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ordo.benchmarks.machine import finish_report, machine
from ordo.benchmarks.prefill import new_namespace, produce
from ordo.benchmarks.requests import encode_requests, workload_requests


def sequencing_rate(batches: list) -> float:
    """Entries per second of the batches cut while every sequencer in `batches` was cutting:
    from the time of the latest first batch among the sequencers to the earliest last one,
    counting the batches cut after the first of that span up to its end."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for batch in batches:
        first.setdefault(batch.sequencer, batch.time_ms)
        last[batch.sequencer] = batch.time_ms
    start, end = max(first.values()), min(last.values())
    if end <= start:
        raise ValueError("the sequencers did not run side by side long enough to measure: use more --txns")
    entries = sum(len(batch) for batch in batches if start < batch.time_ms <= end)
    return entries * 1000.0 / (end - start)


def sequence_once(
    bootstrap: str,
    encoded: list,
    request_partitions: int,
    sequencers: int,
    partitions: int,
    max_txns: int,
    timeout: float = 600.0,
) -> float:
    from ordo.services import SequencerProcesses
    from ordo.log.records import SNAPSHOT, LogCursor, LogError, decode, is_batch_record
    from ordo.log.reader import LogReader
    from ordo.sequencer.sequencer import SequencerConfig
    from ordo.broker.topics import Topics, ensure_topics

    namespace = new_namespace("sequence")
    ensure_topics(bootstrap, namespace, request_partitions=request_partitions)
    processes = SequencerProcesses(
        bootstrap, namespace, SequencerConfig(max_txns=max_txns, partitions=partitions, sequencers=sequencers)
    )
    cursor = LogCursor()
    reader = LogReader(bootstrap, Topics(namespace).log, cursor, f"{namespace}.bench-reader")
    ready: set[int] = set()
    batches, entries = [], 0
    processes.start()
    try:
        deadline = time.monotonic() + timeout
        while entries < len(encoded):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{namespace}.log holds {entries} of {len(encoded)} requests after {timeout:.0f} s")
            for offset, value in reader.poll_raw(0.1, 10_000):
                batch = cursor.accept(value, offset)
                if batch is not None:
                    batches.append(batch)
                    entries += len(batch)
                elif len(ready) < sequencers and not is_batch_record(value):
                    try:
                        kind, record = decode(value, namespace, cursor.log_id)
                    except LogError:
                        continue  # the log's first start record, sealed as its first
                    if kind == SNAPSHOT:
                        ready.add(record.sequencer)
                        if len(ready) == sequencers:
                            produce(bootstrap, namespace, encoded)
    finally:
        reader.close()
        processes.stop()
    return sequencing_rate(batches)


def run_sequencing(
    workload: str,
    counts: list[int],
    txns: int,
    seed: int,
    knobs: dict,
    partitions: int,
    max_txns: int,
    json_path: str | None = None,
    rounds: int = 1,
) -> dict[str, Any]:
    from ordo.broker.local import local_broker

    if not counts or any(s < 1 for s in counts):
        raise ValueError("--sequencers takes a comma-separated list of counts >= 1, e.g. 1,2")
    if rounds < 1:
        raise ValueError("--rounds takes a count >= 1")
    counts = sorted(set(counts))
    cores = len(os.sched_getaffinity(0))
    say = lambda text="": print(text, flush=True)  # noqa: E731
    say(
        f"ordo bench sequence {workload}: {txns:,} requests, sequencers {counts}, routing for {partitions} "
        f"partition(s), {cores} cores" + (f", {rounds} rounds" if rounds > 1 else "")
    )
    report: dict[str, Any] = {
        "workload": workload,
        "txns": txns,
        "partitions": partitions,
        "batch_size": max_txns,
        "rounds": rounds,
        "machine": machine(),
        "runs": [],
    }
    encoded = encode_requests(workload_requests(workload, txns, seed, knobs, partitions))
    measured: dict[int, list[float]] = {s: [] for s in counts}
    with local_broker() as broker:
        for round_ in range(rounds):
            for sequencers in counts:
                rate = sequence_once(broker.bootstrap_servers, encoded, counts[-1], sequencers, partitions, max_txns)
                measured[sequencers].append(rate)
                say(f"    round {round_ + 1}: {sequencers} sequencer(s): {rate:,.0f} requests/s")
    base = None
    for sequencers in counts:
        rate = sorted(measured[sequencers])[(rounds - 1) // 2]  # the median (the lower middle of an even count)
        base = base or rate
        run = {
            "sequencers": sequencers,
            "requests_per_s": round(rate),
            "requests_per_s_per_core": round(rate / min(sequencers, cores)),
            "speedup": round(rate / base, 2),
            "rounds": [round(r) for r in measured[sequencers]],
        }
        report["runs"].append(run)
    finish_report(report, json_path)
    say()
    say("sequencers  requests/s  per core  speedup  rounds")
    for run in report["runs"]:
        say(
            f"{run['sequencers']:>10}  {run['requests_per_s']:>10,}  {run['requests_per_s_per_core']:>8,}  "
            f"{run['speedup']:>7.2f}  {' '.join(f'{r:,}' for r in run['rounds'])}"
        )
    return report
