"""`ordo bench compression WORKLOAD`: what each output codec costs and saves. The outputs
of a real run of the workload (its outcomes and change data, encoded as the engine encodes
them) are produced to a local Apache Kafka broker once per codec, codecs taking turns for
`rounds` rounds, by a producer set up as the engine's is; for each codec: bytes the broker
stores, this process's CPU (the producer's compression), the broker's CPU, and records/s.

Which codecs a client reads without a plugin decides what a default can be: every client
reads uncompressed records and gzip; KafkaJS reads nothing else without a codec plugin,
kafka-python needs a package per codec (lz4, python-snappy, zstandard); librdkafka-based
clients and the Java client read all five."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

# codec or codec:level (librdkafka's compression.level)
CODECS = ("none", "gzip:1", "gzip", "snappy", "lz4", "zstd")
READ_BY_EVERY_CLIENT = ("none", "gzip", "gzip:1")


def codec_settings(codec: str) -> dict:
    name, _, level = codec.partition(":")
    return {"compression.type": name, **({"compression.level": int(level)} if level else {})}


def workload_outputs(workload: str, txns: int, seed: int, knobs: dict) -> list[tuple[str, bytes, bytes]]:
    """(topic suffix, key, value) of every output a run of `txns` requests publishes."""
    from ordo.benchmarks.requests import workload_requests
    from ordo.procedures.registry import default_registry
    from ordo.scheduler.outputs import change_records
    from ordo.testing import TestEngine

    requests = workload_requests(workload, txns, seed, knobs, 1)
    engine = TestEngine(default_registry())
    out: list[tuple[str, bytes, bytes]] = []
    try:
        for start in range(0, len(requests), 200):
            first_change = len(engine.changes)
            engine.run_batch(requests[start : start + 200])
            batch = engine.next_batch - 1
            for outcome in engine.outcomes[start : start + 200]:
                out.append(("results", outcome["id"].encode(), json.dumps(outcome, separators=(",", ":")).encode()))
            changes = [[c.txn, c.table, c.key, c.value] for c in engine.changes[first_change:]]
            txns = len(requests[start : start + 200])
            out += [("changes", key, value) for key, value in change_records(batch, txns, range(txns), changes)]
    finally:
        engine.close()
    return out


def _stored_bytes(log_dir: str, topic_prefix: str) -> int:
    total = 0
    for name in os.listdir(log_dir):
        if name.startswith(topic_prefix):
            folder = os.path.join(log_dir, name)
            total += sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".log"))
    return total


def produce_once(
    bootstrap: str, broker_pid: int, log_dir: str, prefix: str, codec: str, outputs: list[tuple[str, bytes, bytes]]
) -> dict:
    import psutil
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from ordo.scheduler.outputs import OUTPUT_LINGER_MS

    topics = {suffix: f"{prefix}.{suffix}" for suffix in ("results", "changes")}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics.values()]).values():
        future.result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": OUTPUT_LINGER_MS,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
            **codec_settings(codec),
        }
    )
    broker = psutil.Process(broker_pid)
    broker_cpu, cpu, wall = sum(broker.cpu_times()[:2]), time.process_time(), time.perf_counter()
    for suffix, key, value in outputs:
        while True:
            try:
                producer.produce(topics[suffix], value, key, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError(f"{codec}: the broker did not acknowledge every record")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    time.sleep(0.5)  # the broker's own writes after the last acknowledgement
    broker_cpu = sum(broker.cpu_times()[:2]) - broker_cpu
    return {
        "codec": codec,
        "records": len(outputs),
        "raw_bytes": sum(len(k) + len(v) for _, k, v in outputs),
        "stored_bytes": _stored_bytes(log_dir, prefix + "."),
        "producer_cpu_s": cpu,
        "broker_cpu_s": broker_cpu,
        "records_per_s": len(outputs) / wall,
    }


def run_compression(
    workload: str, txns: int, seed: int, knobs: dict, rounds: int = 3, json_path: str | None = None, stream=sys.stdout
) -> list[dict]:
    from ordo.broker.local import local_broker

    outputs = workload_outputs(workload, txns, seed, knobs)
    runs: dict[str, list[dict]] = {codec: [] for codec in CODECS}
    with local_broker() as broker:
        node = broker.nodes[0]
        for round_ in range(rounds):
            for codec in CODECS:
                runs[codec].append(
                    produce_once(
                        broker.bootstrap_servers,
                        node.pid,
                        node.log_dir,
                        f"bench-{round_}-{codec.replace(':', '-')}",
                        codec,
                        outputs,
                    )
                )
    report = []
    for codec, measured in runs.items():
        median = {
            key: statistics.median(m[key] for m in measured)
            for key in ("stored_bytes", "producer_cpu_s", "broker_cpu_s", "records_per_s")
        }
        report.append(
            {
                "codec": codec,
                "records": measured[0]["records"],
                "raw_bytes": measured[0]["raw_bytes"],
                "read_by_every_client": codec in READ_BY_EVERY_CLIENT,
                "rounds": rounds,
                **median,
            }
        )
    print(
        f"{workload}, {txns:,} requests: {report[0]['records']:,} output records, {report[0]['raw_bytes']:,} bytes "
        f"of keys and values; medians of {rounds} rounds, codecs taking turns",
        file=stream,
    )
    print(
        f"{'codec':7} {'stored bytes':>13} {'÷ none':>7} {'producer CPU':>13} {'broker CPU':>11} "
        f"{'records/s':>10}  read by every client",
        file=stream,
    )
    none = report[0]["stored_bytes"]
    for row in report:
        print(
            f"{row['codec']:7} {row['stored_bytes']:>13,.0f} {row['stored_bytes'] / none:>7.2f} "
            f"{row['producer_cpu_s']:>12.2f}s {row['broker_cpu_s']:>10.2f}s {row['records_per_s']:>10,.0f}  "
            f"{'yes' if row['read_by_every_client'] else 'no'}",
            file=stream,
        )
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
    return report
