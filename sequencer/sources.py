"""Existing topics as sources: records of a topic the app does not own become requests of
one of its procedures (docs/procedures.md, "Existing topics as sources").

    app = ordo.App("shop", sources=[
        ordo.Source("orders", proc="place_order", args=lambda rec: {"sku": rec.json()["sku"], "qty": 1}),
    ])

The sequencer reads a source topic as it reads `<ns>.requests`: the positions it consumed
travel in each batch's offsets and in its snapshots (log/records.py), keyed by
`position_key`, so a restarted sequencer resumes where the log says, and a record becomes
one request for ever. Its default request id names where it stands (`record_id`), so no
replay can make it two.

A position is bound to the topic's identity (Kafka's topic id, which a topic deleted and
created again does not keep): each position travels with its incarnation, [n, topic id],
and the n-th incarnation of a partition the log reads names its records
`topic#n:partition:offset` (the first, `topic:partition:offset`). A sequencer that finds
another topic id than the log's reads the new topic from its beginning as incarnation
n + 1 (`SourceReading.bind`), and the log carries that decision: no replay asks Kafka. A record the mapping cannot turn into a request is a rejected
entry under that id, naming what was wrong, like a malformed request: never an exception.

The mapping runs once, in the sequencer, and the log keeps what it gave: replays never run
it again. A sequencer that dies before appending a batch maps its records again, so a
mapping must be a function of the record alone. It is part of the procedure set's identity
(procedures/fingerprint.py): an edited mapping needs `ordo upgrade`.
"""

from __future__ import annotations

import json

import logging

from ordo.procedures.sources import Source, SourceRecord
from ordo.sequencer.wire import POSITION_MARK, INCARNATION_MARK, parse_request_sets, source_id_problem

SEPARATOR = ":"  # in a position key and a record's id; Kafka topic names never hold it
NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # what a broker without topic ids answers

log = logging.getLogger("ordo.sequencer")


def record_id(topic: str, partition: int, offset: int, incarnation: int = 1) -> str:
    """The request id of the record at `offset` of `partition` of `topic`, unless the
    source's `id` gives another; of a later incarnation of the topic (deleted and created
    again, sequencer/sources.py), `topic#n:partition:offset`, which no earlier one's can be."""
    name = topic if incarnation == 1 else f"{topic}{INCARNATION_MARK}{incarnation}"
    return f"{name}{SEPARATOR}{partition}{SEPARATOR}{offset}"


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
    source: Source, message, registry, max_bytes: int, ordering: str | None = None, incarnation: int = 1
) -> tuple[list, tuple | None]:
    """The log entry of one source record, validated as a request on `<ns>.requests` is
    (`parse_request_sets`), with the read and write sets of an accepted one. Whatever the
    record holds and whatever the mapping does, an entry: a rejected one under the
    record's id names the problem."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    default_id = record_id(topic, partition, offset, incarnation)
    record = SourceRecord(topic, partition, offset, message.key(), message.value(), tuple(message.headers() or ()))
    where = f"source {topic}"
    try:
        request_id = default_id if source.id is None else source.id(record)
    except Exception as exc:  # the mapping is user code
        return [default_id, None, f"{where}: its id failed: {_failure(exc)}"], None
    problem = source_id_problem(request_id)
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
    entry, sets = parse_request_sets(
        body, None, partition, offset, registry, max_bytes, ordering, id_check=source_id_problem
    )
    if type(entry[0]) is str and entry[0].startswith(POSITION_MARK):
        entry[0] = request_id  # rejected before its id was read: answered under the record's id all the same
    return entry, sets


def check_sources(bootstrap: str, sources, namespace: str, timeout: float = 30.0) -> None:
    """Every source topic exists and is none of the namespace's own; else one line that says so."""
    from confluent_kafka.admin import AdminClient

    from ordo.broker.clients import kafka_config
    from ordo.broker.topics import SETTLE, Topics, described

    topics = Topics(namespace)
    own = {topics.requests, topics.log, topics.results, topics.changes, topics.reads, topics.read_answers}
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


