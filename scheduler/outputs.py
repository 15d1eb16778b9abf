"""The engine's outputs, as they appear on Kafka.

<ns>.results, key = request id, one record per request, with its position in the log
(batch, index in the batch) and how often it was re-sequenced (procedures/ollp.py):
    {"id": "r-42", "status": "committed", "batch": 17, "txn": 3, "restarts": 0,
     "result": null, "error": null}
A dependent transaction re-sequenced at its turn has no record there: its executor appends
its next step to <ns>.requests instead, as part of the batch's outputs.
<ns>.changes, key = "<batch>.<txn>.<part>", the change data of one transaction: its writes
in key order, split into parts that each fit in one Kafka message, with the batch's time in
the log (ms since the epoch, the time `ctx.now` reads):
    {"batch": 17, "time": 1764241080123, "txn": 3, "txns": 50, "part": 0, "parts": 1, "changes": [
        {"table": "account", "key": 4, "value": null, "deleted": true},   # delete
        {"table": "account", "key": 9, "value": 120}]}                    # put
Every transaction of a batch has at least one part (possibly with no changes), and `txns`
is the batch's size, so a consumer can tell that it has seen all of a batch. A record is
published by the partition that reports the transaction's outcome (it knows all of its
writes), so its key and content are the same at every partition count: a rebuild at
another layout publishes the same records under the same keys. The keys' dots keep them
apart from those of the format before, "<batch>:<partition>:<part>".

<ns>.stream.<name>, key = "<batch>:<txn>:<seq>": each tuple a dataflow emitted to an output
stream (scheduler/stream_outputs.py).
All are pure functions of the log, so a replay re-emits them byte for byte: a consumer
that keeps the last record per key sees duplicates only, never different data.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Iterable, Protocol

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from ordo.procedures.ollp import RESTARTED
from ordo.log.steps import restart_request
from ordo.procedures.streams import split_result
from ordo.scheduler.batch import Outcome
from ordo.scheduler.stalled_outputs import CLOCK_MARGIN_MS, StallWatch, TailsUnread, written_since
from ordo.scheduler.stream_outputs import StreamTopics, stream_records
from ordo.broker.clients import kafka_config
from ordo.broker.client_settings import user_kafka_settings
from ordo.broker.topics import Topics
from ordo.storage.keys import encode_key

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

# Below the 1 MiB a Kafka broker accepts by default, with room for the record's framing.
MAX_MESSAGE_BYTES = 900_000

# How long outputs may gather in the producer while the worker has other batches to run.
# A worker that waits for acknowledgements (caught up with the log, or its pipeline full)
# sends at once instead (KafkaOutputs.wait), so the linger costs latency only to a worker
# that is busy anyway. Under load the broker then takes a few large produce requests
# instead of one every 5 ms per worker: about 40 % less of its CPU per transaction at two
# partitions (measured).
OUTPUT_LINGER_MS = 50


def outcome_record(outcome: Outcome, batch_id: int) -> bytes:
    if outcome.result is None and outcome.error is None:  # the common case, formatted directly
        return (
            f'{{"id":{_dumps(outcome.id)},"status":"{outcome.status}","batch":{batch_id},'
            f'"txn":{outcome.index},"restarts":{outcome.restarts},"result":null,"error":null}}'
        ).encode()
    return _dumps(_collected(outcome, batch_id)).encode()


def outcome_message(outcome: Outcome, batch_id: int, topics: Topics) -> tuple[str, bytes, bytes]:
    """(topic, key, value): an outcome, or the next step of a re-sequenced transaction."""
    if outcome.status == RESTARTED:
        return topics.requests, outcome.id.encode(), restart_request(outcome.id, outcome.result)
    return topics.results, outcome.id.encode(), outcome_record(outcome, batch_id)


def change_key(batch_id: int, txn: int, part: int) -> bytes:
    return f"{batch_id}.{txn}.{part}".encode()


def change_records(
    batch_id: int,
    txns: int,
    reported: Iterable[int],
    changes: list[list],
    max_bytes: int = MAX_MESSAGE_BYTES,
    time_ms: int | None = None,
) -> list[tuple[bytes, bytes]]:
    """(key, value) messages carrying the change data of every transaction `reported` (the
    indexes whose outcomes this partition reports, out of the batch's `txns`), in txn
    order, each at most about `max_bytes`. `changes` holds every write of those
    transactions, in txn order; `time_ms`, the batch's time in the log, is in every record."""
    by_txn: dict[int, list[str]] = {index: [] for index in reported}
    for index, table, key, value in changes:
        items = by_txn.get(index)
        if items is None:
            items = by_txn[index] = []
        items.append(_change_json(table, key, value))
    records = []
    head = f'{{"batch":{batch_id},"txn":' if time_ms is None else f'{{"batch":{batch_id},"time":{int(time_ms)},"txn":'
    for index in sorted(by_txn):
        groups: list[list[str]] = [[]]
        size = 0
        for item in by_txn[index]:
            if groups[-1] and size + len(item) + 1 > max_bytes:
                groups.append([])
                size = 0
            groups[-1].append(item)
            size += len(item) + 1
        parts = len(groups)
        records += [
            (
                change_key(batch_id, index, part),
                f'{head}{index},"txns":{txns},"part":{part},"parts":{parts},"changes":[{",".join(group)}]}}'.encode(),
            )
            for part, group in enumerate(groups)
        ]
    return records


def _change_json(table: str, key: Any, value: Any) -> str:
    if type(key) is int and type(value) is int:  # the common case, formatted directly
        return f'{{"table":{_dumps(table)},"key":{key},"value":{value}}}'
    return _dumps(_change(table, key, value))


def _change(table: str, key: Any, value: Any) -> dict:
    if value is None:
        return {"table": table, "key": key, "value": None, "deleted": True}
    return {"table": table, "key": key, "value": value}


# An idempotent producer has been seen to deliver nothing more after a broker restart while
# the broker answered every other client (librdkafka 2.16, a node stopped and started under
# load). librdkafka's own way out is a message timeout, which outputs do not have: they wait
# for a broker that is away, however long. So a worker whose outputs have had no
# acknowledgement while the broker answered for this long replaces its producer.
OUTPUT_STALL_S = 30.0

log = logging.getLogger(__name__)


def _discard(producer: Producer) -> threading.Thread:
    """Drop what `producer` still holds and close it, in a thread of its own: a producer
    that stopped delivering may not close promptly, and the worker must not wait long on it."""

    def close() -> None:
        try:
            producer.purge()
            producer.flush(0)
            producer.close()
        except (KafkaException, RuntimeError):
            pass

    thread = threading.Thread(target=close, name="discard output producer", daemon=True)
    thread.start()
    return thread


# gzip at level 1: what every common Kafka client reads without a plugin (KafkaJS reads no
# other codec without one, kafka-python none without a package of its own), and on Ordo's
# outputs it stores 0.14-0.15 of the raw bytes (lz4: 0.21-0.22), with the broker's CPU
# as low as with lz4, for 1-6 us more of the producer's background thread per request
# (`ordo bench compression`, docs/benchmarks.md).
DEFAULT_OUTPUT_COMPRESSION = {"compression.type": "gzip", "compression.level": 1}


def output_compression(user_settings: dict[str, Any]) -> dict[str, Any]:
    """gzip at level 1 unless the user chose a codec."""
    if "compression.type" in user_settings or "compression.codec" in user_settings:
        return {}
    return dict(DEFAULT_OUTPUT_COMPRESSION)


class OutputLost(RuntimeError):
    """The broker refused an output: the batch must not be applied."""


class OutputSink(Protocol):
    """Where one partition worker's outputs go. Publishing is asynchronous, so a worker
    can execute the next batch while the broker acknowledges this one; a batch is applied
    only once `delivered` says its outputs are durable."""

    def publish(
        self,
        batch_id: int,
        txns: int,
        outcomes: list[Outcome],
        changes: list[list],
        streamed: list[list],
        time_ms: int | None = None,
    ) -> None:
        """Queue the outputs of one partition for one batch of `txns` transactions: the
        outcomes it reports, in txn order, every write of those transactions (wherever it
        is applied) as [txn index, table, key, value or None], in txn order, and the output
        stream tuples applied here, as [txn index, table, key, tuples], in txn order.
        `time_ms`: the batch's time in the log, carried by its change records."""

    def delivered(self, batch_id: int) -> bool:
        """Whether every output of `batch_id` and of the batches before it is acknowledged;
        raises OutputLost if the broker refused one."""

    def wait(self, timeout: float) -> None:
        """Send what is queued now and wait up to `timeout` seconds for acknowledgements."""

    def close(self) -> None: ...


class OutputDiffers(RuntimeError):
    """A replay computed another output than the copy on the topic under the same key."""


class CopyCheck:
    """The outputs already on a namespace's topics, for a replay that publishes copies of
    them: an output whose key is there with other values is refused before anything of its
    batch is sent. Read once, from every partition's beginning, at the first batch; a key
    may hold several values (a request id the log holds twice answers twice)."""

    def __init__(self, bootstrap: str, topics: Topics, timeout: float = 120.0):
        self._bootstrap, self._topics, self._timeout = bootstrap, topics, timeout
        self._held: dict[tuple[str, bytes], set[bytes]] | None = None

    def _read(self) -> dict[tuple[str, bytes], set[bytes]]:
        """What the topics hold; where they cannot be read (a principal allowed to write its
        outputs but not to read them, docs/operations.md), nothing, and the replay says so."""
        held: dict[tuple[str, bytes], set[bytes]] = {}
        try:
            names = [self._topics.results, self._topics.changes, *self._stream_topics()]
            for topic, key, value in written_since(self._bootstrap, names, CLOCK_MARGIN_MS, self._timeout):
                held.setdefault((topic, key), set()).add(value)
        except (TailsUnread, KafkaException) as exc:
            log.warning(
                "the outputs already on %s's topics could not be read (%s): this replay publishes its outputs "
                "without comparing them with those",
                self._topics.namespace,
                exc,
            )
        return held

    def _stream_topics(self) -> list[str]:
        prefix = f"{self._topics.namespace}.stream."
        admin = AdminClient(kafka_config(self._bootstrap))
        return sorted(name for name in admin.list_topics(timeout=self._timeout).topics if name.startswith(prefix))

    def check(self, batch_id: int, records: list[tuple[str, bytes, bytes]]) -> None:
        if self._held is None:
            self._held = self._read()
        for topic, key, value in records:
            there = self._held.get((topic, key))
            if there is not None and value not in there:
                raise OutputDiffers(
                    f"batch {batch_id}: the replay computed another output under key {key.decode(errors='replace')} "
                    f"than the one on {topic} (the procedures ran with the same code and environment: what "
                    f"they read beside them, a data file or native code, differs); nothing of the batch was "
                    f"published and it is not applied: restore what the procedures read and run `ordo recover` "
                    f"again, or rebuild with --no-publish (docs/operations.md, 'What the identity covers')"
                )


class KafkaOutputs:
    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        extra: dict | None = None,
        stall_after: float = OUTPUT_STALL_S,
        copies: CopyCheck | None = None,
    ):
        """`copies`: outputs already published, which every output must equal (a replay)."""
        self.topics = topics
        self._copies = copies
        self._bootstrap = bootstrap
        self._settings = {
            "enable.idempotence": True,
            "linger.ms": OUTPUT_LINGER_MS,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
            # Outputs wait for a broker that is away, however long: none expires unsent.
            "message.timeout.ms": 0,
            **output_compression(user_kafka_settings()),
            **(extra or {}),
        }
        self._producer = Producer(kafka_config(bootstrap, self._settings))
        # Unacknowledged messages per batch; batches enter in order, so the first key is
        # the oldest batch not yet fully acknowledged.
        self._outstanding: dict[int, int] = {}
        # What each of those batches sent, and when (ms), in case its producer must be replaced.
        self._sent: dict[int, tuple[int, list[tuple[str, bytes, bytes]]]] = {}
        self._acknowledged = 0
        self._stall = StallWatch(stall_after, self._broker_answers)
        self._admin: AdminClient | None = None  # asks whether the broker answers, while outputs stall
        self._generation = 0  # of the producer; a replaced one's late callbacks are ignored
        self._failure: str | None = None
        self._stream_topics = StreamTopics(bootstrap)

    def _acknowledger(self, batch_id: int):
        outstanding, sent, generation = self._outstanding, self._sent, self._generation

        def acknowledged(error, message) -> None:
            if generation != self._generation:
                return
            if error is not None:
                if self._failure is None:
                    self._failure = (
                        f"the broker refused an output of batch {batch_id} (topic {message.topic()}): {error.str()}"
                    )
                return
            self._acknowledged += 1
            left = outstanding[batch_id] - 1
            if left:
                outstanding[batch_id] = left
            else:
                del outstanding[batch_id]
                del sent[batch_id]

        return acknowledged

    def publish(
        self,
        batch_id: int,
        txns: int,
        outcomes: list[Outcome],
        changes: list[list],
        streamed: list[list],
        time_ms: int | None = None,
    ) -> None:
        topics = self.topics
        records = [outcome_message(outcome, batch_id, topics) for outcome in outcomes]
        records += [
            (topics.changes, key, value)
            for key, value in change_records(batch_id, txns, (o.index for o in outcomes), changes, time_ms=time_ms)
        ]
        tuples = stream_records(topics.namespace, batch_id, streamed)
        if tuples:
            self._stream_topics.ensure(tuples)
            records += tuples
        if not records:  # a partition that reports no transaction of the batch has nothing to send
            return
        if self._copies is not None:
            self._copies.check(batch_id, records)
        if not self._outstanding:  # a stall is counted from the first output waited for
            self._stall.progress(self._acknowledged, time.monotonic())
        self._outstanding[batch_id] = self._outstanding.get(batch_id, 0) + len(records)
        self._sent.setdefault(batch_id, (int(time.time() * 1000), []))[1].extend(records)
        self._produce(batch_id, records)

    def _produce(self, batch_id: int, records: list[tuple[str, bytes, bytes]]) -> None:
        acknowledged = self._acknowledger(batch_id)
        produce = self._producer.produce
        for topic, key, value in records:
            while True:
                try:
                    produce(topic, key=key, value=value, on_delivery=acknowledged)
                    break
                except BufferError:  # the local queue is full: let the broker catch up
                    self._producer.poll(0.05)
                except KafkaException as exc:  # refused before it left: as if the broker had
                    error = exc.args[0] if exc.args else exc
                    self._failure = self._failure or (
                        f"an output of batch {batch_id} (topic {topic}, {len(value)} bytes) cannot be sent: "
                        f"{error.str() if hasattr(error, 'str') else error}"
                    )
                    self._check()

    def delivered(self, batch_id: int) -> bool:
        self._producer.poll(0)
        self._check()
        outstanding = self._outstanding
        return not outstanding or next(iter(outstanding)) > batch_id

    def wait(self, timeout: float) -> None:
        # flush, not poll: librdkafka sends what is queued without waiting out the linger
        # (the caller waits for acknowledgements, so nothing is gained by gathering more).
        self._producer.flush(timeout)
        self._check()
        if self._outstanding and self._stall.stalled(self._acknowledged, time.monotonic()):
            self._replace_producer()

    def _broker_answers(self) -> bool:
        if self._admin is None:
            self._admin = AdminClient(kafka_config(self._bootstrap))
        try:
            self._admin.list_topics(self.topics.results, timeout=2)
            return True
        except KafkaException:
            return False

    def _replace_producer(self) -> None:
        """A new producer for the outputs the current one does not get acknowledged: the
        old one is closed, and the new one sends, in their order, those of its outputs that
        did not reach the broker (scheduler/stalled_outputs.py)."""
        fresh = Producer(kafka_config(self._bootstrap, self._settings))
        stale, self._producer = self._producer, fresh
        self._generation += 1
        _discard(stale).join(10)  # closed, it sends nothing more while its topics are read back
        oldest = min(at for at, _ in self._sent.values())
        try:
            arrived = written_since(self._bootstrap, {t for _, r in self._sent.values() for t, _, _ in r}, oldest, 60)
        except TailsUnread as exc:
            # Sent again whole: a consumer sees the same record twice, as after a replay.
            log.warning("the outputs' topics could not be read back (%s): all unacknowledged outputs go again", exc)
            arrived = set()
        total = sum(len(records) for _, records in self._sent.values())
        again = 0
        for batch_id, (_, records) in list(self._sent.items()):
            unsent = [record for record in records if record not in arrived]  # every key is bytes already
            if unsent:
                self._outstanding[batch_id] = len(unsent)
                self._produce(batch_id, unsent)
                again += len(unsent)
            else:
                del self._outstanding[batch_id]
                del self._sent[batch_id]
        log.warning(
            "the outputs' producer had nothing acknowledged while the broker answered for %.0f s: replaced; "
            "%d unacknowledged output(s) had reached the broker, %d go again",
            self._stall.stall_after,
            total - again,
            again,
        )

    def _check(self) -> None:
        if self._failure is not None:
            raise OutputLost(
                f"{self._failure}; nothing was applied after it, and a restart of the engine "
                "publishes it again from the log"
            )

    def close(self) -> None:
        self._producer.flush(10)


