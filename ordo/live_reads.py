"""Live reads for the client: the state as of one batch, asked on `<ns>.reads` and answered
by the partition workers on `<ns>.read-answers` (scheduler/reads.py has the protocol).

A read that spans partitions is done when every part names the same batch. Parts that
name an older batch than another are asked again with `at_least` the newest: a worker
behind that batch answers right after applying it, at exactly it. So a read is never torn
across partitions, and it never sees part of a batch (each part is one view of a shard).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ordo.broker.clients import (
    GATHER_FROM,
    PacedProducer,
    arrived,
    close_later,
    consumer_config,
    kafka_config,
    watermarks,
)
from ordo.broker.fetch_stall import ReadOn
from ordo.broker.reachability import UNANSWERED
from ordo.broker.topics import Topics
from ordo.errors import OrdoError, Timeout
from ordo.storage.keys import encode_key, key_problem, normal_key

DEFAULT_TIMEOUT = 10.0
# How many times the parts of one read are asked again to meet at one batch before it fails
# (under load a worker may apply the batch asked for before the question reaches it).
MEET_ATTEMPTS = 20
GATHERED_MOST = 128  # reads one record gathers at most
GROUP_KEPT_S = 5.0  # how long past its reads' timeouts a gathered record's answers are still taken
EXPIRE_EVERY = 0.05
ANSWER_MARGIN_S = 1.0  # how much sooner than the client the workers give up on a read, at most  # seconds between two looks for reads past their timeout
RECENT = "recent"
LINEARIZABLE = "linearizable"


class ReadFailed(OrdoError, RuntimeError):
    """The engine answered a read with an error (an unknown table, a key that does not encode,
    a scan too large), or the parts of a read could not meet at one batch."""


class ReadTimeout(Timeout):
    """A read's partitions did not all answer within its timeout."""

    def __init__(self, message: str, partitions: list[int]):
        super().__init__(message)
        self.partitions = partitions


@dataclass(frozen=True, slots=True)
class StateRead:
    """What a read found, all as of batch `batch` (its log time `time_ms`): `values`, key ->
    value, in the order asked (a scan: in key order). A key never written reads as its
    table's default. `more`: a scan stopped at its limit."""

    batch: int
    time_ms: int
    values: dict[Any, Any]
    more: bool = False

    @property
    def value(self) -> Any:
        """The value of a read of one key."""
        if len(self.values) != 1:
            raise ValueError(f"this read holds {len(self.values)} values, not one")
        return next(iter(self.values.values()))


@dataclass
class _Pending:
    body: dict[str, Any]
    future: Future
    deadline: float
    parts: list[int] | None = None  # the partitions that answer, as the first answer says
    answers: dict[int, dict] = field(default_factory=dict)  # partition -> its latest answer
    asked: set[int] | None = None  # the partitions asked again, None: all of them
    attempts: int = 0
    ids: list[str] = field(default_factory=list)


