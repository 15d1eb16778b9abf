"""Throughput of the border jobs beside the engine's, on one machine.

    python -m spark_jobs.bench [--rows 20000] [--master local[2]] [--partitions 2]

Starts the local broker, an in-process engine (serial scheduler) and local Spark; warms
Spark up on a small dataset; then publishes an SL dataset of --rows requests with the
producer job (batch, CSV), lets the engine commit it, and lands the change data in the Delta
lake with the changes job (--once, or micro-batches of at most --max-records-per-batch
change records). Prints rows/s of the producer, txns/s and changes/s of the engine (first
request produced to last batch applied), changes/s of the consumer (wall clock of the whole
run, and inside the micro-batches), the seconds of each step, the files the lake holds, the
machine's CPU model and its load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _engine(bootstrap: str, namespace: str, data_dir: str, partitions: int):
    from ordo.embedded import SequencerThread
    from ordo.scheduler.coordinator import Coordinator
    from ordo.sequencer.sequencer import SequencerConfig
    from ordo.broker.topics import ensure_topics

    ensure_topics(bootstrap, namespace, request_partitions=2)
    coordinator = Coordinator(bootstrap, namespace, data_dir, "serial", partitions, runtime="local")
    thread = threading.Thread(target=coordinator.run, daemon=True)
    thread.start()
    sequencer = SequencerThread(bootstrap, namespace, SequencerConfig()).start()
    return coordinator, thread, sequencer


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.processor() or "unknown"


def data_files(folder: str) -> int:
    return sum(name.endswith(".parquet") for _, _, names in os.walk(folder) for name in names)


def run_bench(rows: int, master: str, partitions: int, max_records_per_batch: int | None = None) -> dict:
    from ordo.client import Client
    from ordo.broker.local import local_broker
    from ordo.spark_jobs import changes_job, producer_job
    from ordo.spark_jobs.samples import sl_requests, write_csv
    from ordo.spark_jobs.session import build_session

    work = tempfile.mkdtemp(prefix="ordo-spark-bench-")
    dataset = os.path.join(work, "sl.csv")
    requests = sl_requests(rows, seed=3)
    write_csv(dataset, requests)
    warmup = os.path.join(work, "warmup.csv")
    write_csv(warmup, sl_requests(200, seed=4))
    results: dict = {"rows": rows, "master": master, "engine_partitions": partitions, "cpu": cpu_model()}
    with local_broker() as broker:
        bootstrap = broker.bootstrap_servers
        spark = build_session("ordo-spark-bench", master, shuffle_partitions=2)
        try:
            # Warm-up: Python workers, JIT, first Kafka connections.
            coordinator, thread, sequencer = _engine(bootstrap, "warm", os.path.join(work, "warm-data"), partitions)
            producer_job.produce(spark, bootstrap, "warm", warmup, "csv")
            sequencer.wait_for(200)
            time.sleep(1.0)
            changes_job.run_consumer(
                spark, bootstrap, "warm", os.path.join(work, "warm-out"), os.path.join(work, "warm-ck"), once=True
            )
            sequencer.stop(), coordinator.stop(), thread.join(30)

            coordinator, thread, sequencer = _engine(bootstrap, "bench", os.path.join(work, "data"), partitions)
            started = time.monotonic()
            produced = producer_job.produce(spark, bootstrap, "bench", dataset, "csv")
            results["producer_rows_per_s"] = round(produced.rows_per_second)
            results["producer_seconds"] = round(produced.seconds, 2)
            outcomes = Client(bootstrap, "bench").outcomes([r["id"] for r in requests], timeout=600)
            last = max(o["batch"] for o in outcomes.values())
            while coordinator.stats.last_batch < last:
                time.sleep(0.01)
            engine_seconds = time.monotonic() - started
            results["end_to_end_txns_per_s"] = round(len(outcomes) / engine_seconds)
            results["engine_txns"] = coordinator.stats.txns
            sequencer.stop(), coordinator.stop(), thread.join(30)

            load_before = os.getloadavg()[0]
            consumer_started = time.monotonic()
            stats = changes_job.run_consumer(
                spark,
                bootstrap,
                "bench",
                os.path.join(work, "out"),
                os.path.join(work, "ck"),
                once=True,
                max_records_per_batch=max_records_per_batch,
                optimize_every=0,
            )
            consumer_seconds = time.monotonic() - consumer_started
            results["changes"] = stats.changes
            results["engine_changes_per_s"] = round(stats.changes / engine_seconds)
            results["micro_batches"] = stats.micro_batches
            results["lake_files"] = data_files(os.path.join(work, "out"))
            results["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
            results["consumer_seconds"] = round(consumer_seconds, 2)
            results["consumer_changes_per_s"] = round(stats.changes / consumer_seconds)
            results["consumer_changes_per_s_in_micro_batches"] = round(stats.changes_per_second)
            results["consumer_seconds_by_step"] = {k: round(v, 2) for k, v in stats.phases.items()}
        finally:
            spark.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=2, help="engine partition workers (in-process)")
    parser.add_argument("--max-records-per-batch", type=int, default=None, metavar="N")
    args = parser.parse_args(argv)
    print(json.dumps(run_bench(args.rows, args.master, args.partitions, args.max_records_per_batch), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
