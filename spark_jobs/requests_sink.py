"""`ordo_requests`: a Spark sink (batch and streaming) that publishes rows as Ordo
transaction requests on `<ns>.requests`.

    df.write.format("ordo_requests").mode("append")
      .option("bootstrap.servers", B).option("namespace", NS).save()

Input columns, by name: `id` (message key and request id), `proc`, `args`. `args` may be a
JSON text, a struct or a map. Every row becomes one message, also a bad one: a row without
`proc` is sent without `proc`, an `args` text that is not JSON is sent as a JSON string, a
null `args` is left out; the engine then rejects the request with a clear error on
`<ns>.results` (DESIGN.md invariant 2). The sink never judges requests: the engine does.

Delivery: an idempotent confluent-kafka producer per task, flushed at the end of the task;
a message the broker did not acknowledge fails the task (Spark retries it). A retried task
or a replayed micro-batch sends its rows again: the engine rejects the second copy of a
request id as a duplicate, so each request runs at most once (within the engine's dedupe
window) and the first outcome of an id is its outcome.

Options: `bootstrap.servers`, `namespace` (or `topic` for another topic), `flush.timeout.s`
(default 120), and `kafka.<setting>` for any librdkafka producer setting.
Depends on confluent-kafka and the standard library only (it runs on executors).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

REQUEST_COLUMNS = ("id", "proc", "args")


def _option(options, *names: str, default: Any = None) -> Any:
    """Spark hands options over case-insensitively (lower-cased keys)."""
    options = {str(k).lower(): v for k, v in dict(options).items()}
    for name in names:
        value = options.get(name.lower())
        if value not in (None, ""):
            return value
    return default


def requests_topic(options) -> str:
    topic = _option(options, "topic")
    if topic:
        return topic
    namespace = _option(options, "namespace")
    if not namespace:
        raise ValueError("ordo_requests needs the option 'namespace' (or 'topic')")
    return f"{namespace}.requests"


def producer_settings(options) -> dict[str, Any]:
    bootstrap = _option(options, "bootstrap.servers", "bootstrap_servers", "kafka.bootstrap.servers")
    if not bootstrap:
        raise ValueError("ordo_requests needs the option 'bootstrap.servers'")
    from sequencer.kafka import REQUEST_BATCHING
    from sequencer.kafka_settings import user_kafka_settings

    settings: dict[str, Any] = {
        "log.connection.close": False,
        **user_kafka_settings(),  # the user's settings for every Ordo client, under the sink's own
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        **REQUEST_BATCHING,
        "queue.buffering.max.messages": 500_000,
        "message.max.bytes": 1_000_000,
    }
    for name, value in dict(options).items():
        if name.startswith("kafka.") and name != "kafka.bootstrap.servers":
            settings[name[len("kafka."):]] = value
    return settings


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


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode


def request_message(request_id: Any, proc: Any, args: Any) -> tuple[bytes | None, bytes]:
    """(Kafka key, message body) of one row. Null fields are left out of the body, so the
    engine names what is missing."""
    body: dict[str, Any] = {}
    if request_id is not None:
        body["id"] = str(request_id)
    if proc is not None:
        body["proc"] = proc if isinstance(proc, str) else _plain(proc)
    if args is not None:
        body["args"] = args_value(args)
    key = str(request_id).encode() if request_id is not None and str(request_id) else None
    return key, _dumps(body).encode()


def _field(row, name: str) -> Any:
    try:
        return row[name]
    except (KeyError, ValueError, IndexError):
        return None


def publish(options, rows: Iterator) -> WriterCommitMessage:
    """Send every row, wait for every acknowledgement; raise if any is missing."""
    from confluent_kafka import Producer

    topic = requests_topic(options)
    timeout = float(_option(options, "flush.timeout.s", default=120))
    failures: list[str] = []

    def delivered(err, msg):
        if err is not None:
            failures.append(str(err))

    producer = Producer(producer_settings(options))
    count = 0
    for row in rows:
        key, value = request_message(_field(row, "id"), _field(row, "proc"), _field(row, "args"))
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(timeout)
    if remaining or failures:
        raise RuntimeError(f"ordo_requests: {remaining} of {count} requests not acknowledged by the broker "
                           f"within {timeout:.0f}s, {len(failures)} failed"
                           + (f" (first error: {failures[0]})" if failures else ""))
    message = WriterCommitMessage()
    message.count = count  # a plain attribute: the class stays pyspark's own
    return message


def _total(messages) -> int:
    return sum(getattr(m, "count", 0) for m in messages if m is not None)


class RequestsWriter(DataSourceWriter):
    def __init__(self, options):
        self.options = dict(options)
        requests_topic(self.options), producer_settings(self.options)  # fail early, on the driver

    def write(self, iterator):
        return publish(self.options, iterator)

    def commit(self, messages):
        self.published = _total(messages)

    def abort(self, messages):
        # Requests already sent cannot be taken back; a rerun's copies are rejected as duplicates.
        pass


class RequestsStreamWriter(DataSourceStreamWriter):
    def __init__(self, options):
        self.options = dict(options)
        requests_topic(self.options), producer_settings(self.options)

    def write(self, iterator):
        return publish(self.options, iterator)

    def commit(self, messages, batchId):
        pass

    def abort(self, messages, batchId):
        pass


class OrdoRequestsDataSource(DataSource):
    """Short name `ordo_requests`; write-only (batch and streaming)."""

    @classmethod
    def name(cls) -> str:
        return "ordo_requests"

    def schema(self):
        return "id string, proc string, args string"

    def writer(self, schema, overwrite):
        _check_schema(schema)
        return RequestsWriter(self.options)

    def streamWriter(self, schema, overwrite):
        _check_schema(schema)
        return RequestsStreamWriter(self.options)


def _check_schema(schema) -> None:
    names = set(schema.names)
    if "id" not in names:
        raise ValueError(f"ordo_requests needs an 'id' column (columns: {', '.join(schema.names)}); "
                         "map one with the producer job's --id-col")
    unknown = names - set(REQUEST_COLUMNS)
    if unknown:
        raise ValueError(f"ordo_requests takes the columns id, proc, args; unexpected: {', '.join(sorted(unknown))}")
