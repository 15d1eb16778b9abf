"""`ordo_changes`: a Spark source (streaming and batch) over the engine's outputs,
`<ns>.changes` (default) or `<ns>.results` (option `topic`).

    spark.readStream.format("ordo_changes")
      .option("bootstrap.servers", B).option("namespace", NS).load()

Rows (topic=changes), one per Kafka record, i.e. per part of the change data of an engine
batch and partition (scheduler/outputs.py: a batch's changes on a partition are split into
`parts` message-sized parts, numbered by `part`):
    batch BIGINT, partition INT, part INT, parts INT,
    changes ARRAY<STRUCT<txn INT, table STRING, key STRING, value STRING, deleted BOOLEAN>>,
    kafka_partition INT, kafka_offset BIGINT
`key` and `value` are canonical JSON texts (sorted keys, no spaces), so equal keys are equal
strings whatever their JSON type; `value` is null for a delete.
Rows (topic=results): id, status, batch, result (JSON text), error, kafka_partition, kafka_offset.
With option `raw=true`: key, value (UTF-8 texts), kafka_partition, kafka_offset.

Offsets
-------
The stream offset is the next Kafka offset to read, per Kafka partition, as JSON:
{"0": 1234, "1": 77}. A micro-batch [start, end) has one input partition per Kafka partition
with start < end (split into ranges of at most `splitOffsets` offsets), in partition order:
the same offsets always plan the same partitions and read the same records.

The end of a topic is never taken from a high watermark (the local broker misreports it,
docs/local-broker.md). `latestOffset(start)` *probes*: one consumer, kept open by the
reader between calls, reads from `start` (read_committed, explicit offsets with assign())
until no record arrived for `probeIdleMs` (default 300 ms) or the read limit is reached, and
returns, per partition, the offset of the last record it actually saw + 1. Every offset
below such an end is a record that exists and is committed, so an executor reading
[start, end) always finds it: it reads from `start` until it has seen the record at `end - 1`
(or any record at or past the end of its range), and fails the task if that takes longer
than `readTimeoutS`. Records that arrive later are simply in the next micro-batch. Offsets
lost to retention fail the read loudly (auto.offset.reset=error), never skip silently.
The initial offset (startingOffsets=earliest, the default) is each partition's log start;
`startingOffsets` may also be a JSON object like the offsets above. Partitions added to the
topic later are picked up from their log start.

Options: `bootstrap.servers`, `namespace`, `topic` (changes | results | a full topic name),
`raw`, `startingOffsets`, `maxRecordsPerBatch` (admission control: at most that many
records per micro-batch), `probeIdleMs`, `readTimeoutS`, `splitOffsets`, and
`kafka.<setting>` for any librdkafka consumer setting. Trigger.AvailableNow is supported:
the target is what the first probe finds.
Depends on confluent-kafka and the standard library only (it runs on executors).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

CHANGES_SCHEMA = ("batch bigint, partition int, part int, parts int, "
                  "changes array<struct<txn: int, table: string, key: string, value: string, deleted: boolean>>, "
                  "kafka_partition int, kafka_offset bigint")
RESULTS_SCHEMA = ("id string, status string, batch bigint, result string, error string, "
                  "kafka_partition int, kafka_offset bigint")
RAW_SCHEMA = "key string, value string, kafka_partition int, kafka_offset bigint"


def _option(options: dict, name: str, default: Any = None) -> Any:
    """Spark hands options over case-insensitively (lower-cased keys)."""
    value = options.get(name.lower())
    return default if value in (None, "") else value


def canonical(value: Any) -> str | None:
    """A JSON value as canonical text: one spelling per value."""
    if value is None:
        return None
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


class SourceConfig:
    """Everything a reader needs, picklable (it travels to executors)."""

    def __init__(self, options):
        options = {str(k).lower(): v for k, v in dict(options).items()}
        bootstrap = (_option(options, "bootstrap.servers") or _option(options, "bootstrap_servers")
                     or _option(options, "kafka.bootstrap.servers"))
        if not bootstrap:
            raise ValueError("ordo_changes needs the option 'bootstrap.servers'")
        self.bootstrap = bootstrap
        topic = _option(options, "topic", "changes")
        self.kind = "raw" if str(_option(options, "raw", "false")).lower() == "true" else topic
        if topic in ("changes", "results"):
            namespace = _option(options, "namespace")
            if not namespace:
                raise ValueError("ordo_changes needs the option 'namespace'")
            self.topic = f"{namespace}.{topic}"
        else:
            self.topic = topic
            self.kind = "raw" if self.kind == topic else self.kind
        self.starting = _option(options, "startingOffsets", "earliest")
        self.max_records = int(_option(options, "maxRecordsPerBatch", 0)) or None
        self.probe_idle = float(_option(options, "probeIdleMs", 300)) / 1000.0
        self.read_timeout = float(_option(options, "readTimeoutS", 120))
        self.split = max(1, int(_option(options, "splitOffsets", 1_000_000)))
        self.extra = {k[len("kafka."):]: v for k, v in options.items()
                      if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}

    @property
    def schema(self) -> str:
        return {"changes": CHANGES_SCHEMA, "results": RESULTS_SCHEMA}.get(self.kind, RAW_SCHEMA)

    def consumer(self, **settings):
        from confluent_kafka import Consumer

        from sequencer.kafka_settings import user_kafka_settings

        return Consumer({
            "log.connection.close": False,
            **user_kafka_settings(),  # the user's settings for every Ordo client, under the source's own
            "bootstrap.servers": self.bootstrap,
            "group.id": f"ordo-spark-{uuid.uuid4().hex}",  # never committed: offsets live in Spark
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 20,
            **settings,
            **self.extra,
        })


# ---------------------------------------------------------------- offsets and the probe

def _partitions(config: SourceConfig, consumer) -> list[int]:
    metadata = consumer.list_topics(config.topic, timeout=30).topics.get(config.topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise RuntimeError(f"ordo_changes: topic {config.topic} does not exist "
                           f"({metadata.error if metadata is not None else 'no metadata'})")
    return sorted(metadata.partitions)


def _log_start(config: SourceConfig, consumer, partition: int) -> int:
    """The first offset of a partition (its low watermark: the log start, which no broker
    quirk affects; high watermarks are never used)."""
    from confluent_kafka import TopicPartition

    low, _ = consumer.get_watermark_offsets(TopicPartition(config.topic, partition), timeout=30, cached=False)
    return max(low, 0)


def to_offsets(offsets: dict) -> dict[int, int]:
    return {int(p): int(o) for p, o in offsets.items()}


def from_offsets(offsets: dict[int, int]) -> dict[str, int]:
    return {str(p): offsets[p] for p in sorted(offsets)}


class Probe:
    """Finds how far a topic goes by reading it (see the module docstring)."""

    def __init__(self, config: SourceConfig):
        self.config = config
        self._consumer = None
        self._position: dict[int, int] | None = None  # where the assigned consumer stands

    @property
    def consumer(self):
        if self._consumer is None:
            self._consumer = self.config.consumer(**{"queued.max.messages.kbytes": 65536})
        return self._consumer

    def partitions(self) -> list[int]:
        return _partitions(self.config, self.consumer)

    def log_start(self, partition: int) -> int:
        return _log_start(self.config, self.consumer, partition)

    def with_new_partitions(self, offsets: dict[int, int]) -> dict[int, int]:
        offsets = dict(offsets)
        for partition in self.partitions():
            if partition not in offsets:
                offsets[partition] = self.log_start(partition)
        return offsets

    def end(self, start: dict[int, int], max_records: int | None = None,
            target: dict[int, int] | None = None) -> dict[int, int]:
        """Per partition: the offset after the last record seen reading from `start`, reading
        at most `max_records` records and nothing at or past `target`."""
        from confluent_kafka import KafkaError, TopicPartition

        end = dict(start)
        open_partitions = [p for p in sorted(start) if target is None or start[p] < target.get(p, start[p])]
        if not open_partitions:
            return end
        consumer = self.consumer
        if self._position is None or any(self._position.get(p) != start[p] for p in open_partitions) \
                or set(self._position) != set(open_partitions):
            consumer.assign([TopicPartition(self.config.topic, p, start[p]) for p in open_partitions])
            self._position = {p: start[p] for p in open_partitions}
        seen = 0
        exact = True  # the consumer's position equals `end` for every assigned partition
        idle = self.config.probe_idle
        quiet_until = time.monotonic() + idle
        while True:
            if max_records is not None and seen >= max_records:
                break
            if target is not None and all(end[p] >= target[p] for p in open_partitions):
                break
            want = 10_000 if max_records is None else min(10_000, max_records - seen)
            messages = consumer.consume(want, timeout=min(0.05, max(0.0, quiet_until - time.monotonic())))
            got = False
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    self._position = None
                    raise RuntimeError(f"ordo_changes: reading {self.config.topic} failed: {error}")
                p, o = message.partition(), message.offset()
                if o < end[p]:
                    continue
                if target is not None and o >= target[p]:
                    exact = False  # read past the target: the next probe must seek
                    continue
                end[p] = o + 1
                seen += 1
                got = True
            now = time.monotonic()
            if got:
                quiet_until = now + idle
            elif now >= quiet_until:
                break
        self._position = {p: end[p] for p in open_partitions} if exact else None
        return end

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None
                self._position = None


def initial_offsets(config: SourceConfig, probe: Probe) -> dict[int, int]:
    starting = config.starting
    if starting == "earliest":
        return probe.with_new_partitions({})
    if starting == "latest":
        return probe.end(probe.with_new_partitions({}))
    try:
        offsets = to_offsets(json.loads(starting))
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"startingOffsets must be earliest, latest or a JSON object like "
                         f'{{"0": 42}}, not {starting!r}') from None
    return probe.with_new_partitions(offsets)


# ---------------------------------------------------------------- planning and reading

def plan(config: SourceConfig, start: dict[int, int], end: dict[int, int]) -> list[InputPartition]:
    """Deterministic input partitions of [start, end): per Kafka partition in order, ranges
    of at most `split` offsets."""
    planned = []
    for partition in sorted(end):
        lo, hi = start.get(partition, 0), end[partition]
        while lo < hi:
            upper = min(hi, lo + config.split)
            planned.append(InputPartition({"partition": partition, "start": lo, "end": upper, "last": hi}))
            lo = upper
    return planned


def read_range(config: SourceConfig, partition: int, start: int, end: int, last: int) -> Iterator[tuple]:
    """The records of offsets [start, end) of one partition, as rows. `last` is the end of
    the whole planned range: a record exists at `last - 1`, so the read always ends."""
    from confluent_kafka import KafkaError, TopicPartition

    if start >= end:
        return
    consumer = config.consumer()
    decode = _DECODERS[config.kind]
    try:
        consumer.assign([TopicPartition(config.topic, partition, start)])
        deadline = time.monotonic() + config.read_timeout
        done = False
        while not done:
            if time.monotonic() > deadline:
                raise RuntimeError(f"ordo_changes: could not read offsets [{start}, {end}) of "
                                   f"{config.topic}[{partition}] within {config.read_timeout:.0f}s")
            for message in consumer.consume(10_000, timeout=0.2):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"ordo_changes: reading {config.topic}[{partition}] failed: {error}")
                offset = message.offset()
                if offset < start:
                    continue
                if offset >= end:
                    done = True
                    break
                yield decode(message, partition, offset)
                if offset >= end - 1:
                    done = True
                    break
    finally:
        consumer.close()


def _decode_changes(message, partition: int, offset: int) -> tuple:
    record = json.loads(message.value())
    changes = [(c["txn"], c["table"], canonical(c["key"]), canonical(c.get("value")), bool(c.get("deleted", False)))
               for c in record["changes"]]
    return (record["batch"], record["partition"], record.get("part", 0), record.get("parts", 1), changes,
            partition, offset)


def _decode_results(message, partition: int, offset: int) -> tuple:
    record = json.loads(message.value())
    return (record["id"], record["status"], record.get("batch"), canonical(record.get("result")),
            record.get("error"), partition, offset)


def _decode_raw(message, partition: int, offset: int) -> tuple:
    key, value = message.key(), message.value()
    return (key.decode("utf-8", "replace") if key is not None else None,
            value.decode("utf-8", "replace") if value is not None else None, partition, offset)


_DECODERS = {"changes": _decode_changes, "results": _decode_results, "raw": _decode_raw}


# ---------------------------------------------------------------- Spark interfaces

class ChangesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, config: SourceConfig):
        self.config = config
        self._probe = Probe(config)
        self._target: dict[int, int] | None = None
        self._available_now = False

    def initialOffset(self) -> dict:
        return from_offsets(initial_offsets(self.config, self._probe))

    def getDefaultReadLimit(self):
        if self.config.max_records:
            return ReadMaxRows(self.config.max_records)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        self._target = None

    def latestOffset(self, start: dict, limit=None) -> dict:
        start_offsets = self._probe.with_new_partitions(to_offsets(start))
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self._available_now:
            if self._target is None:
                # What is there now is the target; later records wait for the next run.
                self._target = self._probe.end(start_offsets)
                for partition, offset in start_offsets.items():
                    self._target.setdefault(partition, offset)
            target = {p: self._target.get(p, o) for p, o in start_offsets.items()}
            return from_offsets(self._probe.end(start_offsets, max_records, target))
        return from_offsets(self._probe.end(start_offsets, max_records))

    def partitions(self, start: dict, end: dict):
        return plan(self.config, to_offsets(start), to_offsets(end))

    def read(self, partition):
        value = partition.value
        return read_range(self.config, value["partition"], value["start"], value["end"], value["last"])

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint; nothing is committed to Kafka

    def stop(self) -> None:
        self._probe.close()


class ChangesBatchReader(DataSourceReader):
    """`spark.read.format("ordo_changes")`: everything the topic holds now (same probe)."""

    def __init__(self, config: SourceConfig):
        self.config = config

    def partitions(self):
        probe = Probe(self.config)
        try:
            start_offsets = initial_offsets(self.config, probe)
            end = probe.end(start_offsets, self.config.max_records)
        finally:
            probe.close()
        return plan(self.config, start_offsets, end) or [InputPartition({"partition": 0, "start": 0, "end": 0,
                                                                         "last": 0})]

    def read(self, partition):
        value = partition.value
        return read_range(self.config, value["partition"], value["start"], value["end"], value["last"])


class OrdoChangesDataSource(DataSource):
    """Short name `ordo_changes`; read-only (streaming and batch)."""

    @classmethod
    def name(cls) -> str:
        return "ordo_changes"

    def schema(self):
        return SourceConfig(self.options).schema

    def streamReader(self, schema):
        return ChangesStreamReader(SourceConfig(self.options))

    def reader(self, schema):
        return ChangesBatchReader(SourceConfig(self.options))
