"""The client API: submit requests to a namespace and collect their outcomes.

    client = ordo.Client("127.0.0.1:9092", "bank")
    request_id = client.submit("deposit", {"account": 1, "amount": 5})
    outcome = client.wait_one(request_id, timeout=30)

Outcomes are read from every partition of `<ns>.results`, starting where the topic ended
just before this client first produced: a client sees the answers to its own requests,
not older outcomes of the same ids. docs/client.md has the whole contract.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, TypeVar, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from ordo.reading import (
    BEGINNING,
    Change,
    Outcome,
    Position,
    StreamTuple,
    WholeBatches,
    outcome_of,
    read_topic,
    tuple_of,
)
from ordo.scheduler.stream_outputs import stream_topic
from ordo.live_reads import DEFAULT_TIMEOUT, LINEARIZABLE, RECENT, StateRead, StateReader
from ordo.errors import BrokerUnavailable, NotSent, OrdoError, OutcomeTimeout, Timeout, TopicMissing
from ordo.broker.clients import REQUEST_BATCHING, arrived, consumer_config, kafka_config, watermarks
from ordo.broker.fetch_stall import ReadOn
from ordo.log.probe import ABSENT_GRACE
from ordo.broker.reachability import UNANSWERED
from ordo.broker.topics import Topics
from ordo.sequencer.wire import fields_problem, id_problem

# Outcome readers a client keeps between reads: enough for a few threads that read at once.
IDLE_READERS = 2
PARTITIONS_KEPT_FOR = 10.0  # seconds a kept reader trusts the partitions of <ns>.results last listed
# How long `check_namespace` waits for <ns>.requests where a namespace of a close name is on the
# broker: an engine just started makes its topics within seconds (3.5-5 s on a loaded 2-core
# machine), a mistyped namespace never.
MISTYPED_WAIT = 8.0

_Item = TypeVar("_Item")

Request = dict[str, Any] | bytes | tuple[str, bytes]


def new_request(proc: str, args: dict[str, Any], request_id: str | None = None) -> dict[str, Any]:
    """The request object `{"id", "proc", "args"}`, with a fresh `req-…` id unless given."""
    return {"id": request_id or f"req-{uuid.uuid4().hex}", "proc": proc, "args": args}


def fatal_error_of(exc: BaseException) -> KafkaError | None:
    """The fatal librdkafka error `exc` is, or was raised from; None if none."""
    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, KafkaException) and current.args and isinstance(current.args[0], KafkaError):
            if current.args[0].fatal():
                return current.args[0]
        current = current.__cause__ or current.__context__
    return None


@dataclass
class Submission:
    """What `submit_many` sent. `ids[i]` is the id the outcome of the i-th request will carry:
    its own id, or `@partition:offset` for a message without a usable id (the engine names
    such an outcome by its position); None where the broker did not take the request, with
    the reason in `failed`."""

    ids: list[str | None] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    by_position: list[int] = field(default_factory=list)  # requests without a usable id

    @property
    def sent(self) -> list[str]:
        """The ids of the requests the broker took, in order."""
        return [i for i in self.ids if i is not None]

    def duplicates(self) -> dict[str, int]:
        """Ids sent more than once: each copy gets an outcome of its own (a copy the
        sequencer still remembers is rejected as a duplicate)."""
        return {i: n for i, n in Counter(self.sent).items() if n > 1}


class Client:
    """Sends requests to the namespace `namespace` on the Kafka cluster at `bootstrap` and
    reads their outcomes (docs/client.md). A context manager: `with Client(...) as client`
    closes it at the end."""

    def __init__(self, bootstrap: str, namespace: str, settings: dict[str, Any] | None = None):
        """`settings`: librdkafka settings for this client's producer and consumers
        (security, timeouts), beside the bootstrap servers."""
        self.bootstrap = bootstrap
        self.topics = Topics(namespace)
        self.settings = dict(settings or {})
        self._producer: Producer | None = None
        self._fatal: KafkaError | None = None  # what ended the producer, when the broker refused it for good
        self._start: dict[int, int] | None = None  # results partition -> offset before our first request
        # Outcome readers between reads: a new consumer costs about 55 ms (its connection and
        # metadata) before its first fetch, which a call that waits for one outcome would pay each time.
        self._idle_readers: list[Consumer] = []
        self._readers_lock = threading.Lock()
        # <ns>.results' partitions as last listed, and when: a kept reader asks for them again
        # only after PARTITIONS_KEPT_FOR, as its metadata request waits behind its last fetch.
        self._listed: tuple[float, list[int]] | None = None
        self._namespace_checked = False  # asked once whether it looks mistyped
        self._state_reads: StateReader | None = None  # made on the first read of the state

    # -- submitting --------------------------------------------------------------------------

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                kafka_config(
                    self.bootstrap,
                    {
                        "enable.idempotence": True,
                        **REQUEST_BATCHING,  # a flush (every submit ends with one) sends at once
                        "queue.buffering.max.messages": 1_000_000,
                        # A request waits in the client for a broker that is away, however long,
                        # rather than expiring unsent after librdkafka's five minutes.
                        "message.timeout.ms": 0,
                        # A fatal error (a principal the cluster refuses an idempotent producer)
                        # fails the requests in the client, each with its reason, rather than
                        # raising out of the next poll.
                        "error_cb": self._on_error,
                        **self.settings,
                    },
                )
            )
        return self._producer

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._fatal = error

    def _flush(self, producer: Producer, timeout: float | None) -> int:
        """Wait until the broker has every request produced (or `timeout`): the number it
        has not; 0 once a fatal error ended the producer."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
            remaining = producer.flush(step)
            if self._fatal is not None:
                return 0
            if not remaining or (deadline is not None and time.monotonic() >= deadline):
                return remaining

    def _give_up_producer(
        self, producer: Producer, fatal: KafkaError, submission: "Submission", settled: set[int]
    ) -> None:
        """After a fatal error (the cluster refuses this client's producer for good, e.g. a
        principal without IdempotentWrite) nothing more can be sent by it: every request the
        broker has not acknowledged fails with that error's reason, and the next submit makes
        a new producer. `settled`: the requests acknowledged, or failed for reasons of their own."""
        try:
            producer.purge()
            producer.flush(5)  # the purged requests' reports
        except (KafkaException, SystemError):
            pass
        for index in range(len(submission.ids)):
            if index not in settled:
                submission.failed[index] = fatal.str()
                submission.ids[index] = None
        self._producer, self._fatal = None, None

    def submit(
        self,
        proc: str | Iterable[Request],
        args: dict[str, Any] | None = None,
        *,
        request_id: str | None = None,
        timeout: float | None = 60.0,
    ) -> str | list[str]:
        """`submit("deposit", {...})` (or `submit(proc="deposit", args={...})`): one request,
        returns its id. `submit([...])`: many, as `submit_many`, returns their ids and raises
        if the broker refused any."""
        if isinstance(proc, str):
            submission = self.submit_many([new_request(proc, args or {}, request_id)], timeout)
            if submission.failed:
                raise NotSent(f"request not sent: {submission.failed[0]}")
            (sent,) = submission.ids
            assert sent is not None  # new_request always names its request
            return sent
        submission = self.submit_many(proc, timeout)
        if submission.failed:
            first = min(submission.failed)
            raise NotSent(
                f"{len(submission.failed)} requests were not acknowledged by the broker "
                f"(request {first}: {submission.failed[first]})"
            )
        return submission.sent

    def submit_many(self, requests: Iterable[Request], timeout: float | None = 60.0) -> Submission:
        """Produce requests, in order, and wait until the broker has them. A request is a
        dict (`new_request`), a raw message body sent as it is (keyed by its 'id' when it
        has a usable one: the engine, not the client, judges each request), or a
        (key, raw body) pair. Raises BrokerUnavailable if no broker answers within
        `timeout`, NotSent if the broker has not acknowledged every request by then; the
        requests stay queued in this client and go when the broker answers. `timeout=None`
        waits for a broker that is away as long as it takes."""
        self._mark_start(timeout)
        producer = self._ensure_producer()
        if not self._namespace_checked:
            self._warn_of_a_mistyped_namespace(producer)
        submission = Submission()
        keyless: dict[int, None] = {}

        unknown_topic = False
        acknowledged: set[int] = set()
        echoes: set[int] = set()  # failed only because a fatal error ended the producer

        def delivered(index: int, error, message) -> None:
            nonlocal unknown_topic
            if error is not None:
                code = error.code()
                unknown_topic |= code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
                if code in (KafkaError._FATAL, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
                    echoes.add(index)
                submission.failed[index] = str(error)
                submission.ids[index] = None
                return
            acknowledged.add(index)
            if index in keyless:
                submission.ids[index] = f"@{message.partition()}:{message.offset()}"
                submission.by_position.append(index)

        remaining = 0
        try:
            for index, request in enumerate(requests):
                key, value, outcome_id = _key_and_value(request)
                submission.ids.append(outcome_id)
                if not outcome_id:
                    keyless[index] = None
                report = lambda error, message, index=index: delivered(index, error, message)  # noqa: E731
                while self._fatal is None:
                    try:
                        producer.produce(
                            self.topics.requests, key=key.encode() if key else None, value=value, on_delivery=report
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
                    except KafkaException as exc:  # e.g. larger than the client's message.max.bytes
                        if exc.args and exc.args[0].fatal():
                            raise
                        submission.failed[index] = str(exc.args[0].str() if exc.args else exc)
                        submission.ids[index] = None
                        break
                producer.poll(0)
            remaining = self._flush(producer, timeout)
        except (KafkaException, SystemError) as exc:
            # librdkafka's fatal error, raised out of a poll (a report callback meanwhile
            # sees it pending, hence SystemError with it as the cause): handled below.
            self._fatal = self._fatal or fatal_error_of(exc)
            if self._fatal is None:
                raise
        if self._fatal is not None:
            self._give_up_producer(producer, self._fatal, submission, acknowledged | (set(submission.failed) - echoes))
        if remaining:
            raise NotSent(
                f"{remaining} requests were not acknowledged by the broker at {self.bootstrap} within "
                f"{timeout:.0f} s; they stay queued in this client and are sent when the broker answers"
            )
        if unknown_topic:
            raise self._missing(self.topics.requests)
        return submission

    def wait_for_topics(self, timeout: float = 60.0) -> None:
        """Wait until the namespace's requests and results topics exist (an engine started
        just before creates them). Raises BrokerUnavailable if no broker answered in
        `timeout` seconds, Timeout if one did but the topics were still missing, and
        TopicMissing (did you mean …) instead where the broker has a namespace of a close name:
        a mistyped one, warned of at once (an engine may still be starting, so the wait is the
        one asked for)."""
        consumer = self._consumer()
        started = time.monotonic()
        deadline = started + timeout
        failure: KafkaException | None = None
        answered = warned = False
        try:
            while True:
                try:  # a broker that is still starting is waited for like a topic that is still missing
                    wait = max(0.1, min(5.0, deadline - time.monotonic()))
                    topics = consumer.list_topics(timeout=wait).topics
                    answered = True
                except KafkaException as exc:
                    topics, failure = {}, exc
                if self.topics.requests in topics and self.topics.results in topics:
                    return
                close = close_namespace(self.topics.namespace, topics) if answered else ""
                if close and not warned:
                    warned = True
                    logging.getLogger("ordo.client").warning(
                        "namespace %r has no topic %s yet%s: waiting up to %.0f s for it",
                        self.topics.namespace,
                        self.topics.requests,
                        close,
                        timeout,
                    )
                if time.monotonic() >= deadline:
                    if close:
                        raise self._missing(self.topics.requests, topics)
                    if not answered and failure is not None:
                        raise self._unavailable(failure, timeout)
                    raise Timeout(
                        f"topics {self.topics.requests} and {self.topics.results} do not exist after "
                        f"{timeout:.0f} s: is an engine (`ordo run`) running on this namespace?"
                    )
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        finally:
            consumer.close()

    # -- outcomes ----------------------------------------------------------------------------

    def _mark_start(self, timeout: float | None = 10.0) -> None:
        if self._start is None:
            self._start = _until_the_broker_answers(self._end_offsets, timeout)

    def _unavailable(self, exc: KafkaException, timeout: float) -> BrokerUnavailable:
        error = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        return BrokerUnavailable(
            f"no Kafka broker answers at {self.bootstrap} within {timeout:.0f} s ({error}): "
            f"is it running, and are these its address and settings?"
        )

    def _warn_of_a_mistyped_namespace(self, producer: Producer) -> None:
        """Where <ns>.requests is not on the broker and a namespace of a close name is, say so
        at once: the produce waits for the topic (an engine may be making it), and its
        TopicMissing names the close one too."""
        try:
            listed = producer.list_topics(timeout=10).topics
        except KafkaException:
            return  # the produce below meets the same broker, and says what is wrong
        self._namespace_checked = True
        close = "" if self.topics.requests in listed else close_namespace(self.topics.namespace, listed)
        if close:
            logging.getLogger("ordo.client").warning(
                "namespace %r has no topic %s yet%s: requests wait for it", self.topics.namespace,
                self.topics.requests, close,
            )  # fmt: skip

    def check_namespace(self, wait: float = MISTYPED_WAIT) -> None:
        """TopicMissing (did you mean …) where <ns>.requests is not on the broker within `wait`
        seconds and a namespace of a close name is: a mistyped one, answered long before a
        producer's 30 s wait for the topic would. With no close namespace, nothing is said
        (an engine may be making the topics)."""
        consumer = self._consumer()
        deadline = time.monotonic() + wait
        try:
            while True:
                try:
                    listed = consumer.list_topics(timeout=max(0.1, min(5.0, deadline - time.monotonic()))).topics
                except KafkaException:
                    return  # submitting meets the same broker, and says what is wrong
                if self.topics.requests in listed or not close_namespace(self.topics.namespace, listed):
                    return
                if time.monotonic() >= deadline:
                    raise self._missing(self.topics.requests, listed)
                time.sleep(0.2)
        finally:
            consumer.close()

    def _missing(self, topic: str, listed: Iterable[str] | None = None) -> TopicMissing:
        """The namespace's `topic` is not on the broker: name the namespaces that are, the
        closest first, so a typo shows at once. `listed`: the broker's topics, if just read."""
        from ordo.procedures.registry import did_you_mean

        if listed is None:
            consumer = self._consumer()
            try:
                listed = consumer.list_topics(timeout=10).topics
            except KafkaException:
                listed = {}
            finally:
                consumer.close()
        suffix = "." + topic.rsplit(".", 1)[1]
        namespaces = namespaces_with(listed, suffix)
        there = (
            f"namespaces on the broker: {', '.join(namespaces)}" if namespaces else "the broker has no namespace yet"
        )
        return TopicMissing(
            f"namespace {self.topics.namespace!r} has no topic {topic} on {self.bootstrap}"
            f"{did_you_mean(self.topics.namespace, namespaces)}; {there}. Has `ordo run` created "
            f"its topics?"
        )

    def _partitions(self, consumer: Consumer, timeout: float = 10.0) -> list[int]:
        topic = self.topics.results
        try:
            metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            raise self._unavailable(exc, timeout) from None
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return []
        return sorted(metadata.partitions)

    def _end_offsets(self, timeout: float = 10.0) -> dict[int, int]:
        """Where each partition of <ns>.results ends now (an absent topic: nothing yet, so
        from its beginning)."""
        topic = self.topics.results
        consumer = self._consumer()
        timeout = min(timeout, 10.0)
        try:
            try:
                ends = {
                    p: max(0, watermarks(consumer, TopicPartition(topic, p), timeout)[1])
                    for p in self._partitions(consumer, timeout)
                }
            except KafkaException as exc:
                raise self._unavailable(exc, timeout) from None
            if not ends:
                return ends
            # A broker may report less than its true end (the local broker does, after a
            # multi-record produce): read on from there until nothing more comes.
            consumer.assign([TopicPartition(topic, p, offset) for p, offset in ends.items()])
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                messages = consumer.consume(10_000, 0.25)
                if not messages:
                    break
                for message in messages:
                    partition, offset = message.partition(), message.offset()
                    if message.error() is None and partition is not None and offset is not None:
                        ends[partition] = max(ends[partition], offset + 1)
            return ends
        finally:
            consumer.close()

    def _consumer(self) -> Consumer:
        return Consumer(
            consumer_config(
                self.bootstrap,
                {
                    "group.id": f"ordo-client-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    **self.settings,
                },
            )
        )

    def _reader(self, from_beginning: bool, timeout: float | None = 10.0) -> tuple[Consumer, dict]:
        """An outcome reader, and the offsets it was assigned."""
        warn_if_unauthenticated(kafka_config(self.bootstrap, self.settings), self.topics.results)
        return _until_the_broker_answers(lambda bounded: self._bounded_reader(from_beginning, bounded), timeout)

    def _bounded_reader(self, from_beginning: bool, timeout: float) -> tuple[Consumer, dict]:
        with self._readers_lock:
            kept = self._idle_readers.pop() if self._idle_readers else None
        consumer = kept or self._consumer()
        try:
            start = {} if from_beginning else (self._start if self._start is not None else self._end_offsets(timeout))
            listed = self._listed
            if kept and listed and time.monotonic() - listed[0] <= PARTITIONS_KEPT_FOR:
                partitions = listed[1]
            else:
                partitions = self._partitions(consumer, min(timeout, 10.0))
                self._listed = (time.monotonic(), partitions) if partitions else None
        except BaseException:
            consumer.close()
            raise
        if not partitions:
            consumer.close()
            raise self._missing(self.topics.results)
        starts = {(self.topics.results, p): start.get(p, OFFSET_BEGINNING) for p in partitions}
        consumer.assign([TopicPartition(topic, p, offset) for (topic, p), offset in starts.items()])
        return consumer, starts

    def _release(self, consumer: Consumer) -> None:
        """Keep an outcome reader for the next read (a few at most: one per thread reading at once)."""
        consumer.unassign()
        with self._readers_lock:
            if len(self._idle_readers) < IDLE_READERS:
                self._idle_readers.append(consumer)
                return
        consumer.close()

    def stream(self, from_beginning: bool = False, idle: float | None = None) -> Iterator[dict]:
        """Every outcome as it arrives, from every partition of <ns>.results: from where the
        topic ended before this client's first request (or now, for a client that sent
        none), or from the beginning. Stops after `idle` seconds without one (None: never).
        A record that is not an outcome object is yielded as {"unreadable": raw bytes}."""
        consumer, starts = self._reader(from_beginning, None if idle is None else max(0.5, min(10.0, idle)))
        # A reader kept through a broker restart may fetch nothing more (broker/fetch_stall.py).
        read_on = ReadOn(self._consumer, starts)
        last = time.monotonic()
        try:
            while idle is None or time.monotonic() - last < idle:
                messages = arrived(consumer, 0.1)
                if not messages:
                    consumer = read_on.checked(consumer)
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF or error.code() in UNANSWERED:
                            continue  # a broker away: the consumer reads on when it is back
                        raise OrdoError(f"reading {self.topics.results} failed: {error}")
                    last = time.monotonic()
                    read_on.read()
                    yield _outcome(message.value())
        finally:
            self._release(consumer)

    def collect(
        self,
        ids: Iterable[str],
        timeout: float | None = 60.0,
        from_beginning: bool = False,
        on_outcome: Callable[[dict], None] | None = None,
    ) -> dict[str, list[dict]]:
        """Wait for the outcomes of `ids`, one per time an id is listed (a request sent twice
        gets two outcomes); returns what arrived before the timeout, by id, in arrival order.
        `timeout=None` waits until every one has come, through any broker outage."""
        wanted = Counter(ids)
        found: dict[str, list[dict]] = {}
        pending = sum(wanted.values())
        if not pending:
            return found
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        idle = None if timeout is None else max(0.0, deadline - time.monotonic())
        for outcome in self.stream(from_beginning, idle=idle):
            request_id = outcome.get("id")
            if isinstance(request_id, str) and len(found.get(request_id, ())) < wanted.get(request_id, 0):
                found.setdefault(request_id, []).append(outcome)
                pending -= 1
                if on_outcome is not None:
                    on_outcome(outcome)
            if not pending or time.monotonic() >= deadline:
                break
        return found

    def wait(
        self, ids: Iterable[str], timeout: float | None = 60.0, on_outcome=None, from_beginning: bool = False
    ) -> dict[str, dict]:
        """The first outcome of each id since this client's first request; ids without one
        by the timeout are absent."""
        found = self.collect(list(dict.fromkeys(ids)), timeout, from_beginning, on_outcome)
        return {request_id: outcomes[0] for request_id, outcomes in found.items()}

    def wait_one(self, request_id: str, timeout: float | None = 60.0) -> dict:
        """The first outcome of `request_id`; OutcomeTimeout if none came within `timeout`
        (None: wait as long as it takes, through any broker outage)."""
        found = self.wait([request_id], timeout)
        if request_id not in found:
            raise OutcomeTimeout(f"no outcome for {request_id!r} within {timeout:.0f} s")
        return found[request_id]

    def outcomes(self, ids: Iterable[str], timeout: float = 60.0, on_outcome=None) -> dict[str, dict]:
        """`wait`; a client that has sent nothing reads <ns>.results from its beginning."""
        return self.wait(ids, timeout, on_outcome, from_beginning=self._start is None)

    # -- reading what the engine writes ---------------------------------------------------

    def read_outcomes(self, start: Position = BEGINNING, idle: float | None = None) -> Iterator[Outcome]:
        """Every outcome on <ns>.results from `start` ("beginning", "end": from now on, or a
        batch number: that batch and later ones), as `Outcome` records, until `idle` seconds
        pass without one (None: never). TopicMissing if the namespace has no such topic."""
        return read_topic(
            self.bootstrap,
            self.settings,
            self.topics.results,
            start,
            idle,
            lambda message: [outcome_of(message.value())],
            _batch,
            self._missing,
        )

    def read_stream(self, name: str, start: Position = BEGINNING, idle: float | None = None) -> Iterator[StreamTuple]:
        """The tuples of output stream `name` (<ns>.stream.<name>) in log order from `start`,
        as `StreamTuple` records; see `read_outcomes`. The engine makes the topic with the
        stream's first tuple: until then, TopicMissing."""
        topic = stream_topic(self.topics.namespace, name)
        return read_topic(
            self.bootstrap,
            self.settings,
            topic,
            start,
            idle,
            lambda message: [tuple_of(name, message.key(), message.value())],
            _batch,
            self._missing,
        )

    def read_changes(
        self, table: str | None = None, start: Position = BEGINNING, idle: float | None = None
    ) -> Iterator[Change]:
        """Every committed write on <ns>.changes from `start` (of `table` only, if given), as
        `Change` records, a batch's once all of it is in, in transaction order (within one,
        key order); see `read_outcomes`."""
        whole = WholeBatches()

        def decode(message) -> list[Change]:
            found = whole.add(message.value())
            return found if table is None else [change for change in found if change.table == table]

        return read_topic(
            self.bootstrap, self.settings, self.topics.changes, start, idle, decode, _batch, self._missing
        )

    # -- reading the state (docs/client.md, "Reading the state") ---------------------------

    def state_reader(self) -> StateReader:
        """The reader of this client's reads of the state, made on first use."""
        with self._readers_lock:
            if self._state_reads is None:
                self._state_reads = StateReader(self.bootstrap, self.topics, self.settings)
            return self._state_reads

    def get(
        self,
        table: str,
        key: Any,
        *,
        at_least: int | None = None,
        consistency: str = RECENT,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> StateRead:
        """The value of `key` in `table` as of one applied batch (`.value`, `.batch`): at
        least batch `at_least` (an outcome's `batch`: this client's own write is seen), or
        `consistency="linearizable"`: every batch the log held when asked."""
        return self.get_many(table, [key], at_least=at_least, consistency=consistency, timeout=timeout)

    def get_many(
        self,
        table: str,
        keys: Iterable[Any],
        *,
        at_least: int | None = None,
        consistency: str = RECENT,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> StateRead:
        """`get` for several keys, on any partitions, all as of one batch."""
        future = self.state_reader().submit(
            table, keys=list(keys), at_least=at_least, consistency=consistency, timeout=timeout
        )
        return future.result(timeout + 5)

    def scan(
        self,
        table: str,
        prefix: Iterable[Any] | None = None,
        *,
        after: Any = None,
        limit: int = 100,
        at_least: int | None = None,
        consistency: str = RECENT,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> StateRead:
        """Up to `limit` records of `table` in key order, all as of one batch: those whose
        composite keys start with `prefix` (else every record), past the key `after`
        (`.more` says whether others follow: go on with `after` the last key)."""
        scan = {"prefix": None if prefix is None else list(prefix), "after": after, "limit": limit}
        future = self.state_reader().submit(
            table, scan=scan, at_least=at_least, consistency=consistency, timeout=timeout
        )
        return future.result(timeout + 5)

    def close(self) -> None:
        """Wait (up to 10 s) until the broker has every request sent, and let go of the producer
        and of the outcome readers."""
        if self._state_reads is not None:
            self._state_reads.close()
            self._state_reads = None
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
        with self._readers_lock:
            idle, self._idle_readers = self._idle_readers, []
        for consumer in idle:
            consumer.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    """`Client` for asyncio code: the same calls, awaited (each runs on a worker thread)."""

    def __init__(self, bootstrap: str, namespace: str, settings: dict[str, Any] | None = None):
        self.client = Client(bootstrap, namespace, settings)

    async def submit(self, proc, args: dict[str, Any] | None = None, *, request_id: str | None = None):
        """`Client.submit`."""
        return await asyncio.to_thread(self.client.submit, proc, args, request_id=request_id)

    async def submit_many(self, requests: Iterable[Request]) -> Submission:
        """`Client.submit_many`."""
        return await asyncio.to_thread(self.client.submit_many, list(requests))

    async def wait(self, ids: Iterable[str], timeout: float = 60.0) -> dict[str, dict]:
        """`Client.wait`."""
        return await asyncio.to_thread(self.client.wait, list(ids), timeout)

    async def wait_one(self, request_id: str, timeout: float = 60.0) -> dict:
        """`Client.wait_one`."""
        return await asyncio.to_thread(self.client.wait_one, request_id, timeout)

    async def stream(self, from_beginning: bool = False, idle: float | None = None) -> AsyncIterator[dict]:
        """`Client.stream`, as an async iterator: `async for outcome in client.stream(idle=5)`."""
        async for outcome in _async_iterate(lambda: self.client.stream(from_beginning, idle)):
            yield outcome

    def read_outcomes(self, start: Position = BEGINNING, idle: float | None = None) -> AsyncIterator[Outcome]:
        """`Client.read_outcomes`, as an async iterator."""
        return _async_iterate(lambda: self.client.read_outcomes(start, idle))

    def read_stream(
        self, name: str, start: Position = BEGINNING, idle: float | None = None
    ) -> AsyncIterator[StreamTuple]:
        """`Client.read_stream`, as an async iterator."""
        return _async_iterate(lambda: self.client.read_stream(name, start, idle))

    def read_changes(
        self, table: str | None = None, start: Position = BEGINNING, idle: float | None = None
    ) -> AsyncIterator[Change]:
        """`Client.read_changes`, as an async iterator."""
        return _async_iterate(lambda: self.client.read_changes(table, start, idle))

    async def get(self, table: str, key: Any, **options) -> StateRead:
        """`Client.get`."""
        return await self.get_many(table, [key], **options)

    async def get_many(self, table: str, keys: Iterable[Any], **options) -> StateRead:
        """`Client.get_many`: reads in flight at once share one reader of the answers."""
        reader = await asyncio.to_thread(self.client.state_reader)
        future = await _submitted(reader, table, keys=list(keys), **options)
        return await asyncio.wrap_future(future)

    async def scan(
        self, table: str, prefix: Iterable[Any] | None = None, *, after: Any = None, limit: int = 100, **options
    ) -> StateRead:
        """`Client.scan`."""
        reader = await asyncio.to_thread(self.client.state_reader)
        scan = {"prefix": None if prefix is None else list(prefix), "after": after, "limit": limit}
        future = await _submitted(reader, table, scan=scan, **options)
        return await asyncio.wrap_future(future)

    async def close(self) -> None:
        """`Client.close`."""
        await asyncio.to_thread(self.client.close)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


async def _submitted(reader: StateReader, table: str, **options) -> Future:
    """A read sent: at once, unless it first asks the broker where the log ends."""
    if options.get("consistency") == LINEARIZABLE:
        return await asyncio.to_thread(reader.submit, table, **options)
    return reader.submit(table, **options)


async def _async_iterate(make: Callable[[], Iterator[_Item]]) -> AsyncIterator[_Item]:
    """A blocking iterator (a generator), each step on a worker thread; closed when the loop ends."""
    items = await asyncio.to_thread(make)
    done = object()
    try:
        while True:
            item = await asyncio.to_thread(next, items, done)
            if item is done:
                return
            yield cast(_Item, item)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            await asyncio.to_thread(close)


def _batch(record) -> int | None:
    return record.batch


_warned_unauthenticated = False
# Settings by which a TLS client shows a certificate of its own (its principal for ACLs).
_CLIENT_CERTIFICATE = ("ssl.certificate.location", "ssl.certificate.pem", "ssl.keystore.location")


def on_loopback(bootstrap: str) -> bool:
    """Whether every bootstrap server is this machine's loopback (127.0.0.0/8, ::1,
    localhost): a broker only this machine's processes reach, such as the one `ordo
    broker`, `ordo demo` and the tests start."""
    import ipaddress

    hosts = []
    for server in str(bootstrap).split(","):
        server = server.strip()
        server = server.split("://", 1)[-1]  # PLAINTEXT://host:port
        if server.startswith("["):  # [::1]:9092
            host = server[1:].split("]", 1)[0]
        elif server.count(":") > 1:  # ::1 without a port
            host = server
        else:
            host = server.rsplit(":", 1)[0] if ":" in server else server
        hosts.append(host.lower())
    if not hosts or "" in hosts:
        return False
    for host in hosts:
        if host == "localhost" or host.endswith(".localhost"):
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return True


def warn_if_unauthenticated(settings: dict[str, Any], topic: str) -> None:
    """Once per process: outcomes read where clients do not authenticate can come from
    any client, since only the broker's ACLs keep others from writing the results topic.
    Never for a broker on the loopback (`on_loopback`): only this machine reaches it."""
    global _warned_unauthenticated
    protocol = str(settings.get("security.protocol", "plaintext")).lower()
    anonymous = protocol == "plaintext" or (protocol == "ssl" and not any(settings.get(k) for k in _CLIENT_CERTIFICATE))
    if _warned_unauthenticated or not anonymous or on_loopback(settings.get("bootstrap.servers", "")):
        return
    _warned_unauthenticated = True
    logging.getLogger("ordo.client").warning(
        "reading outcomes from %s over %s, where clients do not authenticate: unless the broker's ACLs "
        "let only the engine write %s, any client can forge an outcome there (docs/operations.md, 'What an "
        "outcome proves')",
        topic,
        protocol.upper(),
        topic,
    )


def _key_and_value(request: Request) -> tuple[str, bytes, str]:
    """(message key, message body, the id its outcome will carry: "" where the message's
    position will name it)."""
    if isinstance(request, dict):
        request_id = _request_id(request)
        return request_id, json.dumps(request, separators=(",", ":")).encode(), request_id
    if isinstance(request, tuple):
        key, value = request
        return key, value, _raw_id(value)
    request_id = _raw_id(request)
    return request_id, request, request_id


def _request_id(body: Any) -> str:
    """The id the engine will name the outcome by (sequencer/wire.py): "" for a body that
    is not a request, whose outcome its position names."""
    if not isinstance(body, dict) or id_problem(body.get("id")) or fields_problem(body):
        return ""
    return body["id"]


def _raw_id(body: bytes) -> str:
    try:
        return _request_id(json.loads(body))
    except Exception:
        return ""


def _outcome(raw: bytes | None) -> dict:
    if raw is None:
        return {"unreadable": raw}
    try:
        outcome = json.loads(raw)
    except (TypeError, ValueError, RecursionError):  # anyone can write to <ns>.results: never crash on it
        return {"unreadable": raw}
    return outcome if isinstance(outcome, dict) else {"unreadable": raw}


def namespaces_with(topics: Iterable[str], suffix: str) -> list[str]:
    """The namespaces that have a topic ending in `suffix` (".requests"), sorted."""
    return sorted(name[: -len(suffix)] for name in topics if name.endswith(suffix))


def close_namespace(namespace: str, topics: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" where `namespace` has no requests topic among `topics` and a
    namespace of a close name has one, else "": a mistyped namespace, seen at once."""
    from ordo.procedures.registry import did_you_mean

    namespaces = namespaces_with(topics, ".requests")
    return "" if namespace in namespaces else did_you_mean(namespace, namespaces)


def _until_the_broker_answers(call: Callable[[float], Any], timeout: float | None) -> Any:
    """`call(timeout)`; with `timeout=None`, called again, a bounded wait at a time, for as
    long as no broker answers, and for as long as a broker back from an outage says the
    namespace's topics are missing, up to ABSENT_GRACE: a durable broker answers "no such
    topic" until it has loaded its logs."""
    if timeout is not None:
        return call(timeout)
    last_away = None  # when the broker last did not answer
    while True:
        try:
            return call(10.0)
        except BrokerUnavailable:
            last_away = time.monotonic()
        except TopicMissing:
            if last_away is None or time.monotonic() - last_away > ABSENT_GRACE:
                raise
        time.sleep(1.0)
