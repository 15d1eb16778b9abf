"""The border producer: a dataset (CSV, JSON lines or Parquet) becomes Ordo transaction
requests on `<ns>.requests`, in one batch or as a stream of files arriving in a folder.

    ordo spark produce --bootstrap-servers B --namespace NS --input PATH --format csv [--stream]
    spark-submit spark_jobs/producer_job.py --bootstrap-servers B --namespace NS --input PATH ...

Column mapping (docs/spark.md): `--id-col` (default id), `--proc-col` (default proc) or a
constant `--proc NAME`, and the arguments either from `--args-col` (default args: a JSON
text, a struct or a map) or built from named columns with `--args-cols a,b,c` (`*`: every
column but id and proc; null columns are left out of the object).
`--app MODULE:ATTR` / `--workloads a,b` (as `ordo run` takes them) type those columns from
the procedures' argument schemas: read as text, each cell cast to its argument's type (a
cell that does not cast goes as its text, for the engine to reject that row alone).
`--wait [--wait-timeout S]`: then count the outcomes (committed, aborted, rejected).
Every row is published, bad ones too: the engine rejects them with a clear error on
`<ns>.results`; the job itself fails only when Kafka does not acknowledge a request.
Kafka is Spark's own connector (`df.write.format("kafka")`); each row is encoded by
spark_jobs/records.py (key = request id, value = Ordo's request JSON).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

if __package__ in (None, ""):  # spark-submit spark_jobs/producer_job.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FORMATS = ("csv", "json", "parquet")
SHOWN_REJECTIONS = 3  # --wait prints the errors of this many rejected rows; the rest are on <ns>.results


@dataclass
class Mapping:
    """Which input columns make a request's id, proc and args."""

    id_col: str = "id"
    proc_col: str | None = "proc"
    proc: str | None = None  # a constant procedure for every row (instead of proc_col)
    args_col: str | None = "args"
    args_cols: list[str] | None = None  # build args from these columns ("*": all but id/proc)
    reader_options: dict[str, str] = field(default_factory=dict)
    # {proc: {arg: records.ARGUMENT_TYPES name}} of an app (argument_types): args_cols are read
    # as text and each cell is cast to its argument's type on the executors.
    argument_types: dict[str, dict[str, str]] | None = None

    @property
    def infers_types(self) -> bool:
        """Args from named columns with no app to type them: Spark infers the column types
        from the data (numbers, not texts)."""
        return self.args_cols is not None and self.argument_types is None


def _reader(spark, fmt: str, mapping: Mapping, stream: bool):
    reader = spark.readStream if stream else spark.read
    if fmt == "csv":
        # RFC 4180 quoting (a quote inside a quoted cell is doubled), as Python's csv writes.
        reader = reader.option("header", "true").option("escape", '"')
    if fmt == "json":
        reader = reader.option("mode", "PERMISSIVE")
    for key, value in mapping.reader_options.items():
        reader = reader.option(key, value)
    return reader.format(fmt)


def input_schema(spark, path: str, fmt: str, mapping: Mapping, stream: bool):
    """The schema to read `path` with (None: let Spark decide, batch only).

    Default mapping: every column a string, so ids keep their spelling and an `args` object of
    a JSON file stays its raw JSON text (Spark keeps a non-string JSON value under a string
    field as its text), which an app's argument types cast (records.cast_args). Args from
    named columns without an app: inferred types. A stream needs a schema up front: it comes
    from the files already there, else from the mapping."""
    from pyspark.sql.types import StringType, StructField, StructType

    if fmt == "parquet":
        if not stream:
            return None
        if not _has_files(path):
            raise ValueError(f"--stream over Parquet needs files in {path} to take the schema from, or --schema")
        return spark.read.parquet(path).schema
    have_files = _has_files(path)
    if mapping.infers_types:
        if not have_files:
            raise ValueError(f"--args-cols with --stream needs files in {path} to infer column types, or --schema")
        return _reader(spark, fmt, mapping, False).option("inferSchema", "true").load(path).schema
    if have_files:
        names = _reader(spark, fmt, mapping, False).load(path).schema.names
        names = [n for n in names if n != "_corrupt_record"]
    else:
        if mapping.args_cols == ["*"]:
            raise ValueError(
                f"--args-cols '*' with --stream needs files in {path} to take the columns from, or --schema"
            )
        names = []
    for name in (mapping.id_col, mapping.proc_col, mapping.args_col, *(mapping.args_cols or ())):
        if name and name != "*" and name not in names:
            names.append(name)
    return StructType([StructField(name, StringType()) for name in names])