class StateReader:
    """One client's reads: a producer of questions and one reader of every answer, which
    hands each to the read it belongs to."""

    def __init__(self, bootstrap: str, topics: Topics, settings: dict[str, Any]):
        self.topics = topics
        self._bootstrap, self._settings = bootstrap, settings
        self._producer = PacedProducer(kafka_config(bootstrap, {"acks": 1, "socket.nagle.disable": True, **settings}))
        self._pending: dict[str, _Pending] = {}
        self._id_prefix, self._ids = f"read-{uuid.uuid4().hex[:16]}-", itertools.count(1)
        self._outbox: list[tuple[dict, _Pending]] = []  # reads to go out gathered in one record
        self._groups: dict[str, float] = {}  # keys of gathered records -> until when answers may come
        self._lock = threading.Lock()
        self._stop = threading.Event()
        consumer = self._new_consumer()
        where = TopicPartition(topics.read_answers, 0)
        try:
            _, end = watermarks(consumer, where, 10.0)
        except KafkaException as exc:
            consumer.close()
            raise OrdoError(f"cannot read {topics.read_answers}: {exc}") from None
        consumer.assign([TopicPartition(topics.read_answers, 0, end)])
        self._consumer = consumer
        self._read_on = ReadOn(self._new_consumer, {(topics.read_answers, 0): end})
        self._log_ends: Consumer | None = None
        self._thread = threading.Thread(target=self._run, name="ordo read answers", daemon=True)
        self._thread.start()

    def _new_consumer(self) -> Consumer:
        return Consumer(
            consumer_config(
                self._bootstrap,
                {
                    "group.id": f"ordo-reads-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "socket.nagle.disable": True,
                    **self._settings,
                },
            )
        )

    # -- asking ---------------------------------------------------------------------------

    def submit(
        self,
        table: str,
        keys: list | None = None,
        scan: dict | None = None,
        at_least: int | None = None,
        consistency: str = RECENT,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Future:
        """A read of `keys` (or a `scan`) of `table`; its future holds a StateRead."""
        body: dict[str, Any] = {"table": table, "timeout_ms": max(1, int(timeout * 1000))}
        if keys is not None:
            body["keys"] = [_wire_key(key) for key in keys]
        else:
            body["scan"] = scan
        if at_least:
            body["at_least"] = at_least
        if consistency == LINEARIZABLE:
            body["after_offset"] = self._log_end(timeout)
        elif consistency != RECENT:
            raise ValueError(f"consistency is {RECENT!r} or {LINEARIZABLE!r}, not {consistency!r}")
        future: Future = Future()
        pending = _Pending(body, future, time.monotonic() + timeout)
        self._ask(pending, None)
        return future

    def _ask(self, pending: _Pending, partitions: list[int] | None, at_least: int | None = None) -> None:
        read_id = f"{self._id_prefix}{next(self._ids)}"
        body = {"id": read_id, **pending.body}
        if partitions is not None:
            body["partitions"] = partitions
        if at_least is not None:
            body["at_least"] = at_least
        # The workers give up a little before this client does, so that a partition behind
        # says so (and which it is) before the client's own timeout would say less.
        left = pending.deadline - time.monotonic()
        body["timeout_ms"] = max(1, int((left - min(ANSWER_MARGIN_S, left / 4)) * 1000))
        pending.asked = set(partitions) if partitions is not None else None
        pending.ids.append(read_id)
        with self._lock:
            self._pending[read_id] = pending
            busy = len(self._pending) >= GATHER_FROM
            # Reads asked from the answers' own thread (a callback of an answered read) under
            # load go out together, once per turn of that thread (`_send_gathered`).
            if busy and threading.current_thread() is self._thread:
                self._outbox.append((body, pending))
                if len(self._outbox) < GATHERED_MOST:
                    return
        if len(self._outbox) >= GATHERED_MOST:
            self._send_gathered()
            return
        try:
            self._producer.produce(self.topics.reads, json.dumps(body).encode(), read_id.encode(), busy)
        except (BufferError, KafkaException) as exc:
            self._finish(pending, error=ReadFailed(f"the read could not be sent: {exc}"))
            return
        self._producer.poll()

    def _send_gathered(self) -> None:
        with self._lock:
            outbox, self._outbox = self._outbox, []
            if not outbox:
                return
            key = f"{self._id_prefix}g{next(self._ids)}"
            self._groups[key] = max(pending.deadline for _, pending in outbox) + GROUP_KEPT_S
        try:
            value = json.dumps({"reads": [body for body, _ in outbox]}).encode()
            self._producer.produce(self.topics.reads, value, key.encode(), True)
        except (BufferError, KafkaException) as exc:
            for _, pending in outbox:
                self._finish(pending, error=ReadFailed(f"the read could not be sent: {exc}"))
            return
        self._producer.poll()

    def _log_end(self, timeout: float) -> int:
        """Where the log ends now: a linearizable read waits for every batch below it."""
        if self._log_ends is None:
            self._log_ends = self._new_consumer()
        try:
            return watermarks(self._log_ends, TopicPartition(self.topics.log, 0), timeout)[1]
        except KafkaException as exc:
            raise ReadFailed(f"cannot ask where {self.topics.log} ends: {exc}") from None

    # -- answers --------------------------------------------------------------------------

    def _run(self) -> None:
        expired_at = 0.0
        while not self._stop.is_set():
            try:
                messages = arrived(self._consumer, 0.05, 1000)
            except KafkaException:
                messages = []
            if not messages:
                self._consumer = self._read_on.checked(self._consumer)
            else:
                self._read_on.read()
            for message in messages:
                error = message.error()
                if error is None:
                    self._take(message.key(), message.value())
                elif error.code() not in UNANSWERED and error.code() != KafkaError._PARTITION_EOF:
                    self._fail_all(ReadFailed(f"reading {self.topics.read_answers} failed: {error}"))
            if self._outbox:
                self._send_gathered()
            now = time.monotonic()
            if now >= expired_at + EXPIRE_EVERY:
                expired_at = now
                self._expire(now)
        self._consumer.close()

    def _take(self, key: bytes | None, value: bytes | None) -> None:
        read_id = key.decode(errors="replace") if key else ""
        if read_id in self._groups:
            try:
                answers = json.loads(value or b"").get("answers")
            except (ValueError, AttributeError):
                return
            for answer in answers if type(answers) is list else []:
                if type(answer) is dict and type(answer.get("id")) is str:
                    self._take_answer(answer["id"], answer)
            return
        with self._lock:
            pending = self._pending.get(read_id)
        if pending is None or pending.future.done():
            return
        try:
            answer = json.loads(value or b"")
        except ValueError:
            return
        self._take_answer(read_id, answer)

    def _take_answer(self, read_id: str, answer: Any) -> None:
        with self._lock:
            pending = self._pending.get(read_id)
        if pending is None or pending.future.done():
            return
        if type(answer) is not dict or answer.get("id") != read_id or read_id != pending.ids[-1]:
            return  # an answer to a question asked again since
        if "error" in answer:
            self._finish(pending, error=ReadFailed(str(answer["error"])))
            return
        partition = answer.get("partition")
        pending.parts = pending.parts or list(answer.get("parts", [partition]))
        pending.answers[partition] = answer
        if len(pending.answers) < len(pending.parts):
            return
        if pending.asked is not None and any(pending.answers[p]["id"] != read_id for p in pending.asked):
            return
        batches = {a["batch"] for a in pending.answers.values()}
        if len(batches) == 1:
            self._finish(pending, result=_result(pending))
            return
        pending.attempts += 1
        if pending.attempts > MEET_ATTEMPTS:
            self._finish(
                pending,
                error=ReadFailed(f"the partitions of the read did not meet at one batch in {MEET_ATTEMPTS} attempts"),
            )
            return
        newest = max(batches)
        behind = sorted(p for p, a in pending.answers.items() if a["batch"] < newest)
        self._ask(pending, behind, newest)

    def _finish(self, pending: _Pending, result: StateRead | None = None, error: BaseException | None = None) -> None:
        with self._lock:
            for read_id in pending.ids:
                self._pending.pop(read_id, None)
        if pending.future.done():
            return
        if error is not None:
            pending.future.set_exception(error)
        else:
            pending.future.set_result(result)

    def _expire(self, now: float) -> None:
        with self._lock:
            if self._groups:
                self._groups = {key: until for key, until in self._groups.items() if until > now}
            late = {id(p): p for p in self._pending.values() if p.deadline <= now}
        for pending in late.values():
            missing = [p for p in (pending.parts or []) if p not in pending.answers]
            asked = sorted(pending.asked) if pending.asked is not None else missing
            silent = asked or missing
            who = f"partition(s) {', '.join(map(str, silent))}" if silent else "the engine"
            self._finish(
                pending,
                error=ReadTimeout(
                    f"no answer from {who} of {self.topics.namespace} within the read's timeout: is the engine "
                    f"running and caught up (`ordo status`)?",
                    silent,
                ),
            )

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            pending = {id(p): p for p in self._pending.values()}
        for one in pending.values():
            self._finish(one, error=error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._fail_all(ReadFailed("the client was closed"))
        self._producer.flush(2)
        if self._log_ends is not None:
            close_later(self._log_ends)


def _wire_key(key: Any) -> Any:
    key = normal_key(key)
    problem = key_problem(key)
    if problem:
        raise ValueError(f"key {key!r}: {problem}")
    return list(key) if type(key) is tuple else key


def _result(pending: _Pending) -> StateRead:
    answers = list(pending.answers.values())
    batch, time_ms = answers[0]["batch"], answers[0].get("time_ms", 0)
    if "keys" in pending.body:
        found = {normal_key(key): value for answer in answers for key, value in answer["values"]}
        return StateRead(batch, time_ms, {normal_key(key): found[normal_key(key)] for key in pending.body["keys"]})
    table, limit = pending.body["table"], pending.body["scan"].get("limit") or 100
    rows = sorted(
        ((normal_key(key), value) for answer in answers for key, value in answer["rows"]),
        key=lambda row: encode_key(table, row[0]),
    )
    more = any(answer.get("more") for answer in answers) or len(rows) > limit
    return StateRead(batch, time_ms, dict(rows[:limit]), more)
