"""Existing topics as sources: records of a topic the app does not own become requests of
one of its procedures (docs/procedures.md, "Existing topics as sources").

    app = ordo.App("shop", sources=[
        ordo.Source("orders", proc="place_order", args=lambda rec: {"sku": rec.json()["sku"], "qty": 1}),
    ])

The sequencer reads a source topic as it reads `<ns>.requests`: the positions it consumed
travel in each batch's offsets and in its snapshots (sequencer/log.py), keyed by
`position_key`, so a restarted sequencer resumes where the log says, and a record becomes
one request for ever. Its default request id names where it stands (`record_id`), so no
replay can make it two. A record the mapping cannot turn into a request is a rejected
entry under that id, naming what was wrong, like a malformed request: never an exception.

The mapping runs once, in the sequencer, and the log keeps what it gave: replays never run
it again. A sequencer that dies before appending a batch maps its records again, so a
mapping must be a function of the record alone. It is part of the procedure set's identity
(procedures/fingerprint.py): an edited mapping needs `ordo upgrade`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from ordo.sequencer.wire import POSITION_MARK, id_problem, parse_request_sets

SEPARATOR = ":"  # in a position key and a record's id; Kafka topic names never hold it


@dataclass(frozen=True)
class SourceRecord:
    """One record of a source topic, as the mapping sees it. `headers`: (name, value)
    pairs in the record's order."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    _parsed: list = field(default_factory=list, init=False, repr=False, compare=False)

    def json(self) -> Any:
        """The value parsed as JSON (once); ValueError naming what is wrong otherwise."""
        if not self._parsed:
            if self.value is None:
                raise ValueError("the record has no value")
            try:
                self._parsed.append(json.loads(self.value))
            except ValueError as exc:
                raise ValueError(f"the value is not JSON: {exc}") from None
        return self._parsed[0]

    def header(self, name: str) -> bytes | None:
        """The value of the last header called `name`, or None."""
        found = [value for key, value in self.headers if key == name]
        return found[-1] if found else None


@dataclass(frozen=True)
class Source:
    """Records of the Kafka topic `topic` become requests of procedure `proc`. `args`: a
    function of the `SourceRecord` giving the arguments (default: the value, a JSON
    object, as they are); `id`: a function giving the request id (default: the record's
    place, `topic:partition:offset`, so each record is one request for ever)."""

    topic: str
    proc: str
    args: Callable[[SourceRecord], dict] | None = None
    id: Callable[[SourceRecord], str] | None = None

    def __post_init__(self) -> None:
        from ordo.sequencer.topics import valid_topic

        if not isinstance(self.topic, str) or not valid_topic(self.topic):
            raise ValueError(f"Source: {self.topic!r} is no Kafka topic name (1-249 of A-Z a-z 0-9 . _ -)")
        if not isinstance(self.proc, str) or not self.proc:
            raise TypeError(f"Source('{self.topic}'): proc= names the procedure its records become requests of")
        for part in ("args", "id"):
            value = getattr(self, part)
            if value is not None and not callable(value):
                raise TypeError(f"Source('{self.topic}'): {part}= takes a function of the record, got {value!r}")


def record_id(topic: str, partition: int, offset: int) -> str:
    """The request id of the record at `offset` of `partition` of `topic`, unless the
    source's `id` gives another."""
    return f"{topic}{SEPARATOR}{partition}{SEPARATOR}{offset}"


def position_key(topic: str, partition: int) -> str:
    """How a batch's offsets and a cursor name a source partition (a request partition is
    named by its number)."""
    return f"{topic}{SEPARATOR}{partition}"


def split_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition(SEPARATOR)
    return topic, int(partition)