def _has_files(path: str) -> bool:
    if os.path.isfile(path):
        return True
    if not os.path.isdir(path):
        return False  # a remote path: let Spark look
    return any(not name.startswith((".", "_")) for name in os.listdir(path))


def to_requests(df, mapping: Mapping):
    """The (id, proc, args) columns of requests (records.encode_requests); args as JSON text."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StringType, StructType

    columns = [c for c in df.columns if c != "_corrupt_record"]
    missing = [
        c
        for c in (
            mapping.id_col,
            None if mapping.proc else mapping.proc_col,
            None if mapping.args_cols is not None else mapping.args_col,
        )
        if c and c not in columns
    ]
    if mapping.args_cols is not None:
        wanted = (
            [c for c in columns if c not in (mapping.id_col, mapping.proc_col)]
            if mapping.args_cols == ["*"]
            else mapping.args_cols
        )
        missing += [c for c in wanted if c not in columns]
    if missing:
        raise ValueError(
            f"input has no column(s) {', '.join(missing)} (columns: {', '.join(columns)}); "
            "map them with --id-col/--proc-col/--args-col/--args-cols"
        )
    request_id = F.col(mapping.id_col).cast("string")
    proc = F.lit(mapping.proc) if mapping.proc else F.col(mapping.proc_col).cast("string")
    if mapping.args_cols is not None:
        # to_json leaves null fields out: sparse columns give each row only its own arguments.
        args = F.to_json(F.struct(*[F.col(c) for c in wanted]))
    else:
        kind = df.schema[mapping.args_col].dataType
        if isinstance(kind, (StructType, MapType)):
            args = F.to_json(F.col(mapping.args_col))
        elif isinstance(kind, StringType):
            args = F.col(mapping.args_col)
        elif isinstance(kind, ArrayType):
            args = F.to_json(F.col(mapping.args_col))
        else:  # a number or a boolean: its JSON text; the engine rejects it as not an object
            args = F.col(mapping.args_col).cast("string")
    return df.select(request_id.alias("id"), proc.alias("proc"), args.alias("args"))


def sink_options(bootstrap: str, namespace: str, kafka: dict | None = None) -> dict[str, str]:
    """Options of Spark's Kafka sink: the topic, the user's Kafka settings (translated for
    the Java client), then the producer settings of Ordo's request producers (idempotent,
    acks=all, REQUEST_BATCHING's linger and batch size), then `kafka` (Java client settings)."""
    from ordo.broker.clients import REQUEST_BATCHING
    from ordo.spark_jobs.kafka_connector import kafka_options

    own = {
        "enable.idempotence": "true",
        "acks": "all",
        **{k: v for k, v in REQUEST_BATCHING.items() if k in ("linger.ms", "batch.size")},
    }
    return {"topic": f"{namespace}.requests", **kafka_options(bootstrap, {**own, **(kafka or {})})}


def read_input(
    spark,
    path: str,
    fmt: str,
    mapping: Mapping,
    stream: bool = False,
    schema=None,
    max_files_per_trigger: int | None = None,
):
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if not stream and not _has_files(path) and "://" not in path:
        raise FileNotFoundError(f"no input at {path}")
    if schema is None:
        schema = input_schema(spark, path, fmt, mapping, stream)
    reader = _reader(spark, fmt, mapping, stream)
    if schema is not None:
        reader = reader.schema(schema)
    elif mapping.infers_types:
        reader = reader.option("inferSchema", "true")
    if stream and max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    return reader.load(path)