class UnpublishedOutputs:
    """Outputs computed and published nowhere: a rebuild into a data directory that is not
    an engine's own leaves the live topics as they are (ordo/recover.py)."""

    def publish(
        self,
        batch_id: int,
        txns: int,
        outcomes: list[Outcome],
        changes: list[list],
        streamed: list[list],
        time_ms: int | None = None,
    ) -> None:
        pass

    def delivered(self, batch_id: int) -> bool:
        return True

    def wait(self, timeout: float) -> None:
        pass

    def close(self) -> None:
        pass


class CollectedOutputs:
    """Outputs kept in memory: for comparing engine configurations on one log. Each
    partition worker collects its own; `merge` puts them together in log order."""

    def __init__(self) -> None:
        self._outcomes: list[tuple] = []  # (batch, txn index, outcome record)
        self._changes: list[tuple] = []  # (batch, txn index, encoded key, table, key, value or None)
        self._restarts: list[tuple] = []  # (batch, txn index, request message)

    def publish(
        self,
        batch_id: int,
        txns: int,
        outcomes: list[Outcome],
        changes: list[list],
        streamed: list[list],
        time_ms: int | None = None,
    ) -> None:
        restarted = [o for o in outcomes if o.status == RESTARTED] if outcomes else ()
        if restarted:
            self._restarts.extend((batch_id, o.index, restart_request(o.id, o.result)) for o in restarted)
            outcomes = [o for o in outcomes if o.status != RESTARTED]
        self._outcomes.extend((batch_id, o.index, _collected(o, batch_id)) for o in outcomes)
        self._changes.extend(
            (batch_id, index, encode_key(table, key), table, key, value) for index, table, key, value in changes
        )

    def delivered(self, batch_id: int) -> bool:
        return True

    def wait(self, timeout: float) -> None:
        pass

    def merge(self, other: "CollectedOutputs") -> None:
        self._outcomes.extend(other._outcomes)
        self._changes.extend(other._changes)
        self._restarts.extend(other._restarts)

    @property
    def outcomes(self) -> list[dict[str, Any]]:
        """Every outcome in log order."""
        return [record for *_, record in sorted(self._outcomes, key=_position)]

    @property
    def positioned(self) -> list[tuple[int, int, dict[str, Any]]]:
        """(batch, txn index, outcome record) in log order."""
        return sorted(self._outcomes, key=_position)

    @property
    def restarts(self) -> list[bytes]:
        """The requests re-sequenced transactions appended, in log order of their turns."""
        return [message for *_, message in sorted(self._restarts, key=_position)]

    @property
    def changes(self) -> list[tuple]:
        """(batch, txn index, table, key, value or None) in txn order, then key order."""
        return [(b, i, table, key, value) for b, i, _, table, key, value in sorted(self._changes, key=_change_order)]

    def close(self) -> None:
        pass


def _collected(o: Outcome, batch_id: int) -> dict[str, Any]:
    """The outcome record as <ns>.results carries it, decoded; a streaming dataflow's adds
    the status of each triggered procedure (procedures/streams.py)."""
    result, steps = split_result(o.result)
    record = {
        "id": o.id,
        "status": o.status,
        "batch": batch_id,
        "txn": o.index,
        "restarts": o.restarts,
        "result": result,
        "error": o.error,
    }
    if steps is not None:
        record["steps"] = steps
    return record


def _position(item: tuple) -> tuple:
    return item[0], item[1]


def _change_order(item: tuple) -> tuple:
    return item[0], item[1], item[2]