def topic_ids(admin, names, timeout: float = 10.0) -> dict[str, str | None]:
    """Each topic's Kafka topic id, as text; None for a topic that does not exist now, or
    a broker that keeps no topic ids. KafkaException where the broker does not answer."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection

    if not names:
        return {}
    found: dict[str, str | None] = {}
    futures = admin.describe_topics(TopicCollection(list(names)), request_timeout=timeout)
    for name, future in futures.items():
        try:
            topic_id = str(future.result(timeout).topic_id)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                found[name] = None
                continue
            raise
        found[name] = None if topic_id in ("", NO_TOPIC_ID, "None") else topic_id
    return found


class SourceRecreated(RuntimeError):
    """A source topic was deleted and created again while the sequencer read it."""


class SourceReading:
    """What a sequencer (k of S) reads of the app's source topics: the partitions p with
    p % S == k of each, from where the log says it consumed them, of the incarnation of
    the topic the log names (`bind`)."""

    def __init__(self, bootstrap: str, topics, registry, index: int = 0, sequencers: int = 1):
        self.bootstrap = bootstrap
        self.topics = topics
        self.sources: dict[str, Source] = dict(registry.sources)
        self.registry = registry
        self.index, self.sequencers = index, sequencers
        self.owned: list[str] = []  # position keys of the partitions this sequencer reads
        self.ids: dict[str, str | None] = {}  # topic -> its topic id when last asked
        self.cursor = None  # the sequencer's cursor, once bound
        self._admin = None

    def admin(self):
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            from ordo.broker.clients import kafka_config

            self._admin = AdminClient(kafka_config(self.bootstrap))
        return self._admin

    def check(self, timeout: float = 30.0) -> None:
        """Each source topic exists; then which of its partitions this sequencer reads, and
        each topic's id."""
        from ordo.broker.topics import partition_count

        check_sources(self.bootstrap, self.sources.values(), self.topics.namespace, timeout)
        self.owned = [
            position_key(topic, p)
            for topic in sorted(self.sources)
            for p in range(partition_count(self.bootstrap, topic))
            if p % self.sequencers == self.index
        ]
        if self.sources:
            self.ids = topic_ids(self.admin(), sorted(self.sources), timeout)

    def bind(self, cursor, keys: list[str] | None = None) -> None:
        """Bind each partition read (or of `keys`) to the incarnation of its topic in Kafka
        now, in `cursor`, which every later batch and snapshot carries: where the log read
        the same topic id, it goes on; a position from before topic ids were kept adopts
        the current id; where the log read another topic id, the topic was deleted and
        created again, and its new incarnation is read from its beginning as incarnation
        n + 1 (its records' ids `topic#n+1:partition:offset`, which no earlier one's can be)."""
        self.cursor = cursor
        for key in self.owned if keys is None else keys:
            topic, partition = split_key(key)
            current = self.ids.get(topic)
            if current is None:
                continue  # a broker without topic ids: positions as before them
            bound = cursor.source_ids.get(key)
            if bound is None:
                cursor.source_ids[key] = [1, current]  # never read, or read before topic ids were kept
            elif bound[1] != current:
                consumed = cursor.source_offsets.pop(key, None)
                cursor.source_ids[key] = [bound[0] + 1, current]
                log.warning(
                    "source topic %s was deleted and created again since the log read partition %d of it%s "
                    "(topic id %s, now %s): its records not read before are gone with it; the new topic is "
                    "read from its beginning as a new one, its records' ids %s",
                    topic,
                    partition,
                    "" if consumed is None else f" up to offset {consumed}",
                    bound[1],
                    current,
                    record_id(topic, partition, 0, bound[0] + 1).rsplit(SEPARATOR, 1)[0] + ":OFFSET",
                )

    def incarnation(self, key: str) -> int:
        bound = self.cursor.source_ids.get(key) if self.cursor is not None else None
        return 1 if bound is None else bound[0]

    def recreated(self, topics, timeout: float) -> str | None:
        """A one-line reason to stop where one of `topics` (being read) now has another
        topic id than the one its partitions are bound to, else None (RuntimeError where
        the broker does not answer within `timeout`). A topic that does not
        exist now (deleted, not yet created again) is none: what was read of it was read
        before it went."""
        import time

        from confluent_kafka import KafkaException

        deadline = time.monotonic() + timeout
        while True:
            try:
                current = topic_ids(self.admin(), sorted(topics), 5.0)
                break
            except KafkaException as exc:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"the broker did not say the id of source topic(s) {', '.join(sorted(topics))} within "
                        f"{timeout:.0f} s ({exc}): is it running?"
                    ) from None
                time.sleep(0.2)
        bindings: list[tuple[str, list]] = sorted(self.cursor.source_ids.items()) if self.cursor is not None else []
        for key, (_, bound) in bindings:
            topic, _ = split_key(key)
            now = current.get(topic)
            if topic in current and now is not None and now != bound and key in self.owned:
                self.ids[topic] = now
                return self.recreation(topic, bound, now)
        return None

    @staticmethod
    def recreation(topic: str, bound: str, now: str) -> str:
        return (
            f"source topic {topic} was deleted and created again while this sequencer read it (topic id {bound}, "
            f"now {now}): it stops without appending what it read of it since its last batch; started again "
            f"(`ordo run` does so itself), it reads the new topic from its beginning as a new topic; see "
            f"docs/procedures.md, 'Existing topics as sources'"
        )

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
        reads: from now on they are among those it reads, bound to their topic's id."""
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
        if found and self.cursor is not None:
            try:
                self.ids.update(topic_ids(self.admin(), sorted({split_key(key)[0] for key in found}), 5.0))
            except KafkaException:
                return []  # asked again at the next look
            self.bind(self.cursor, found)
        self.owned += found
        return found

    def noted(self, cursor) -> list:
        """The positions to note for the lag (broker/lag.py): one never read at 0."""
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
        return source_entry(
            self.sources[message.topic()],
            message,
            self.registry,
            max_bytes,
            ordering,
            self.incarnation(self.position(message)),
        )

    def lost(self, topic: str, partition: int, position: int | None = None) -> str:
        """Why the consumer found `partition` of `topic` not holding `position` (where the
        log consumed up to): the topic made again (another topic id than the log's), its
        records deleted by retention (the partition now begins after the position), or
        lost by the broker (it ends before it)."""
        from confluent_kafka import KafkaException

        key = position_key(topic, partition)
        bound = self.cursor.source_ids.get(key) if self.cursor is not None else None
        try:
            now = topic_ids(self.admin(), [topic], 5.0).get(topic)
        except KafkaException:
            now = None
        if bound is not None and now is not None and now != bound[1]:
            return self.recreation(topic, bound[1], now)
        where = f"source topic {topic} partition {partition}"
        cause = "deleted by retention before they were read, or the broker lost them" + (
            "" if bound is not None else ", or the topic was made again before Ordo kept topic ids"
        )
        if position is not None:
            low: int | None
            high: int | None
            try:
                low, high = self.admin_consumer_watermarks(topic, partition)
            except Exception:
                low = high = None
            if low is not None and position < low:
                cause = f"it now begins at offset {low}: deleted by retention before they were read"
            elif high is not None and position > high:
                cause = f"it now ends at offset {high}: the broker lost them (restarted without its data?)" + (
                    "" if bound is not None else ", or the topic was made again before Ordo kept topic ids"
                )
        return (
            f"{where} no longer holds the records after offset {position if position is not None else '?'} that "
            f"the log consumed up to ({cause}): those records cannot become requests; see docs/procedures.md, "
            f"'Existing topics as sources'"
        )

    def admin_consumer_watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        from ordo.broker.clients import consumer_config

        consumer = Consumer(consumer_config(self.bootstrap, {"group.id": f"{self.topics.namespace}.watermarks"}))
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
        finally:
            consumer.close()