@dataclass
class ProduceStats:
    rows: int
    seconds: float
    # With ids collected (produce's collect_ids): the ids the engine names the rows' outcomes by,
    # one per row (a repeated id twice), and how many rows it answers by position instead.
    ids: list[str] | None = None
    by_position: int = 0

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def produce(
    spark,
    bootstrap: str,
    namespace: str,
    path: str,
    fmt: str,
    mapping: Mapping | None = None,
    schema=None,
    kafka: dict | None = None,
    progress: float = 0.0,
    collect_ids: bool = False,
) -> ProduceStats:
    """Batch mode: publish every row of the dataset; returns how many and how fast.
    `progress`: print a progress line every that many seconds (0: none). `collect_ids`: also
    the ids to wait for (outcome_ids), collected on the driver."""
    from pyspark.sql import functions as F

    from ordo.spark_jobs.progress import Progress
    from ordo.spark_jobs.records import encode_requests

    mapping = mapping or Mapping()
    requests = to_requests(read_input(spark, path, fmt, mapping, schema=schema), mapping)
    # Counted up front: Spark's Kafka sink is a V1 write, which reports no observed metrics.
    ids, by_position = None, 0
    if collect_ids:  # the count comes with the ids then
        shapes = requests.select("id", F.col("proc").isNotNull(), F.col("args").isNotNull()).collect()
        ids, by_position = outcome_ids(tuple(shape) for shape in shapes)
        rows = len(shapes)
    else:
        rows = requests.count()
    started = time.monotonic()
    with Progress(spark, "ordo-produce", lambda: f"publishing {rows} requests to {namespace}.requests", progress):
        encoded = encode_requests(requests, mapping.argument_types)
        encoded.write.format("kafka").options(**sink_options(bootstrap, namespace, kafka)).save()
    return ProduceStats(rows, time.monotonic() - started, ids, by_position)


def outcome_ids(shapes: Iterable[tuple[Any, bool, bool]]) -> tuple[list[str], int]:
    """(the ids the engine names the outcomes of these rows by, how many rows it answers
    under their position in <ns>.requests instead) from each row's (id, has proc, has args):
    a message with no usable id, proc or args is not a whole request (sequencer/wire.py)."""
    from ordo.sequencer.wire import id_problem

    ids, by_position = [], 0
    for request_id, has_proc, has_args in shapes:
        if id_problem(request_id) is None and has_proc and has_args:
            ids.append(request_id)
        else:
            by_position += 1
    return ids, by_position


def wait_for_outcomes(bootstrap: str, namespace: str, ids: list[str], timeout: float) -> dict[str, list[dict]]:
    """The outcomes of `ids` on <ns>.results (one per time an id is listed), as many as came
    within `timeout` seconds. Read from the topic's beginning: an id's first outcome there is
    its outcome, and a copy sent again (a retried task, a rerun) is rejected as a duplicate
    after it (docs/spark.md, "Delivery contract")."""
    from ordo.client import Client

    with Client(bootstrap, namespace) as client:
        return client.collect(ids, timeout=timeout, from_beginning=True)


def outcome_summary(ids: list[str], found: dict[str, list[dict]], by_position: int, timeout: float) -> list[str]:
    """The lines `--wait` prints: how many rows were committed, aborted and rejected, what
    was not waited for or did not come, and the first rejections' errors."""
    counts = Counter(outcome.get("status") for outcomes in found.values() for outcome in outcomes)
    parts = [f"{counts.pop(status, 0)} {status}" for status in ("committed", "aborted", "rejected")]
    parts += [f"{n} {status}" for status, n in sorted(counts.items(), key=str)]  # anything else on <ns>.results
    missing = len(ids) - sum(len(outcomes) for outcomes in found.values())
    if missing:
        parts.append(f"{missing} without an outcome after {timeout:g} s")
    if by_position:
        parts.append(f"{by_position} not waited for (no usable id, proc or args: answered by position)")
    rejections = [o for outcomes in found.values() for o in outcomes if o.get("status") == "rejected"]
    lines = ["outcomes: " + ", ".join(parts)]
    lines += [f"rejected {o.get('id')}: {o.get('error')}" for o in rejections[:SHOWN_REJECTIONS]]
    if len(rejections) > SHOWN_REJECTIONS:
        lines.append(f"and {len(rejections) - SHOWN_REJECTIONS} more rejected")
    return lines


def produce_stream(
    spark,
    bootstrap: str,
    namespace: str,
    path: str,
    fmt: str,
    checkpoint: str,
    mapping: Mapping | None = None,
    schema=None,
    once: bool = False,
    trigger_seconds: float | None = None,
    max_files_per_trigger: int | None = None,
    kafka: dict | None = None,
):
    """Stream mode: publish the files arriving in the folder `path` (Structured Streaming
    file source, exactly once per file through the checkpoint; see docs/spark.md).
    Returns the started StreamingQuery."""
    from ordo.spark_jobs.records import encode_requests

    mapping = mapping or Mapping()
    if "://" not in path:
        os.makedirs(path, exist_ok=True)
    requests = to_requests(
        read_input(spark, path, fmt, mapping, stream=True, schema=schema, max_files_per_trigger=max_files_per_trigger),
        mapping,
    )
    writer = (
        encode_requests(requests, mapping.argument_types)
        .writeStream.format("kafka")
        .options(**sink_options(bootstrap, namespace, kafka))
        .option("checkpointLocation", checkpoint)
        .queryName(f"ordo-produce-{namespace}")
    )
    if once:
        writer = writer.trigger(availableNow=True)
    elif trigger_seconds:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer.start()


