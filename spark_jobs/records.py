"""Ordo's record formats on Kafka, for the border jobs: requests encoded for `<ns>.requests`,
the engine's outputs (`<ns>.changes`, `<ns>.results`) decoded. Spark's Kafka connector moves
the bytes; these pure functions (Python's json, applied with mapInArrow) say what they mean,
byte for byte as the former hand-written sink and source did (docs/spark.md says why this is
not done with Spark SQL's JSON functions).

Requests: one message per row, key = the request id (None for a null or empty id), value =
the compact JSON object {"id", "proc", "args"} with null fields left out; an `args` text that
is JSON is embedded as its value, any other text as a JSON string, so the engine rejects a bad
row with a clear error on `<ns>.results` (DESIGN.md invariant 2). The job never judges
requests: the engine does. Given the argument types of an app's procedures (plain data,
`{proc: {arg: type name}}`, see ARGUMENT_TYPES), each text argument of a row is cast to its
argument's type (`cast_cell`); a text that does not cast goes as the text it is.

Outputs (rows, one per Kafka record):
  changes: batch BIGINT, time BIGINT (the batch's time in the log, ms; null in records of
           engines before it), txn INT, txns INT, partition INT, part INT, parts INT,
           changes ARRAY<STRUCT<txn INT, table STRING, key STRING, value STRING, deleted BOOLEAN>>,
           kafka_partition INT, kafka_offset BIGINT
           (a record is one transaction's: `txn` of the batch's `txns`; `partition` is null,
           but for a record of the format before, one per batch and engine partition, which
           has `partition` and a null `txn` and `txns`)
  results: id, status, batch, result (JSON text), error, kafka_partition, kafka_offset
`key`, `value` and `result` are canonical JSON texts (sorted keys, no spaces), so equal keys
are equal strings whatever their JSON type; `value` is null for a delete. A record that is not
Ordo's format fails the task (and the query), never a silent null.

Depends on pyarrow and the standard library only: it runs on executors, pickled by value
(spark_jobs/session.py), so they need no Ordo.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import re
from collections.abc import Iterator
from typing import Any

REQUEST_COLUMNS = ("id", "proc", "args")
CHANGES_SCHEMA = (
    "batch bigint, time bigint, txn int, txns int, partition int, part int, parts int, "
    "changes array<struct<txn: int, table: string, key: string, value: string, deleted: boolean>>, "
    "kafka_partition int, kafka_offset bigint"
)
RESULTS_SCHEMA = (
    "id string, status string, batch bigint, result string, error string, kafka_partition int, kafka_offset bigint"
)


# ---------------------------------------------------------------- requests


def _plain(value: Any) -> Any:
    """Spark values (Row, dict, list, Decimal, dates, bytes) as JSON-able Python values."""
    if hasattr(value, "asDict"):  # a struct
        return {k: _plain(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, dict):  # a map
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    return value


def args_value(args: Any) -> Any:
    """The `args` of a request: a JSON text is parsed; a text that is not JSON is kept as
    the string it is, which the engine rejects (`'args' must be an object, got string`)."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return _plain(args)


# The types a text argument is cast to, by the names the driver gives an app's argument
# fields (producer_job.argument_types): "infer" is a field type of the user's own, whose
# values are taken as Spark would have inferred them from the text.
ARGUMENT_TYPES = ("int", "float", "str", "bool", "object", "list", "infer")

# Python's int() and float() also take "1_000", "nan", "infinity" and inner spaces: JSON's
# number syntax (with a leading "+" allowed) is what a cell must spell.
_INTEGER = re.compile(r"[-+]?[0-9]+")
_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def _as_int(text: str) -> int:
    if not _INTEGER.fullmatch(text.strip()):
        raise ValueError(text)
    return int(text)  # beyond Python's 4300 digits a ValueError too; out of range: the engine says so


