"""The change-data consumer: `<ns>.changes` becomes a Delta Lake lake, exactly once.

    ordo spark changes --bootstrap-servers B --namespace NS --output DIR --checkpoint DIR [--once]
    spark-submit spark_jobs/changes_job.py --bootstrap-servers B --namespace NS --output DIR ...

Output (under --output, every one a Delta table; spark_jobs/lake.py says how each is kept):
  changelog/        every change once, append-only: batch, batch_range, batch_time, txn, part,
                    seq, table, key, value, deleted (partitioned by table and batch_range)
  transactions/     every change record once: batch, batch_time, txn, part, parts, txns, changes
  batches/          the engine batches applied to tables/, in order
  tables/<table>/   each engine table as of the last batch in batches/: key, value, batch, txn

Kafka is Spark's own connector (`spark.readStream.format("kafka")`, read_committed, every
partition of the topic); each record is decoded by spark_jobs/records.py. Exactly once across
kills and restarts of the job and the engine's re-publications (docs/spark.md): Spark's
checkpoint holds the source offsets, a record the lake's tables hold already is passed over
(spark_jobs/lake.py), and the state tables are MERGEd one complete engine batch range at a
time.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

if __package__ in (None, ""):  # spark-submit spark_jobs/changes_job.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ordo import stopping  # noqa: E402
from ordo.spark_jobs import lake  # noqa: E402
from ordo.spark_jobs.lake import LakeStats, LakeWriter  # noqa: E402


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

    from ordo.broker.client_settings import user_kafka_settings

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
    stats: LakeStats | None = None,
    source_options: dict | None = None,
    kafka: dict | None = None,
    internal_tables: bool = True,
    optimize_every: int = 0,
):
    """Start the streaming query; returns (query, stats). `source_options`: more options of
    Spark's Kafka source; `kafka`: settings of its Java Kafka client; `optimize_every`:
    compact the lake's files after every that many micro-batches (0: never)."""
    from ordo.spark_jobs.delta_lake import ensure_delta

    ensure_delta(spark)
    stats = stats or LakeStats()
    lake.check_layout(spark, output)
    changes = read_outputs(
        spark,
        bootstrap,
        namespace,
        "changes",
        max_records_per_batch=max_records_per_batch,
        kafka=kafka,
        options=source_options,
    )
    lake_writer = LakeWriter(output, stats, internal_tables=internal_tables)
    write = lake_writer if not optimize_every else _compacting(lake_writer, optimize_every)
    writer = (
        changes.writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .queryName(f"ordo-changes-{namespace}")
    )
    if once:
        writer = writer.trigger(availableNow=True)
    elif trigger_seconds:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    query = writer.start()
    query.ordo_writer = lake_writer
    return query, stats


def _compacting(lake_writer: LakeWriter, every: int):
    def write(df, epoch_id: int) -> None:
        lake_writer(df, epoch_id)
        if lake_writer.stats.micro_batches % every == 0:
            lake_writer.busy = True
            try:
                lake_writer.stats.step = "compacting (OPTIMIZE)"
                started = time.monotonic()
                lake.optimize(df.sparkSession, lake_writer.output, sorted(lake_writer.stats.tables))
                lake_writer.stats.add("optimize", started)
            finally:
                lake_writer.busy = False
                lake_writer.stats.step = ""

    return write


def stop_gracefully(query, wait: float = 120.0) -> None:
    """Stop between micro-batches when possible. Stopping at any point is safe (the
    unfinished micro-batch is replayed on restart, idempotently); waiting for the running
    one only saves that work and the noise Spark makes when a foreachBatch is interrupted."""
    writer = getattr(query, "ordo_writer", None)
    deadline = time.monotonic() + wait
    while writer is not None and writer.busy and query.isActive and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


def describe(stats: LakeStats) -> str:
    """The progress line's text: what is written, and what the writer is doing now."""
    text = (
        f"{stats.read:,} change records read, {stats.micro_batches} micro-batch(es) written, "
        f"{stats.changes:,} changes appended to the change log{_holding(stats.logged)}, "
        f"tables at batch {stats.applied_batch:,}"
    )
    if stats.waiting_batches:
        text += f" ({stats.waiting_batches:,} batch(es) waiting for records)"
    if stats.step:
        text += f"; now {stats.step}"
    return text


def _holding(logged: int | None) -> str:
    """What the change log holds in all, beside this job's own changes."""
    return "" if logged is None else f" ({logged:,} in it)"


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
) -> LakeStats:
    """Run until done (--once: everything on the topic now), the timeout, or Ctrl-C.
    `progress`: print a progress line every that many seconds (0: none)."""
    from ordo.spark_jobs.progress import Progress

    query, stats = start_consumer(spark, bootstrap, namespace, output, checkpoint, once=once, **kwargs)
    try:
        with Progress(spark, "ordo-changes", lambda: describe(stats), progress):
            await_end(query, None if once else timeout)
    except KeyboardInterrupt:
        pass
    finally:
        if query.isActive:
            stop_gracefully(query)
    if query.exception() is not None:
        raise RuntimeError(f"change-data stream stopped with an error: {_first_line(query.exception())}")
    return stats