def _failure(exc: Exception) -> str:
    """What a mapping's exception says of the record: a KeyError is a field it lacks."""
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        return f"field {exc.args[0]!r} missing"
    if isinstance(exc, ValueError) and str(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def source_entry(
    source: Source, message, registry, max_bytes: int, ordering: str | None = None
) -> tuple[list, tuple | None]:
    """The log entry of one source record, validated as a request on `<ns>.requests` is
    (`parse_request_sets`), with the read and write sets of an accepted one. Whatever the
    record holds and whatever the mapping does, an entry: a rejected one under the
    record's id names the problem."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    default_id = record_id(topic, partition, offset)
    record = SourceRecord(topic, partition, offset, message.key(), message.value(), tuple(message.headers() or ()))
    where = f"source {topic}"
    try:
        request_id = default_id if source.id is None else source.id(record)
    except Exception as exc:  # the mapping is user code
        return [default_id, None, f"{where}: its id failed: {_failure(exc)}"], None
    problem = id_problem(request_id)
    if problem is not None:
        return [default_id, None, f"{where}: its id gives {request_id!r}: {problem}"], None
    try:
        args = record.json() if source.args is None else source.args(record)
    except Exception as exc:
        return [request_id, None, f"{where}: {_failure(exc)}"], None
    if type(args) is not dict:
        return [request_id, None, f"{where}: the arguments must be an object, got {type(args).__name__}"], None
    try:
        # The request as a client would write it: every check of the wire applies alike.
        body = json.dumps(
            {"id": request_id, "proc": source.proc, "args": args}, allow_nan=False, separators=(",", ":")
        ).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        return [request_id, None, f"{where}: the arguments are not JSON: {exc}"], None
    entry, sets = parse_request_sets(body, None, partition, offset, registry, max_bytes, ordering)
    if type(entry[0]) is str and entry[0].startswith(POSITION_MARK):
        entry[0] = request_id  # rejected before its id was read: answered under the record's id all the same
    return entry, sets


def check_sources(bootstrap: str, sources, namespace: str, timeout: float = 30.0) -> None:
    """Every source topic exists and is none of the namespace's own; else one line that says so."""
    from confluent_kafka.admin import AdminClient

    from ordo.sequencer.kafka import kafka_config
    from ordo.sequencer.topics import SETTLE, Topics, described

    topics = Topics(namespace)
    own = {topics.requests, topics.log, topics.results, topics.changes}
    for source in sources:
        if source.topic in own or source.topic.startswith(f"{namespace}.stream."):
            raise ValueError(
                f"source topic {source.topic} is one of namespace {namespace}'s own topics: a source "
                f"is a topic Ordo does not write"
            )
    if not sources:
        return
    names = [source.topic for source in sources]
    found = described(AdminClient(kafka_config(bootstrap)), names, settle=min(SETTLE, timeout))
    missing = [name for name in names if found[name] is None]
    if missing:
        raise RuntimeError(
            f"source topic(s) {', '.join(missing)} do not exist: create them (or correct the "
            f"app's sources) and start again"
        )


class SourceReading:
    """What a sequencer (k of S) reads of the app's source topics: the partitions p with
    p % S == k of each, from where the log says it consumed them."""

    def __init__(self, bootstrap: str, topics, registry, index: int = 0, sequencers: int = 1):
        self.bootstrap = bootstrap
        self.topics = topics
        self.sources: dict[str, Source] = dict(registry.sources)
        self.registry = registry
        self.index, self.sequencers = index, sequencers
        self.owned: list[str] = []  # position keys of the partitions this sequencer reads

    def check(self, timeout: float = 30.0) -> None:
        """Each source topic exists; then which of its partitions this sequencer reads."""
        from ordo.sequencer.topics import partition_count

        check_sources(self.bootstrap, self.sources.values(), self.topics.namespace, timeout)
        self.owned = [
            position_key(topic, p)
            for topic in sorted(self.sources)
            for p in range(partition_count(self.bootstrap, topic))
            if p % self.sequencers == self.index
        ]

    def assignment(self, cursor, keys: list[str] | None = None) -> list:
        """Where the consumer begins on each partition read (or of `keys`): after what the
        log holds, else at the beginning."""
        from confluent_kafka import OFFSET_BEGINNING

        return [
            self.topic_partition(key, OFFSET_BEGINNING if cursor.consumed_to(key) is None else cursor.consumed_to(key))
            for key in (self.owned if keys is None else keys)
        ]

    def added(self, consumer) -> list[str]:
        """Partitions added to a source topic since they were counted that this sequencer
        reads: from now on they are among those it reads."""
        from confluent_kafka import KafkaException

        found = []
        for topic in sorted(self.sources):
            try:
                metadata = consumer.list_topics(topic, timeout=1).topics.get(topic)
            except KafkaException:
                continue  # asked again at the next look; a broker away is the watch's business
            if metadata is None or metadata.error is not None:
                continue
            found += [
                key
                for p in sorted(metadata.partitions)
                if p % self.sequencers == self.index and (key := position_key(topic, p)) not in self.owned
            ]
        self.owned += found
        return found

    def noted(self, cursor) -> list:
        """The positions to note for the lag (sequencer/lag.py): one never read at 0."""
        return [self.topic_partition(key, cursor.consumed_to(key) or 0) for key in self.owned]

    @staticmethod
    def topic_partition(key: str, offset: int):
        from confluent_kafka import TopicPartition

        topic, partition = split_key(key)
        return TopicPartition(topic, partition, offset)

    @staticmethod
    def position(message) -> str:
        return position_key(message.topic(), message.partition())

    def entry(self, message, max_bytes: int, ordering: str | None) -> tuple[list, tuple | None]:
        return source_entry(self.sources[message.topic()], message, self.registry, max_bytes, ordering)

    @staticmethod
    def lost(topic: str, partition: int) -> str:
        return (
            f"source topic {topic} partition {partition} no longer holds the records after the position the "
            f"log consumed up to (deleted by retention before they were read, or the broker lost them): "
            f"those records cannot become requests; see docs/procedures.md, 'Existing topics as sources'"
        )
