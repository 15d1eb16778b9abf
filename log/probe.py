"""Does the broker still hold a record this process read or wrote? Asked by fetching that
record again and comparing its bytes: a broker restarted without its data answers with
nothing there, or with another record. Watermarks are not used: some brokers misreport
them under load (the local broker has answered an end offset of 0 for a log of 150
records), and a false alarm would stop a healthy engine. The fetch reads uncommitted: the
question is whether the record is there, and a committed record the broker still holds
back from read_committed readers (behind its last stable offset) is there.

Another record at the offset is evidence at once. No record there is evidence only once it
has lasted ABSENT_GRACE seconds: a durable broker that is starting again, or a partition whose
leader is moving, answers "no such topic" or "nothing there" for a few seconds and then
serves everything it had."""

from __future__ import annotations

import hashlib
import threading
import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

from ordo.broker.clients import consumer_config

ABSENT_GRACE = 60.0  # a durable broker loading its logs on a busy machine has answered "no such topic" for over 30 s

GONE = (
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.OFFSET_OUT_OF_RANGE,
    KafkaError._AUTO_OFFSET_RESET,
)


def fingerprint(value: bytes | None) -> bytes:
    return hashlib.blake2b(value or b"", digest_size=16).digest()


class RecordProbe:
    def __init__(self, bootstrap: str, topic: str, group: str):
        self.topic = topic
        self._consumer = Consumer(
            consumer_config(
                bootstrap,
                {
                    "group.id": group,
                    "enable.auto.commit": False,
                    "isolation.level": "read_uncommitted",
                    "auto.offset.reset": "error",
                    "enable.partition.eof": True,
                },
            )
        )
        self._absent_since: float | None = None

    def holds(self, offset: int, digest: bytes | None, timeout: float = 2.0) -> bool | None:
        """True: the record at `offset` is still the one fingerprinted (with no digest:
        there is still a record there). False: another record is there, or nothing there
        in every look for ABSENT_GRACE seconds. None: no answer yet."""
        found = self._look(offset, digest, timeout)
        if found in ("absent", None):
            # A fetch past a log's end may get no answer at all (the local broker sends an
            # empty one): then its end offset, below the record, is the evidence, twice.
            first = found or self._absent_by_end(offset)
            time.sleep(0.5)
            second = self._look(offset, digest, timeout) or self._absent_by_end(offset)
            found = second if first == second else None
        if found == "absent":
            now = time.monotonic()
            self._absent_since = self._absent_since or now
            return False if now - self._absent_since >= ABSENT_GRACE else None
        if found is not None:
            self._absent_since = None
        return None if found is None else found == "same"

    def forget_absence(self) -> None:
        """Start the grace for a missing record afresh (the broker did not answer)."""
        self._absent_since = None

    def cluster_id(self) -> str | None:
        """The id of the Kafka cluster answering (None if it did not say)."""
        try:
            return self._consumer.list_topics(self.topic, timeout=2).cluster_id
        except Exception:
            return None

    def end_offset(self) -> int | None:
        """The log's end offset, records of open transactions included (a read_committed
        consumer is told the last stable offset instead); None if the broker did not say."""
        return self.end_and_error()[0]

    def end_and_error(self) -> tuple[int | None, int | None]:
        """(end offset, None), or (None, the error's code) when the broker did not say."""
        try:
            return self._consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=2, cached=False)[1], None
        except Exception as exc:
            return None, exc.args[0].code() if exc.args and hasattr(exc.args[0], "code") else None

    def _absent_by_end(self, offset: int) -> str | None:
        end, error = self.end_and_error()
        if end is None:
            return "absent" if error in GONE else None
        return "absent" if end <= offset else None

    def _look(self, offset: int, digest: bytes | None, timeout: float) -> str | None:
        self._consumer.assign([TopicPartition(self.topic, 0, offset)])
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                message = self._consumer.poll(0.2)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() in GONE or error.code() == KafkaError._PARTITION_EOF:
                        return "absent"  # the log ends at or before the record, or is gone
                    continue
                same = message.offset() == offset and (digest is None or fingerprint(message.value()) == digest)
                return "same" if same else "other"
            return None
        finally:
            # An assigned consumer goes on fetching (and queueing) the log after the one record
            # looked at: every batch, for every reader and sequencer, until the next look.
            self._consumer.unassign()

    def close(self) -> None:
        self._consumer.close()


class LogWatch:
    """The questions a log's readers and writers ask the broker now and then, asked in a
    thread of its own every `every` seconds: does the broker still hold the record noted
    last (`lost` becomes that record's offset once it is gone for good), and where does the
    log end (`end`, as RecordProbe.end_and_error answers). A Kafka broker answers the requests of one
    connection in order, so such a question on a consumer with a fetch outstanding waits out
    the fetch (about 50 ms); asked from the hot loop, that would stall every request behind it.

    It also notes the id of the Kafka cluster that answers: a broker restarted without its
    data is a new cluster with a new id (`other_cluster` becomes it), which is evidence at
    once, where a missing record is evidence only after ABSENT_GRACE."""

    def __init__(self, bootstrap: str, topic: str, group: str, every: float):
        self.topic, self.every = topic, every
        self.end: tuple[int | None, int | None] = (None, None)
        self.answered = threading.Event()  # `end` holds a first answer
        self.lost: int | None = None
        self.cluster: str | None = None  # the id of the cluster first seen
        self.other_cluster: str | None = None  # another cluster's id, once one answers instead
        self._noted: tuple[int, bytes | None] | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop and by `ask_now`: skip the rest of the wait
        self._rounds = threading.Condition()
        self._started = self._done = 0  # rounds of questions begun and finished
        self._probe = RecordProbe(bootstrap, topic, group)
        self._thread = threading.Thread(target=self._run, name=f"watch {topic}", daemon=True)
        self._thread.start()

    def note(self, offset: int, digest: bytes | None) -> None:
        """The newest record read or written: the one to look for from now on."""
        self._noted = (offset, digest)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._rounds:
                    self._started += 1
                answering = self._check_cluster()
                self.end = self._probe.end_and_error()
                self.answered.set()
                noted = self._noted
                if not answering:
                    # A broker that does not answer (stopped, unreachable) says nothing about
                    # its records: absence counts only while a broker answers.
                    self._probe.forget_absence()
                elif noted is not None and self.lost is None and self._probe.holds(*noted) is False:
                    self.lost = noted[0]
                with self._rounds:
                    self._done += 1
                    self._rounds.notify_all()
                self._wake.wait(self.every)
                self._wake.clear()
        finally:
            self._probe.close()

    def ask_now(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) for a round of questions begun after this call,
        so `lost_cluster` and `lost` speak of the broker as it is now."""
        with self._rounds:
            wanted = self._started + 1
            self._wake.set()
            self._rounds.wait_for(lambda: self._done >= wanted or self._stop.is_set(), timeout)

    def _check_cluster(self) -> bool:
        """Note the id of the cluster answering; False if none answered."""
        cluster = self._probe.cluster_id()
        if cluster is None:
            return False
        if self.cluster is None:
            self.cluster = cluster
        elif cluster != self.cluster:
            self.other_cluster = cluster
        return True

    def lost_cluster(self) -> str | None:
        """What to say when another cluster answers now, else None."""
        if self.other_cluster is None:
            return None
        return (
            f"the Kafka cluster holding {self.topic} is another one now (cluster id {self.other_cluster}, was "
            f"{self.cluster}): the broker lost the log (restarted without its data?); see docs/operations.md, "
            f"'Broker lost'"
        )

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)