# How long one wait for the query's end lasts, between looks for a stop signal.
AWAIT_STEP_S = 0.5


def await_end(query, timeout: float | None = None) -> None:
    """Until the query ends, `timeout` seconds pass or a stop signal comes (ordo/stopping.py).
    In short waits: a signal that raised inside a call into the JVM would break py4j's
    connection, in a traceback of fifty lines ('reentrant call inside BufferedReader')."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not stopping.requested():
        step = AWAIT_STEP_S if deadline is None else min(AWAIT_STEP_S, deadline - time.monotonic())
        if step <= 0 or query.awaitTermination(step):
            return


def _first_line(exception) -> str:
    text = str(getattr(exception, "desc", None) or exception)
    return text.strip().splitlines()[0] if text.strip() else type(exception).__name__


# ---------------------------------------------------------------- reading the result


def load_table(spark, output: str, table: str):
    """The current state of one engine table: key, value (JSON texts), batch, txn."""
    return lake.read_delta(spark, lake.table_path(output, table))


def load_changelog(spark, output: str):
    return lake.read_delta(spark, lake.changelog_path(output))


def current_tables(spark, output: str) -> list[str]:
    """The engine tables with a state table in the lake (names as the engine has them)."""
    return sorted(lake.state_tables(spark, output))


def view_name(table: str) -> str:
    """A temporary view's name for an engine table: one identifier part, whatever the
    table's name (`stream.report` -> `ordo_stream_report`)."""
    return "ordo_" + re.sub(r"[^A-Za-z0-9_]", "_", table)


def example_report(spark, output: str, top: int = 5) -> dict:
    """An analytical query over the lake: rows per table and the batch the tables show, and
    for the SL workload the top accounts by balance and the total of all assets (plain
    Spark SQL over the Delta tables)."""
    report: dict = {"tables": {}, "batch": lake.applied_batch(spark, output)}
    tables = current_tables(spark, output)
    for table in tables:
        df = load_table(spark, output, table)
        df.createOrReplaceTempView(view_name(table))
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
    lines = [
        f"tables as of batch {report.get('batch', 0):,}: "
        + (", ".join(f"{t} ({n} rows)" for t, n in report["tables"].items()) or "none yet")
    ]
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
    p.add_argument("--output", required=True, metavar="DIR", help="the lake: where the Delta tables go")
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
    p.add_argument(
        "--optimize-every",
        type=int,
        default=100,
        metavar="N",
        help="compact the lake's small files (Delta OPTIMIZE) after every N micro-batches (default 100; 0: never)",
    )
    p.add_argument(
        "--optimize",
        action="store_true",
        help="compact the lake's small files now (Delta OPTIMIZE) and exit; reads no topic",
    )
    p.add_argument(
        "--no-internal-tables",
        action="store_true",
        help="no state tables for the engine's stream.* and window.* tables (the change log keeps their changes)",
    )
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

    if args.optimize:
        spark = build_session("ordo-changes", args.master)
        started = time.monotonic()
        done = lake.optimize(spark, args.output, current_tables(spark, args.output))
        print(
            f"compacted {len(done)} Delta table(s) in {time.monotonic() - started:.1f}s under {args.output}", file=out
        )
        return 0
    with lake.only_writer(args.output):  # before the session: a second job is refused at once
        spark = build_session("ordo-changes", args.master)
        stopping.take_back()
        return land(spark, args, out)


def land(spark, args, out) -> int:
    """The change data into the lake until done, then the summary (and the example report)."""
    from ordo.spark_jobs.producer_job import key_values

    kafka = key_values(getattr(args, "kafka_option", []), "--kafka-option")
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
        internal_tables=not args.no_internal_tables,
        optimize_every=max(0, args.optimize_every),
    )
    seconds = time.monotonic() - started
    if stats.logged is None:  # no micro-batch ran: nothing was appended, the lake is as it was
        stats.logged_before = lake.changelog_size(spark, args.output)
    print(summary(stats, seconds, args.output), file=out, flush=True)
    if not args.no_report:
        try:
            print(format_report(example_report(spark, args.output)), file=out, flush=True)
        except Exception as exc:  # the report is for show: the lake is written whatever it says
            print(f"(no example report: {_first_line(exc)})", file=out, flush=True)
    return 0


def summary(stats: LakeStats, seconds: float, output: str) -> str:
    line = (
        f"consumed {stats.changes:,} changes ({stats.records:,} change records) in {stats.micro_batches} "
        f"micro-batch(es) in {seconds:.2f}s ({stats.changes_per_second:,.0f} changes/s while writing) into "
        f"{output}, whose change log holds {stats.logged or 0:,} changes; tables as of batch {stats.applied_batch:,}"
    )
    if stats.waiting_batches:
        line += f", {stats.waiting_batches:,} batch(es) waiting for the rest of their records"
    if stats.repeated:
        line += f"; {stats.repeated:,} record(s) the lake held already passed over"
    if stats.passed_over:
        line += (
            f"; {stats.passed_over:,} record(s) of the per-partition format before per-transaction change data "
            f"passed over"
        )
    return line


def main(argv: list[str] | None = None) -> int:
    from ordo.spark_jobs.session import job_main

    stopping.install()
    return job_main("changes_job.py", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
