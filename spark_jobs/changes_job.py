"""The change-data consumer: `<ns>.changes` becomes Parquet, exactly once across restarts.

    ordo spark changes --bootstrap-servers B --namespace NS --output DIR --checkpoint DIR [--once]
    spark-submit spark_jobs/changes_job.py --bootstrap-servers B --namespace NS --output DIR ...

Output (under --output):
  changelog/batch=B/txn-T-part-K.parquet
                        every change, append-only, one file per change record (engine batch,
                        transaction, part): part, seq, txn, table, key, value, deleted
  tables/<table>/       the current state of each engine table: key, value (JSON texts) and
                        the batch and txn that wrote it
  _state/<version>/     internal: the merged state with its deletes (tombstones); the newest
                        complete version wins

Kafka is Spark's own connector (`spark.readStream.format("kafka")`, read_committed, every
partition of the topic); each record is decoded by spark_jobs/records.py.

Exactly once (docs/spark.md): Spark's checkpoint holds the source offsets, and every write is
idempotent, so replaying a micro-batch, or a record the engine re-emitted after a crash,
changes nothing:
  - a change-log file is named by its (batch, txn, part) and replaced atomically by a
    file made from the one record of that name, which is the same every time the engine
    emits it (spark_jobs/changelog_files.py);
  - the state is a max-register per (table, key): the change with the greatest (batch, txn)
    wins, deletes included (kept as tombstones), and merging is idempotent, commutative and
    associative; each micro-batch writes a new version, then publishes the touched tables.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass, field

if __package__ in (None, ""):  # spark-submit spark_jobs/changes_job.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STATE_COLUMNS = ("table", "key", "value", "deleted", "batch", "txn")


def changelog_path(output: str) -> str:
    return _join(output, "changelog")


def table_path(output: str, table: str) -> str:
    return _join(output, "tables", re.sub(r"[^A-Za-z0-9_.-]", "_", table))


def _join(*parts: str) -> str:
    return "/".join(p.rstrip("/") for p in parts)


class _Fs:
    """The few Hadoop FileSystem calls the versioned state needs (any Hadoop path works)."""

    def __init__(self, spark, path: str):
        jvm = spark.sparkContext._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._fs = self._Path(path).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def children(self, path: str) -> list[str]:
        p = self._Path(path)
        if not self._fs.exists(p):
            return []
        return sorted(status.getPath().getName() for status in self._fs.listStatus(p) if status.isDirectory())

    def exists(self, path: str) -> bool:
        return self._fs.exists(self._Path(path))

    def delete(self, path: str) -> None:
        self._fs.delete(self._Path(path), True)


def state_versions(spark, output: str) -> list[str]:
    """Complete state versions (Spark wrote _SUCCESS), oldest first."""
    fs = _Fs(spark, output)
    base = _join(output, "_state")
    return [
        v
        for v in fs.children(base)
        if re.fullmatch(r"v\d{10}-[0-9a-f]{8}", v) and fs.exists(_join(base, v, "_SUCCESS"))
    ]


def _version_number(version: str) -> int:
    return int(version[1:11])


@dataclass
class ConsumerStats:
    micro_batches: int = 0
    changes: int = 0
    seconds: float = 0.0
    tables: set = field(default_factory=set)
    phases: dict = field(default_factory=dict)  # seconds per step, summed over micro-batches

    def add(self, phase: str, since: float) -> float:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - since
        return now

    @property
    def changes_per_second(self) -> float:
        return self.changes / self.seconds if self.seconds > 0 else 0.0


class ChangesWriter:
    """The foreachBatch function: one micro-batch of change records into the outputs."""

    def __init__(self, output: str, stats: ConsumerStats | None = None):
        self.output = output
        self.stats = stats or ConsumerStats()
        self.busy = False

    def __call__(self, df, epoch_id: int) -> None:
        self.busy = True
        try:
            self._write(df, epoch_id)
        finally:
            self.busy = False

    def _write(self, df, epoch_id: int) -> None:
        from pyspark.sql import functions as F

        from ordo.spark_jobs.changelog_files import write_records

        started = time.monotonic()
        spark = df.sparkSession
        records = (
            df.select("batch", "txn", "partition", "part", "changes")
            .dropDuplicates(["batch", "txn", "partition", "part"])
            .persist()
        )
        try:
            # The change log: one file per record, written by the executors.
            per_table: dict[str, int] = {}
            for row in records.mapInArrow(
                write_records(changelog_path(self.output)), "table string, changes long"
            ).collect():
                per_table[row["table"]] = per_table.get(row["table"], 0) + row["changes"]
            step = self.stats.add("changelog", started)
            if per_table:
                changes = records.select("batch", "part", F.posexplode("changes").alias("seq", "change")).select(
                    "batch", "part", "seq", "change.txn", "change.table", "change.key", "change.value", "change.deleted"
                )
                self._merge_state(spark, changes, sorted(per_table), step)
        finally:
            records.unpersist()
        self.stats.micro_batches += 1
        self.stats.changes += sum(per_table.values())
        self.stats.tables.update(per_table)
        self.stats.seconds += time.monotonic() - started

    def _merge_state(self, spark, changes, tables: list[str], step: float) -> None:
        from pyspark.sql import functions as F

        base = _join(self.output, "_state")
        versions = state_versions(spark, self.output)
        new_rows = changes.select(*STATE_COLUMNS)
        if versions:
            new_rows = spark.read.parquet(_join(base, versions[-1])).select(*STATE_COLUMNS).unionByName(new_rows)
        # Max-register per key: the greatest (batch, txn) wins; a replayed change ties with
        # itself (same value), an older one loses.
        merged = (
            new_rows.groupBy("table", "key")
            .agg(F.max(F.struct("batch", "txn", "deleted", "value")).alias("w"))
            .select("table", "key", "w.value", "w.deleted", "w.batch", "w.txn")
        )
        number = _version_number(versions[-1]) + 1 if versions else 1
        version = f"v{number:010d}-{uuid.uuid4().hex[:8]}"
        merged.write.mode("overwrite").partitionBy("table").parquet(_join(base, version))
        step = self.stats.add("state", step)
        state = spark.read.parquet(_join(base, version))
        for table in tables:
            (
                state.where((F.col("table") == table) & ~F.col("deleted"))
                .select("key", "value", "batch", "txn")
                .coalesce(1)
                .write.mode("overwrite")
                .parquet(table_path(self.output, table))
            )
        fs = _Fs(spark, self.output)
        for old in fs.children(base):
            if old != version and (old.startswith("v") and _version_number_safe(old) <= number):
                fs.delete(_join(base, old))
        self.stats.add("tables", step)


def _version_number_safe(name: str) -> int:
    try:
        return _version_number(name)
    except ValueError:
        return -1


def source_options(
    bootstrap: str,
    namespace: str,
    topic: str = "changes",
    max_records_per_batch: int | None = None,
    kafka: dict | None = None,
    starting_offsets: str = "earliest",
) -> dict[str, str]:
    """Options of Spark's Kafka source over an engine output, `<ns>.changes` or `<ns>.results`:
    every partition (new ones too) from the log start, committed records only (no open or
    aborted transaction's; the engine writes its outputs idempotently, not in transactions),
    data lost to retention failing the query; the user's Kafka settings translated for the
    Java client, then `kafka` (Java client settings)."""
    from ordo.spark_jobs.kafka_connector import kafka_options

    if topic not in ("changes", "results"):
        raise ValueError(f"an engine output topic is 'changes' or 'results', not {topic!r}")
    own = {
        "isolation.level": "read_committed",
        # Never create the topic by asking for it: the engine makes it with its partition count.
        "allow.auto.create.topics": "false",
    }
    options = {
        "subscribe": f"{namespace}.{topic}",
        "startingOffsets": starting_offsets,
        "failOnDataLoss": "true",
        "includeHeaders": "false",
        **kafka_options(bootstrap, {**(kafka or {}), **own}),
    }
    if max_records_per_batch:
        options["maxOffsetsPerTrigger"] = str(int(max_records_per_batch))
    return options


def check_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> None:
    """The topic must exist: a consumer started before the engine made it, or on a mistyped
    namespace, is an error, not a stream that waits forever."""
    from confluent_kafka.admin import AdminClient

    from ordo.sequencer.kafka_settings import user_kafka_settings

    admin = AdminClient({**user_kafka_settings(), "bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise RuntimeError(
            f"topic {topic} does not exist on {bootstrap} "
            f"({metadata.error if metadata is not None else 'no metadata'}): start the engine of "
            f"that namespace first"
        )


def read_outputs(
    spark,
    bootstrap: str,
    namespace: str,
    topic: str = "changes",
    stream: bool = True,
    max_records_per_batch: int | None = None,
    kafka: dict | None = None,
    options: dict | None = None,
):
    """The engine's `<ns>.changes` or `<ns>.results` through Spark's Kafka source, decoded
    (records.CHANGES_SCHEMA / RESULTS_SCHEMA); a stream, or (stream=False) what it holds now.
    `options`: more options of the Kafka source (they win)."""
    from ordo.spark_jobs.records import decode_outputs

    check_topic(bootstrap, f"{namespace}.{topic}")
    settings = {
        **source_options(bootstrap, namespace, topic, max_records_per_batch if stream else None, kafka),
        **{k: str(v) for k, v in (options or {}).items()},
    }
    if not stream:
        settings.pop("maxOffsetsPerTrigger", None)
        settings["endingOffsets"] = "latest"
    reader = spark.readStream if stream else spark.read
    return decode_outputs(reader.format("kafka").options(**settings).load(), topic)


def start_consumer(
    spark,
    bootstrap: str,
    namespace: str,
    output: str,
    checkpoint: str,
    once: bool = False,
    max_records_per_batch: int | None = None,
    trigger_seconds: float | None = None,
    stats: ConsumerStats | None = None,
    source_options: dict | None = None,
    kafka: dict | None = None,
):
    """Start the streaming query; returns (query, stats). `source_options`: more options of
    Spark's Kafka source; `kafka`: settings of its Java Kafka client."""
    stats = stats or ConsumerStats()
    changes = read_outputs(
        spark,
        bootstrap,
        namespace,
        "changes",
        max_records_per_batch=max_records_per_batch,
        kafka=kafka,
        options=source_options,
    )
    changes_writer = ChangesWriter(output, stats)
    writer = (
        changes.writeStream.foreachBatch(changes_writer)
        .option("checkpointLocation", checkpoint)
        .queryName(f"ordo-changes-{namespace}")
    )
    if once:
        writer = writer.trigger(availableNow=True)
    elif trigger_seconds:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    query = writer.start()
    query.ordo_writer = changes_writer
    return query, stats


def stop_gracefully(query, wait: float = 120.0) -> None:
    """Stop between micro-batches when possible. Stopping at any point is safe (the
    unfinished micro-batch is replayed on restart, idempotently); waiting for the running
    one only saves that work and the noise Spark makes when a foreachBatch is interrupted."""
    writer = getattr(query, "ordo_writer", None)
    deadline = time.monotonic() + wait
    while writer is not None and writer.busy and query.isActive and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


def run_consumer(
    spark,
    bootstrap: str,
    namespace: str,
    output: str,
    checkpoint: str,
    once: bool = False,
    timeout: float | None = None,
    progress: float = 0.0,
    **kwargs,
) -> ConsumerStats:
    """Run until done (--once: everything on the topic now), the timeout, or Ctrl-C.
    `progress`: print a progress line every that many seconds (0: none)."""
    from ordo.spark_jobs.progress import Progress, StreamCounter

    query, stats = start_consumer(spark, bootstrap, namespace, output, checkpoint, once=once, **kwargs)
    counter = StreamCounter()

    def describe() -> str:
        counter.update(query)
        return (
            f"{counter.rows} change records read, {stats.micro_batches} micro-batch(es) written, "
            f"{stats.changes} changes"
        )

    try:
        with Progress(spark, "ordo-changes", describe, progress):
            if timeout is not None and not once:
                query.awaitTermination(timeout)
            else:
                query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        if query.isActive:
            stop_gracefully(query)
    if query.exception() is not None:
        raise RuntimeError(f"change-data stream stopped with an error: {query.exception()}")
    return stats


# ---------------------------------------------------------------- reading the result


def load_table(spark, output: str, table: str):
    """The current state of one engine table: key, value (JSON texts), batch, txn."""
    return spark.read.parquet(table_path(output, table))


def load_changelog(spark, output: str):
    return spark.read.parquet(changelog_path(output))


def current_tables(output: str) -> list[str]:
    base = os.path.join(output, "tables")
    return sorted(os.listdir(base)) if os.path.isdir(base) else []


def example_report(spark, output: str, top: int = 5) -> dict:
    """An analytical query over the result: rows per table, and for the SL workload the
    top accounts by balance and the total of all assets (plain Spark SQL over Parquet)."""
    report: dict = {"tables": {}}
    tables = current_tables(output)
    for table in tables:
        df = load_table(spark, output, table)
        df.createOrReplaceTempView(f"ordo_{table}")
        report["tables"][table] = df.count()
    if "account" in tables:
        report["top_accounts"] = [
            (r["account"], r["balance"])
            for r in spark.sql(
                f"SELECT CAST(key AS BIGINT) AS account, CAST(value AS BIGINT) AS balance FROM ordo_account "
                f"ORDER BY balance DESC, account LIMIT {int(top)}"
            ).collect()
        ]
    if "asset" in tables:
        report["total_assets"] = spark.sql(
            "SELECT COALESCE(SUM(CAST(value AS BIGINT)), 0) AS total FROM ordo_asset"
        ).first()["total"]
    if "micro" in tables:
        report["hottest_micro_keys"] = [
            (r["k"], r["v"])
            for r in spark.sql(
                f"SELECT CAST(key AS BIGINT) AS k, CAST(value AS BIGINT) AS v FROM ordo_micro "
                f"ORDER BY v DESC, k LIMIT {int(top)}"
            ).collect()
        ]
    return report


def format_report(report: dict) -> str:
    lines = ["tables: " + (", ".join(f"{t} ({n} rows)" for t, n in report["tables"].items()) or "none yet")]
    if "top_accounts" in report:
        lines.append("top accounts by balance: " + ", ".join(f"{a}: {b}" for a, b in report["top_accounts"]))
    if "total_assets" in report:
        lines.append(f"total assets: {report['total_assets']}")
    if "hottest_micro_keys" in report:
        lines.append("hottest micro keys: " + ", ".join(f"{k}: {v}" for k, v in report["hottest_micro_keys"]))
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser, kafka: bool = True) -> None:
    if kafka:
        p.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT", help="Kafka bootstrap servers")
        from ordo.spark_jobs.producer_job import add_kafka_arguments

        add_kafka_arguments(p)
    p.add_argument("--output", required=True, metavar="DIR", help="where the Parquet change log and tables go")
    p.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="Spark checkpoint (keep it to resume exactly once)"
    )
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--once", action="store_true", help="consume what the topic holds now, then exit")
    stop.add_argument("--timeout", type=float, default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--master", default=None, metavar="M", help="Spark master (default local[*])")
    p.add_argument(
        "--max-records-per-batch",
        type=int,
        default=None,
        metavar="N",
        help="Kafka offsets per micro-batch at most (Spark's maxOffsetsPerTrigger: change records, "
        "and the transaction markers of a topic written in transactions)",
    )
    p.add_argument("--trigger-seconds", type=float, default=None, metavar="S", help="micro-batch interval")
    p.add_argument("--no-report", action="store_true", help="do not print the example analytical query")
    p.add_argument(
        "--progress-seconds",
        type=float,
        default=5.0,
        metavar="S",
        help="print a progress line to stderr every S seconds (default 5; 0: none)",
    )


def run(args, out=sys.stdout) -> int:
    """`ordo spark changes` and `spark-submit spark_jobs/changes_job.py`."""
    from ordo.spark_jobs.session import build_session

    from ordo.spark_jobs.producer_job import key_values

    kafka = key_values(getattr(args, "kafka_option", []), "--kafka-option")
    spark = build_session("ordo-changes", args.master)
    started = time.monotonic()
    stats = run_consumer(
        spark,
        args.bootstrap_servers,
        args.namespace,
        args.output,
        args.checkpoint,
        once=args.once,
        timeout=args.timeout,
        max_records_per_batch=args.max_records_per_batch,
        trigger_seconds=args.trigger_seconds,
        kafka=kafka,
        progress=args.progress_seconds,
    )
    seconds = time.monotonic() - started
    print(
        f"consumed {stats.changes} changes in {stats.micro_batches} micro-batch(es) in {seconds:.2f}s "
        f"({stats.changes_per_second:,.0f} changes/s while writing) into {args.output}",
        file=out,
        flush=True,
    )
    if not args.no_report:
        print(format_report(example_report(spark, args.output)), file=out, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    from ordo.spark_jobs.session import job_main

    return job_main("changes_job.py", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