def _as_number(text: str) -> int | float:
    if _INTEGER.fullmatch(text.strip()):
        return int(text)  # the engine takes it as its float, or says it has no exact one
    if not _NUMBER.fullmatch(text.strip()):
        raise ValueError(text)
    value = float(text)
    if not math.isfinite(value):  # 1e999: JSON has no infinity
        raise ValueError(text)
    return value


def _as_bool(text: str) -> bool:
    spelled = text.strip().lower()
    if spelled not in ("true", "false"):
        raise ValueError(text)
    return spelled == "true"


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _as_json(kind: type):
    def cast(text: str):
        value = json.loads(text, parse_constant=_refuse_constant)
        if type(value) is not kind:
            raise ValueError(text)
        return value

    return cast


def _inferred(text: str) -> Any:
    """A number or a boolean where the text spells one, as Spark's schema inference reads it."""
    for cast in (_as_number, _as_bool):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


_CASTS = {
    "int": _as_int,
    "float": _as_number,
    "str": str,
    "bool": _as_bool,
    "object": _as_json(dict),
    "list": _as_json(list),
    "infer": _inferred,
}


def cast_cell(text: str, type_name: str) -> Any:
    """A cell's text as the JSON value an argument of `type_name` takes (ARGUMENT_TYPES),
    or the text itself where it spells no such value: the engine then rejects that row
    alone, naming the argument (`argument 'cart': expected integer, got string`)."""
    cast = _CASTS.get(type_name)
    if cast is None:
        return text
    try:
        return cast(text)
    except (ValueError, RecursionError):
        return text


def cast_args(proc: Any, args: Any, argument_types: dict[str, dict[str, str]]) -> Any:
    """A row's arguments with each text cast to the type its procedure gives it. Anything
    else goes as it is, for the engine to judge: a value that is not text (a Parquet
    column's number), an argument the procedure does not declare, a procedure the types do
    not name, arguments that are not an object."""
    types = argument_types.get(proc) if isinstance(proc, str) else None
    if types is None or not isinstance(args, dict):
        return args
    return {
        name: cast_cell(value, types[name]) if isinstance(value, str) and name in types else value
        for name, value in args.items()
    }


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode


def request_message(
    request_id: Any, proc: Any, args: Any, argument_types: dict[str, dict[str, str]] | None = None
) -> tuple[bytes | None, bytes]:
    """(Kafka key, message body) of one row. Null fields are left out of the body, so the
    engine names what is missing. With `argument_types`, text arguments are cast (cast_args)."""
    body: dict[str, Any] = {}
    if request_id is not None:
        body["id"] = str(request_id)
    if proc is not None:
        body["proc"] = proc if isinstance(proc, str) else _plain(proc)
    if args is not None:
        body["args"] = args_value(args)
        if argument_types is not None:
            body["args"] = cast_args(proc, body["args"], argument_types)
    key = str(request_id).encode() if request_id is not None and str(request_id) else None
    return key, _dumps(body).encode()


def _request_encoder(argument_types: dict[str, dict[str, str]] | None):
    """The mapInArrow function of encode_requests; it closes over plain data only, so it
    pickles with this module alone."""

    def encode_batches(batches: Iterator) -> Iterator:
        import pyarrow as pa

        schema = pa.schema([("key", pa.binary()), ("value", pa.binary())])
        for batch in batches:
            columns = batch.to_pydict()
            n = batch.num_rows
            ids, procs, args = (columns.get(name, [None] * n) for name in REQUEST_COLUMNS)
            keys, values = [], []
            for i in range(n):
                key, value = request_message(ids[i], procs[i], args[i], argument_types)
                keys.append(key)
                values.append(value)
            yield pa.RecordBatch.from_pydict({"key": keys, "value": values}, schema=schema)

    return encode_batches


