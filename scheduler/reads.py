"""Live reads: the state as of one applied batch, served by the partition workers from
their shards, beside the log and never through it (docs/client.md, "Reading the state").

A read is a JSON object on `<ns>.reads`; every worker reads that topic and answers, on
`<ns>.read-answers`, for the keys it owns, with the batch its values are exactly those of:

  {"id": "read-1", "table": "account", "keys": [1, 2]}
  {"id": "read-2", "table": "order", "scan": {"prefix": [7], "after": null, "limit": 100}}
  optional: "at_least": batch, "after_offset": a log offset, "timeout_ms": how long to wait

A worker answers at once from the batch its shard has applied, if that is at least
`at_least`; else right after it applies that batch, and then at exactly that batch (a
round ends there). So parts of a read that name different batches are asked again with
`at_least` the newest of them: the parts behind answer at exactly it. `after_offset`
asks for every batch the log held below that offset (what a linearizable read needs).

Reads never change the state, the outcomes or the change data, and the log never holds
them: a replay is what it would be without them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ordo.broker.clients import GATHER_FROM, PacedProducer, arrived, close_later, consumer_config, kafka_config
from ordo.broker.fetch_stall import ReadOn
from ordo.broker.topics import Topics, ensure_read_topics
from ordo.storage.keys import decode_key, encode_key, key_problem, normal_key, prefix_bytes, table_prefix
from ordo.storage.values import decode_value

log = logging.getLogger("ordo.engine")

MAX_KEYS = 10_000  # keys one read may name
MAX_ROWS = 10_000  # rows one scan may ask for
DEFAULT_ROWS = 100
DEFAULT_TIMEOUT_MS = 10_000
MAX_TIMEOUT_MS = 120_000
MAX_WAITING = 10_000  # reads a worker holds for batches it has not applied yet
READS_PER_TURN = 256
MAX_GATHERED = 1_000  # reads one record may gather  # reads served before the write path gets its turn
# On start, reads sent this long ago are still answered where their timeout has not passed
# (a client waiting through an engine restart gets its answer).
STARTING_WINDOW_MS = MAX_TIMEOUT_MS

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(slots=True)
class Read:
    id: str
    table: str
    parts: tuple[int, ...]  # the partitions that answer it
    deadline: float  # time.time() past which its client no longer waits
    at_least: int = 0
    after_offset: int | None = None
    keys: list | None = None  # point reads: the keys, as given
    encoded: list[bytes] | None = None
    owners: list[int] | None = None
    prefix: bytes = b""  # a scan: the bytes its keys start with
    after: bytes | None = None
    limit: int = DEFAULT_ROWS
    asked: tuple[int, ...] | None = None  # the partitions asked again, of `parts`; None: all
    group: Any = None  # the key of the record that gathered it with others (its answer goes there)


@dataclass(slots=True)
class Refused:
    """A read that cannot be served, whoever is asked: partition 0 answers it."""

    id: str
    error: str


class ReadProblem(ValueError):
    pass


def parse_read(value: bytes | None, timestamp_ms: int, tables: dict[str, Any], partitioner) -> Read | Refused | None:
    """The read a record of `<ns>.reads` asks for; Refused with the reason for a read that
    cannot be served; None for a record without an id to answer to."""
    reads = parse_reads(value, timestamp_ms, tables, partitioner)
    single = len(reads) == 1 and not (isinstance(reads[0], Read) and reads[0].group is not None)
    return reads[0] if single else None


def parse_reads(
    value: bytes | None, timestamp_ms: int, tables: dict[str, Any], partitioner, key: bytes | None = None
) -> list[Read | Refused]:
    """The reads of a record of `<ns>.reads`: one read, or several gathered under
    `{"reads": [...]}` (whose answers go out gathered under the record's key too)."""
    try:
        body = json.loads(value) if value else None
    except (ValueError, UnicodeDecodeError):
        return []
    if type(body) is dict and type(body.get("reads")) is list:
        bodies, group = body["reads"][:MAX_GATHERED], key or b""
    else:
        bodies, group = [body], None
    reads: list[Read | Refused] = []
    for one in bodies:
        if type(one) is not dict or type(one.get("id")) is not str or not one["id"]:
            continue
        try:
            read = _read(one, timestamp_ms, tables, partitioner)
        except ReadProblem as exc:
            reads.append(Refused(one["id"], str(exc)))
            continue
        read.group = group
        reads.append(read)
    return reads


def _read(body: dict, timestamp_ms: int, tables: dict[str, Any], partitioner) -> Read:
    table = body.get("table")
    if type(table) is not str or table not in tables:
        known = ", ".join(sorted(tables)) or "none"
        raise ReadProblem(f"unknown table {table!r} (this app's tables: {known})")
    timeout_ms = _integer(body, "timeout_ms", DEFAULT_TIMEOUT_MS)
    if not 0 < timeout_ms <= MAX_TIMEOUT_MS:
        raise ReadProblem(f"timeout_ms must be between 1 and {MAX_TIMEOUT_MS}")
    read = Read(
        body["id"],
        table,
        (),
        (timestamp_ms + timeout_ms) / 1000,
        at_least=_integer(body, "at_least", 0),
        after_offset=_integer(body, "after_offset", None),
    )
    asked = body.get("partitions")
    if asked is not None:
        if type(asked) is not list or not all(type(p) is int for p in asked):
            raise ReadProblem('"partitions" must be a list of partition numbers')
        read.asked = tuple(asked)
    has_keys, has_scan = "keys" in body, "scan" in body
    if has_keys == has_scan:
        raise ReadProblem('a read names either "keys" or "scan"')
    n = partitioner.partitions
    if has_keys:
        keys = body["keys"]
        if type(keys) is not list or not keys:
            raise ReadProblem('"keys" must be a non-empty list')
        if len(keys) > MAX_KEYS:
            raise ReadProblem(f"a read names at most {MAX_KEYS} keys, not {len(keys)}")
        read.keys = [normal_key(key) for key in keys]
        read.encoded = [_encoded(table, key) for key in read.keys]
        read.owners = [partitioner.of(table, key, raw) for key, raw in zip(read.keys, read.encoded)]
        read.parts = tuple(sorted(set(read.owners)))
        return read
    scan = body["scan"]
    if type(scan) is not dict:
        raise ReadProblem('"scan" must be an object')
    prefix = scan.get("prefix")
    if prefix is None:
        read.prefix = table_prefix(table)
    elif type(prefix) is list and prefix:
        if key_problem(tuple(prefix)):
            raise ReadProblem(f"prefix {prefix!r}: {key_problem(tuple(prefix))}")
        read.prefix = prefix_bytes(table, tuple(prefix))
    else:
        raise ReadProblem('"prefix" must be a non-empty list of key components, or null for the whole table')
    after = scan.get("after")
    if after is not None:
        read.after = _encoded(table, normal_key(after))
    read.limit = _integer(scan, "limit", DEFAULT_ROWS)
    if not 0 < read.limit <= MAX_ROWS:
        raise ReadProblem(f"a scan returns 1 to {MAX_ROWS} rows: ask for fewer, and go on from the last key")
    home = partitioner.of_prefix(table, tuple(prefix)) if prefix is not None and n > 1 else None
    read.parts = (home,) if home is not None else tuple(range(n))
    return read


def _integer(body: dict, name: str, default):
    value = body.get(name, default)
    if value is not default and (type(value) is not int or value < 0):
        raise ReadProblem(f'"{name}" must be a non-negative integer')
    return value


def _encoded(table: str, key) -> bytes:
    problem = key_problem(key)
    if problem:
        raise ReadProblem(f"key {key!r}: {problem}")
    return encode_key(table, key)


def serve(shard, reads: list[Read], partition: int, defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """This partition's parts of `reads`: the point reads from one view of its shard (one
    multi-get for all of them), each scan from a view of its own."""
    answers = []
    points = [read for read in reads if read.keys is not None]
    if points:
        wanted, slices = [], []
        for read in points:
            assert read.encoded is not None and read.owners is not None
            mine = [i for i, owner in enumerate(read.owners) if owner == partition]
            slices.append((len(wanted), mine))
            wanted.extend(read.encoded[i] for i in mine)
        marker, raw = shard.read_applied(wanted)
        for read, (start, mine) in zip(points, slices):
            default = defaults.get(read.table)
            assert read.keys is not None
            found = [
                [read.keys[i], default if value is None else decode_value(value)]
                for i, value in zip(mine, raw[start : start + len(mine)])
            ]
            answers.append(_answer(read, partition, marker, {"values": found}))
    for read in reads:
        if read.keys is None:
            marker, rows, more = shard.scan_applied(read.prefix, read.after, read.limit)
            found = [[decode_key(key)[1], decode_value(value)] for key, value in rows]
            answers.append(_answer(read, partition, marker, {"rows": found, "more": more}))
    return answers


def _in_answer_order(reads: list[Read]) -> list[Read]:
    """`reads` in the order `serve` answers them: point reads first, then scans."""
    return [read for read in reads if read.keys is not None] + [read for read in reads if read.keys is None]


def _answer(read: Read, partition: int, marker: dict | None, found: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": read.id,
        "partition": partition,
        "parts": list(read.parts),
        "batch": marker["batch"] if marker else 0,
        "time_ms": marker["cursor"].get("time_ms", 0) if marker else 0,
        **found,
    }


def answer_bytes(answer: dict[str, Any]) -> bytes:
    try:
        return _dumps(answer).encode()
    except (TypeError, ValueError) as exc:
        return _dumps(
            {
                "id": answer["id"],
                "partition": answer["partition"],
                "parts": answer["parts"],
                "error": f"a value is not JSON: {exc}",
            }
        ).encode()


def refusal(read_id: str, partition: int, error: str, parts: tuple[int, ...] = (0,)) -> dict[str, Any]:
    return {"id": read_id, "partition": partition, "parts": list(parts), "error": error}


class ReadServer:
    """A worker's reads: a thread that reads `<ns>.reads` and answers what its shard has
    applied, and the reads held for batches to come, which the worker's loop answers as it
    applies them (`applied`). `busy()` says whether the write path has batches waiting: then
    reads are served READS_PER_TURN at a time, with a pause for it between."""

    def __init__(self, bootstrap: str, namespace: str, worker, busy: Callable[[], bool], behind: Callable[[], int]):
        self.worker = worker
        self.partition = worker.partition
        self.topics = Topics(namespace)
        self._bootstrap = bootstrap
        self._busy = busy
        self._behind = behind
        self._lock = threading.Lock()
        self._waiting: list[Read] = []  # reads for a batch not applied yet
        self._by_offset: list[Read] = []  # reads for every batch below a log offset
        marker = worker.applied()
        self._applied = marker["batch"] if marker else 0
        self.served = 0
        self._stop = threading.Event()
        self._producer = PacedProducer(
            kafka_config(bootstrap, {"message.timeout.ms": 30_000, "acks": 1, "socket.nagle.disable": True})
        )
        self._gather = False  # whether answers go out gathered (many at once)
        self._thread = threading.Thread(target=self._run, name=f"reads of partition {self.partition}", daemon=True)
        self._thread.start()

    # -- the worker's loop ------------------------------------------------------------

    @property
    def waiting(self) -> bool:
        return bool(self._waiting or self._by_offset)

    def ends_round(self, batch_id: int) -> bool:
        """Whether a read waits for exactly this batch: a round ends there, so the state
        as of it is applied on its own."""
        return any(read.at_least == batch_id for read in self._waiting)

    def applied(self, batch_id: int) -> None:
        """The shard now holds exactly batch `batch_id`: answer the reads that waited for it."""
        with self._lock:
            self._applied = batch_id
            if not self._waiting:
                return
            due = [read for read in self._waiting if read.at_least <= batch_id]
            if not due:
                return
            self._waiting = [read for read in self._waiting if read.at_least > batch_id]
        self._answer(due)

    def resolve(self, position: int, unapplied: list[tuple[int, int]]) -> None:
        """Reads for every batch below a log offset, once the log is read that far:
        `position`, the offset read up to; `unapplied`, (batch, offset after its record)
        of the batches read and not applied yet, in order."""
        if not self._by_offset:
            return
        with self._lock:
            ready = [
                read for read in self._by_offset if read.after_offset is not None and read.after_offset <= position
            ]
            if not ready:
                return
            taken = {id(read) for read in ready}
            self._by_offset = [read for read in self._by_offset if id(read) not in taken]
        for read in ready:
            assert read.after_offset is not None
            below = [batch for batch, end in unapplied if end <= read.after_offset]
            read.at_least = max(read.at_least, below[-1] if below else 0)
            read.after_offset = None
            self._hold_or_answer(read)

    def expire(self, now: float) -> None:
        """Answer the reads whose batch did not come within their timeout."""
        if not self.waiting:
            return
        with self._lock:
            late = [read for read in self._waiting + self._by_offset if read.deadline <= now]
            if not late:
                return
            self._waiting = [read for read in self._waiting if read.deadline > now]
            self._by_offset = [read for read in self._by_offset if read.deadline > now]
            applied = self._applied
        for read in late:
            wanted = f"batch {read.at_least}" if read.after_offset is None else f"log offset {read.after_offset}"
            self._send(
                refusal(
                    read.id,
                    self.partition,
                    f"partition {self.partition} had not applied {wanted} within the read's timeout "
                    f"(it has applied batch {applied})",
                    read.parts,
                )
            )

    # -- the reads thread -------------------------------------------------------------

    def _run(self) -> None:
        consumer = None
        try:
            consumer, starts = self._consumer_from_window()
            read_on = ReadOn(self._new_consumer, starts)
            while not self._stop.is_set():
                try:
                    messages = arrived(consumer, 0.05, READS_PER_TURN)
                except KafkaException:
                    time.sleep(0.05)
                    continue
                if not messages:
                    consumer = read_on.checked(consumer)
                    self._producer.poll()
                    continue
                read_on.read()
                self._take(messages)
                self._producer.poll()
                if self._busy():
                    time.sleep(0.001)  # the write path's turn
        except Exception as exc:  # reads fail alone: the engine goes on with writes
            log.error("partition %d stopped serving reads: %s", self.partition, exc)
        finally:
            if consumer is not None:
                close_later(consumer)

    def _new_consumer(self) -> Consumer:
        return Consumer(
            consumer_config(
                self._bootstrap,
                {
                    "group.id": f"{self.topics.namespace}.reads-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "socket.nagle.disable": True,
                },
            )
        )

    def _consumer_from_window(self) -> tuple[Consumer, dict]:
        while not self._stop.is_set():
            try:
                ensure_read_topics(self._bootstrap, self.topics, timeout=10)
                break
            except Exception:  # a broker away: reads wait for it, as writes do
                self._stop.wait(0.5)
        consumer = self._new_consumer()
        where = TopicPartition(self.topics.reads, 0)
        while not self._stop.is_set():
            try:
                _, end = consumer.get_watermark_offsets(where, timeout=5, cached=False)
                break
            except KafkaException:
                self._stop.wait(0.2)
        else:
            return consumer, {}
        since = TopicPartition(self.topics.reads, 0, int(time.time() * 1000) - STARTING_WINDOW_MS)
        try:
            found = consumer.offsets_for_times([since], timeout=5)[0].offset
        except KafkaException:  # a broker that cannot look offsets up by time: from the end
            found = -1
        offset = found if 0 <= found <= end else end
        consumer.assign([TopicPartition(self.topics.reads, 0, offset)])
        return consumer, {(self.topics.reads, 0): offset}

    def _take(self, messages: list) -> None:
        """Answer the reads of one turn that this shard can answer now, together."""
        worker, now, partition = self.worker, time.time(), self.partition
        tables, partitioner = worker.registry.tables, worker.partitioner
        answer_now = []
        for message in messages:
            if message.error() is not None:
                continue
            timestamp = message.timestamp()[1]
            stamp = timestamp if timestamp > 0 else int(now * 1000)
            for read in parse_reads(message.value(), stamp, tables, partitioner, message.key()):
                if isinstance(read, Refused):
                    if partition == 0:
                        self._send(refusal(read.id, 0, read.error))
                    continue
                if partition not in read.parts or read.deadline <= now:
                    continue
                if read.asked is not None and partition not in read.asked:
                    continue
                if read.after_offset is not None:
                    self._hold(read, self._by_offset)
                elif not self._held(read):
                    answer_now.append(read)
        if answer_now:
            self._answer(answer_now)

    def _hold(self, read: Read, waiting: list[Read]) -> None:
        with self._lock:
            if len(self._waiting) + len(self._by_offset) < MAX_WAITING:
                waiting.append(read)
                return
        self._send(refusal(read.id, self.partition, self._too_many(), read.parts))

    def _held(self, read: Read) -> bool:
        """Whether `read` waits for a batch to come (held, or refused when too many wait)."""
        with self._lock:
            if read.at_least <= self._applied:
                return False
        self._hold(read, self._waiting)
        return True

    def _hold_or_answer(self, read: Read) -> None:
        if not self._held(read):
            self._answer([read])

    def _too_many(self) -> str:
        return f"partition {self.partition} holds {MAX_WAITING} reads for batches to come already: ask again later"

    def _answer(self, reads: list[Read]) -> None:
        worker = self.worker
        try:
            answers = serve(worker.shard, reads, self.partition, worker.defaults)
        except Exception as exc:
            why = f"partition {self.partition} could not read: {exc}"
            answers = [refusal(read.id, self.partition, why, read.parts) for read in _in_answer_order(reads)]
        else:
            behind = self._behind()
            for answer in answers:
                answer["behind"] = behind
        self.served += len(reads)
        self._gather = len(answers) >= GATHER_FROM
        groups: dict[bytes, list[dict[str, Any]]] = {}
        for read, answer in zip(_in_answer_order(reads), answers):
            if read.group is None:
                self._send(answer)
            else:
                groups.setdefault(read.group, []).append(answer)
        for key, gathered in groups.items():
            self._send_gathered(key, gathered)

    def _send_gathered(self, key: bytes, answers: list[dict[str, Any]]) -> None:
        """The answers to reads one record gathered, in one record under its key."""
        try:
            value = _dumps({"answers": answers}).encode()
        except (TypeError, ValueError):  # a value JSON cannot carry: each answer on its own says which
            for answer in answers:
                self._send(answer)
            return
        try:
            self._producer.produce(self.topics.read_answers, value, key, self._gather)
        except BufferError:
            self._producer.poll()
        except KafkaException as exc:
            log.debug("partition %d: reads' answers were not sent: %s", self.partition, exc)

    def _send(self, answer: dict[str, Any]) -> None:
        try:
            self._producer.produce(self.topics.read_answers, answer_bytes(answer), answer["id"].encode(), self._gather)
        except BufferError:
            self._producer.poll()
        except KafkaException as exc:
            log.debug("partition %d: a read's answer was not sent: %s", self.partition, exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._producer.flush(2)
