"""Replay rate and recovery time, measured on one log with the local broker:

    python -m ordo.benchmarks.recovery_time [--txns 20000] [--max-txns 50] [--distances 0,50,200] [--repeat 3]

- engine: a fresh engine executes the whole log (outputs to Kafka, checkpoints every
  100 batches, as `ordo execute` runs by default);
- rebuild: `ordo recover --from-scratch` on that data directory (wipe, replay everything);
- per distance d: the shards are checkpointed d batches before the head, then
  `ordo recover --from-checkpoint` restores them and replays the last d batches.
Engine and replay times run from the first poll of the log (connecting to Kafka included)
to the last batch applied; the final idle wait by which `ordo recover` decides it reached
the head is excluded. Each figure is the median of `repeat` runs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import tempfile
import time

from ordo.client import Client
from ordo.embedded import SequencerThread
from ordo.procedures.workloads import micro
from ordo.recover import ReplayReport, recover
from ordo.scheduler.coordinator import Coordinator
from ordo.broker.local import local_broker
from ordo.sequencer.sequencer import SequencerConfig
from ordo.broker.topics import ensure_topics


def _sequence(bootstrap: str, namespace: str, txns: int, max_txns: int) -> int:
    ensure_topics(bootstrap, namespace, request_partitions=1)
    client = Client(bootstrap, namespace)
    client.submit(list(micro.generate(txns, seed=7)))
    client.close()
    sequencer = SequencerThread(bootstrap, namespace, SequencerConfig(max_txns=max_txns)).start()
    sequencer.wait_for(txns)
    last_batch = sequencer.sequencer.next_batch - 1
    sequencer.stop()
    return last_batch


def _run(bootstrap: str, namespace: str, data_dir: str, until_batch: int, **options) -> float:
    coordinator = Coordinator(bootstrap, namespace, data_dir, "serial", 1, runtime="local", **options)
    started = time.perf_counter()
    coordinator.run(until_batch=until_batch)
    return time.perf_counter() - started


def _checkpoint_now(bootstrap: str, namespace: str, data_dir: str) -> None:
    coordinator = Coordinator(bootstrap, namespace, data_dir, "serial", 1, runtime="local", checkpoint_every=0)
    try:
        coordinator.checkpoint()
    finally:
        coordinator.close()


def _recover(bootstrap: str, namespace: str, data_dir: str, mode: str) -> ReplayReport:
    return recover(
        bootstrap,
        namespace,
        data_dir,
        "serial",
        1,
        mode,
        idle=1.0,
        stream=io.StringIO(),
        runtime="local",
        checkpoint_every=0,
    )


def measure(txns: int = 20_000, max_txns: int = 50, distances: tuple[int, ...] = (0, 50, 200), repeat: int = 3) -> dict:
    root = tempfile.mkdtemp(prefix="ordo-recovery-")
    namespace = f"recovery-measure-{os.getpid()}"
    result: dict = {"workload": "micro", "txns": txns, "max_txns": max_txns, "cpus": os.cpu_count()}
    try:
        with local_broker() as broker:
            bootstrap = broker.bootstrap_servers
            last = _sequence(bootstrap, namespace, txns, max_txns)
            result["batches"] = last
            engine_s = statistics.median(
                _run(bootstrap, namespace, os.path.join(root, f"engine-{i}"), last) for i in range(repeat)
            )
            result["engine"] = {"seconds": round(engine_s, 3), "txns_per_s": round(txns / engine_s)}
            rebuilds = [
                _recover(bootstrap, namespace, os.path.join(root, "engine-0"), "scratch") for _ in range(repeat)
            ]
            assert all(r.to_batch == last for r in rebuilds)
            result["rebuild"] = _summary(rebuilds)
            result["after_checkpoint"] = []
            for i, distance in enumerate(distances):
                data_dir = os.path.join(root, f"{i}-d{distance}")
                _run(bootstrap, namespace, data_dir, last - distance, checkpoint_every=0)
                _checkpoint_now(bootstrap, namespace, data_dir)
                _run(bootstrap, namespace, data_dir, last, checkpoint_every=0)
                reports = [_recover(bootstrap, namespace, data_dir, "checkpoint") for _ in range(repeat)]
                assert all(r.from_batch == last - distance and r.to_batch == last for r in reports), reports
                result["after_checkpoint"].append({"batches_since_checkpoint": distance, **_summary(reports)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


def _summary(reports: list[ReplayReport]) -> dict:
    median = statistics.median
    return {
        "batches": reports[0].batches,
        "txns": reports[0].txns,
        "restore_s": round(median(r.restore_s for r in reports), 3),
        "replay_s": round(median(r.replay_s for r in reports), 3),
        "recovery_s": round(median(r.restore_s + r.replay_s for r in reports), 3),
        "txns_per_s": round(median(r.txns_per_s for r in reports)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txns", type=int, default=20_000)
    parser.add_argument("--max-txns", type=int, default=50, help="batch size cap")
    parser.add_argument("--distances", default="0,50,200", help="batches since the checkpoint, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (the median is shown)")
    args = parser.parse_args()
    result = measure(args.txns, args.max_txns, tuple(int(d) for d in args.distances.split(",")), args.repeat)
    engine, rebuild = result["engine"], result["rebuild"]
    print(f"micro, {result['txns']:,} txns in {result['batches']} batches, {result['cpus']} cpus, serial, 1 partition")
    print(f"  engine (fresh, to head)        {engine['txns_per_s']:>9,} txns/s  {engine['seconds']:>7.2f} s")
    print(
        f"  rebuild from scratch (replay)  {rebuild['txns_per_s']:>9,} txns/s  {rebuild['replay_s']:>7.2f} s "
        f"(+ {rebuild['restore_s']:.2f} s to wipe the shards and start)"
    )
    print("  restore from checkpoint + replay to head:")
    for row in result["after_checkpoint"]:
        print(
            f"    {row['batches_since_checkpoint']:>4} batches since checkpoint: recovery {row['recovery_s']:6.2f} s "
            f"(restore {row['restore_s']:.2f} s, replay {row['replay_s']:.2f} s"
            + (f", {row['txns_per_s']:,} txns/s)" if row["batches"] else ")")
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