def encode_requests(df, argument_types: dict[str, dict[str, str]] | None = None):
    """(id, proc, args) rows -> (key, value) rows for Spark's Kafka sink. `argument_types`:
    {proc: {arg: one of ARGUMENT_TYPES}}, to cast the text arguments of rows (cast_args)."""
    from pyspark.sql import functions as F

    names = set(df.columns)
    if "id" not in names:
        raise ValueError(
            f"requests need an 'id' column (columns: {', '.join(df.columns)}); map one with the producer job's --id-col"
        )
    unknown = names - set(REQUEST_COLUMNS)
    if unknown:
        raise ValueError(f"requests take the columns id, proc, args; unexpected: {', '.join(sorted(unknown))}")
    columns = [(F.col(c) if c in names else F.lit(None)).cast("string").alias(c) for c in REQUEST_COLUMNS]
    return df.select(*columns).mapInArrow(_request_encoder(argument_types), "key binary, value binary")


# ---------------------------------------------------------------- outputs


def canonical(value: Any) -> str | None:
    """A JSON value as canonical text: one spelling per value."""
    if value is None:
        return None
    if type(value) is int:  # most keys and values: json.dumps spells an int as str() does
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def decode_change_record(value: bytes, partition: int, offset: int) -> dict:
    record = json.loads(value)
    txn = record.get("txn")  # None: the format before, one record per batch and engine partition
    changes = [
        {
            "txn": c["txn"] if txn is None else txn,
            "table": c["table"],
            "key": canonical(c["key"]),
            "value": canonical(c.get("value")),
            "deleted": bool(c.get("deleted", False)),
        }
        for c in record["changes"]
    ]
    return {
        "batch": record["batch"],
        "time": record.get("time"),
        "txn": txn,
        "txns": record["txns"] if txn is not None else None,
        "partition": record["partition"] if txn is None else None,
        "part": record.get("part", 0),
        "parts": record.get("parts", 1),
        "changes": changes,
        "kafka_partition": partition,
        "kafka_offset": offset,
    }


def decode_result_record(value: bytes, partition: int, offset: int) -> dict:
    record = json.loads(value)
    return {
        "id": record["id"],
        "status": record["status"],
        "batch": record.get("batch"),
        "result": canonical(record.get("result")),
        "error": record.get("error"),
        "kafka_partition": partition,
        "kafka_offset": offset,
    }


def _arrow_schema(kind: str):
    import pyarrow as pa

    kafka = [("kafka_partition", pa.int32()), ("kafka_offset", pa.int64())]
    if kind == "changes":
        change = pa.struct(
            [
                ("txn", pa.int32()),
                ("table", pa.string()),
                ("key", pa.string()),
                ("value", pa.string()),
                ("deleted", pa.bool_()),
            ]
        )
        return pa.schema(
            [
                ("batch", pa.int64()),
                ("time", pa.int64()),
                ("txn", pa.int32()),
                ("txns", pa.int32()),
                ("partition", pa.int32()),
                ("part", pa.int32()),
                ("parts", pa.int32()),
                ("changes", pa.list_(change)),
                *kafka,
            ]
        )
    return pa.schema(
        [
            ("id", pa.string()),
            ("status", pa.string()),
            ("batch", pa.int64()),
            ("result", pa.string()),
            ("error", pa.string()),
            *kafka,
        ]
    )


_DECODERS = {"changes": (decode_change_record, CHANGES_SCHEMA), "results": (decode_result_record, RESULTS_SCHEMA)}


def _decoder(kind: str):
    decode = _DECODERS[kind][0]

    def decode_batches(batches: Iterator) -> Iterator:
        import pyarrow as pa

        schema = _arrow_schema(kind)
        for batch in batches:
            columns = batch.to_pydict()
            rows = [decode(v, p, o) for v, p, o in zip(columns["value"], columns["partition"], columns["offset"])]
            yield pa.RecordBatch.from_pylist(rows, schema=schema)

    return decode_batches


def decode_outputs(df, kind: str):
    """Rows of Spark's Kafka source (value, partition, offset) -> decoded `kind` rows
    ("changes" or "results")."""
    if kind not in _DECODERS:
        raise ValueError(f"an engine output is 'changes' or 'results', not {kind!r}")
    schema = _DECODERS[kind][1]
    return df.select("value", "partition", "offset").mapInArrow(_decoder(kind), schema)