def streamed_rows(query) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


# ---------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser, kafka: bool = True) -> None:
    from ordo.config import WAIT_S
    from ordo.procedures.loading import procedure_options

    if kafka:
        p.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT", help="Kafka bootstrap servers")
        add_kafka_arguments(p)
    p.add_argument(
        "--input", required=True, metavar="PATH", help="a file or folder (with --stream: the folder to watch)"
    )
    p.add_argument("--format", choices=FORMATS, default="csv", help="input format (default csv; json = JSON lines)")
    p.add_argument("--stream", action="store_true", help="publish files as they arrive in the --input folder")
    p.add_argument("--master", default=None, metavar="M", help="Spark master (default local[*])")
    p.add_argument("--id-col", default="id", metavar="COL", help="request id column (default id)")
    p.add_argument("--proc-col", default="proc", metavar="COL", help="procedure column (default proc)")
    p.add_argument("--proc", default=None, metavar="NAME", help="one procedure for every row (no proc column)")
    p.add_argument(
        "--args-col", default="args", metavar="COL", help="arguments column: JSON text, struct or map (default args)"
    )
    p.add_argument(
        "--args-cols",
        default=None,
        metavar="A,B,…",
        help="build the arguments object from these columns ('*': all but id and proc)",
    )
    p.add_argument(
        "--schema", default=None, metavar="DDL", help="input schema, e.g. 'id string, proc string, args string'"
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark reader option, repeatable (e.g. sep=;)",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help="--stream: checkpoint folder (keep it to resume; default: a new temporary one)",
    )
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--once", action="store_true", help="--stream: publish the files there now, then exit")
    stop.add_argument("--timeout", type=float, default=None, metavar="S", help="--stream: stop after S seconds")
    p.add_argument("--trigger-seconds", type=float, default=None, metavar="S", help="--stream: micro-batch interval")
    p.add_argument(
        "--max-files-per-trigger", type=int, default=None, metavar="N", help="--stream: files per micro-batch"
    )
    p.add_argument(
        "--progress-seconds",
        type=float,
        default=5.0,
        metavar="S",
        help="print a progress line to stderr every S seconds (default 5; 0: none)",
    )
    p.add_argument(
        "--wait", action="store_true", help="then wait for the requests' outcomes and count them (not with --stream)"
    )
    p.add_argument(
        "--wait-timeout",
        type=WAIT_S,
        default=120.0,
        metavar="S",
        help="--wait: seconds to wait for the outcomes (default %(default)g)",
    )
    procedure_options(
        p.add_argument_group("argument types for --args-cols (as `ordo run` takes the procedures)"),
        all_by_default=False,
    )


def add_kafka_arguments(p: argparse.ArgumentParser) -> None:
    """Kafka options of both jobs."""
    p.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="librdkafka settings (docs/operations.md), translated for Spark's Kafka connector (docs/spark.md)",
    )
    p.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the connector's Java Kafka client, repeatable (wins over --kafka-config)",
    )
    p.add_argument(
        "--wait-for-broker",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for a broker that is still starting (ordo spark …; default: a "
        "broker must answer within 5 s)",
    )
    p.add_argument("--namespace", default="ordo", metavar="NS", help="topic prefix (default: ordo)")


def key_values(pairs: list[str], option: str) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} needs KEY=VALUE, not {pair!r}")
        options[key.strip()] = value
    return options


def mapping_from(args) -> Mapping:
    """The column mapping the command line names; with --app/--procedures/--workloads, the
    argument types of that procedure set, loaded as `ordo run` loads it."""
    from ordo.procedures.loading import procedure_specs
    from ordo.procedures.loading import load_registry

    options = key_values(args.option, "--option")
    args_cols = None
    if args.args_cols:
        args_cols = (
            ["*"] if args.args_cols.strip() == "*" else [c.strip() for c in args.args_cols.split(",") if c.strip()]
        )
    names_procedures = bool(args.app or args.procedures or args.workloads)
    if names_procedures and not args_cols:
        raise ValueError(
            "--app/--procedures/--workloads type the columns of --args-cols; the arguments of "
            "--args-col are JSON already (leave them out, or build the arguments with --args-cols)"
        )
    return Mapping(
        id_col=args.id_col,
        proc_col=None if args.proc else args.proc_col,
        proc=args.proc,
        args_col=None if args_cols else args.args_col,
        args_cols=args_cols,
        reader_options=options,
        argument_types=argument_types(load_registry(procedure_specs(args))) if names_procedures else None,
    )


def argument_types(registry) -> dict[str, dict[str, str]]:
    """{proc: {arg: type name}} of every procedure in `registry`: plain data for the executors,
    whose encoder casts each text argument to its type (records.cast_args) with no Ordo there."""
    return {
        name: {arg: argument_type(field) for arg, field in procedure.args.items()}
        for name, procedure in registry.procedures.items()
        if isinstance(procedure.args, dict)
    }


def argument_type(field) -> str:
    """A field's name among records.ARGUMENT_TYPES. An Optional field is cast as its field
    (an empty cell is left out, and the engine fills in the default); a field type of the
    user's own is "infer": the text's number or boolean, as Spark would have inferred it."""
    from ordo.procedures.args import Bool, Float, Int, List, Object, Optional, Str

    if isinstance(field, Optional):
        return argument_type(field.field)
    names = {Int: "int", Float: "float", Str: "str", Bool: "bool", Object: "object", List: "list"}
    return names.get(type(field), "infer")


def run(args, out=sys.stdout) -> int:
    """`ordo spark produce` and `spark-submit spark_jobs/producer_job.py`."""
    from ordo.spark_jobs.session import build_session

    from ordo.spark_jobs.progress import Progress, StreamCounter

    if args.wait and args.stream:
        raise ValueError("--wait counts the outcomes of a dataset published once, not of a --stream")
    mapping = mapping_from(args)
    kafka = key_values(getattr(args, "kafka_option", []), "--kafka-option")
    spark = build_session("ordo-produce", args.master)
    schema = args.schema
    if not args.stream:
        stats = produce(
            spark,
            args.bootstrap_servers,
            args.namespace,
            args.input,
            args.format,
            mapping,
            schema,
            kafka=kafka,
            progress=args.progress_seconds,
            collect_ids=args.wait,
        )
        print(
            f"published {stats.rows} requests to {args.namespace}.requests in {stats.seconds:.2f}s "
            f"({stats.rows_per_second:,.0f} rows/s)",
            file=out,
            flush=True,
        )
        if args.wait and stats.ids is not None:
            print(
                f"ordo-produce: waiting up to {args.wait_timeout:g} s for {len(stats.ids)} outcomes on "
                f"{args.namespace}.results",
                file=sys.stderr,
                flush=True,
            )
            found = wait_for_outcomes(args.bootstrap_servers, args.namespace, stats.ids, args.wait_timeout)
            for line in outcome_summary(stats.ids, found, stats.by_position, args.wait_timeout):
                print(line, file=out, flush=True)
        return 0
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="ordo-produce-checkpoint-")
    if not args.checkpoint:
        print(f"checkpoint in {checkpoint} (pass --checkpoint to resume after a restart)", file=sys.stderr)
    query = produce_stream(
        spark,
        args.bootstrap_servers,
        args.namespace,
        args.input,
        args.format,
        checkpoint,
        mapping,
        schema,
        once=args.once,
        trigger_seconds=args.trigger_seconds,
        max_files_per_trigger=args.max_files_per_trigger,
        kafka=kafka,
    )
    counter = StreamCounter()

    def describe() -> str:
        counter.update(query)
        return f"{counter.rows} requests published in {counter.batches} micro-batch(es)"

    started = time.monotonic()
    try:
        with Progress(spark, "ordo-produce", describe, args.progress_seconds):
            if args.once:
                query.awaitTermination()
            elif args.timeout is not None:
                query.awaitTermination(args.timeout)
            else:
                query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"stream stopped with an error: {query.exception()}")
    counter.update(query)
    rows = max(counter.rows, streamed_rows(query))
    seconds = time.monotonic() - started
    print(
        f"published {rows} requests to {args.namespace}.requests from {args.input} in {seconds:.2f}s",
        file=out,
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    from ordo.spark_jobs.session import job_main

    return job_main("producer_job.py", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
