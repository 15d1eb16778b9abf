"""Probe a Kafka-protocol broker for the behaviour an exactly-once sequencer cares about.

    python -m ordo.broker.probe [--bootstrap-servers HOST:PORT]

Without an address it starts a local broker (broker/local.py). Each probe prints OK (behaves like Apache Kafka)
or QUIRK, with one line of detail. Ordo does not rely on any of these behaviours; the report
says what a reader of the log must defend against on this broker.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import uuid
from typing import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT = 10.0  # seconds; every broker call below is bounded by it

# The fencing probe makes librdkafka log fatal errors on purpose; keep the report readable.
_quiet = logging.getLogger("ordo.broker_probe.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False
QUIET = {"logger": _quiet}


class Probe:
    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self.run_id = uuid.uuid4().hex[:8]
        self.admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})

    def topic(self, name: str) -> str:
        topic = f"ordo-probe-{self.run_id}-{name}"
        futures = self.admin.create_topics(
            [NewTopic(topic, num_partitions=1, replication_factor=1)],
            operation_timeout=TIMEOUT,
            request_timeout=TIMEOUT,
        )
        futures[topic].result(TIMEOUT)
        return topic

    def producer(self, **extra) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 50,
                **QUIET,
                "message.timeout.ms": int(TIMEOUT * 1000),
                **extra,
            }
        )

    def consumer(self, **extra) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"ordo-probe-{self.run_id}",
                **QUIET,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
                **extra,
            }
        )

    def read_all(self, topic: str, **extra) -> list:
        """(offset, value) of every record delivered, from offset 0 to end of partition."""
        consumer = self.consumer(**extra)
        consumer.assign([TopicPartition(topic, 0, 0)])
        records, deadline = [], time.monotonic() + TIMEOUT
        try:
            while time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                if message.error():
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        return records
                    raise KafkaException(message.error())
                records.append((message.offset(), message.value()))
            raise TimeoutError(f"no end of partition on {topic} within {TIMEOUT}s")
        finally:
            consumer.close()

    def watermarks(self, topic: str) -> tuple[int, int]:
        consumer = self.consumer()
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)
        finally:
            consumer.close()

    def transactional(self, txn_id: str) -> Producer:
        producer = self.producer(**{"transactional.id": txn_id})
        producer.init_transactions(TIMEOUT)
        return producer

    # --- probes: each returns (ok, detail) ---------------------------------------------------

    def watermark(self) -> tuple[bool, str]:
        topic = self.topic("watermark")
        producer = self.producer()
        producer.produce(topic, value=b"alone", partition=0)
        _flush(producer)
        for i in range(5):  # within one linger window: one producer batch of 5 records
            producer.produce(topic, value=b"w%d" % i, partition=0)
        _flush(producer)
        _low, high = self.watermarks(topic)
        offsets = [o for o, _ in self.read_all(topic)]
        expected = offsets[-1] + 1
        detail = f"1 record then a batch of 5 at offsets {offsets}: high watermark {high}, Kafka reports {expected}"
        return high == expected, detail

    def aborted_hidden(self) -> tuple[bool, str]:
        topic = self.topic("aborted")
        producer = self.transactional(f"ordo-probe-{self.run_id}-abort")
        producer.begin_transaction()
        producer.produce(topic, value=b"aborted-1", partition=0)
        producer.produce(topic, value=b"aborted-2", partition=0)
        _flush(producer)
        producer.abort_transaction(TIMEOUT)
        producer.begin_transaction()
        producer.produce(topic, value=b"committed", partition=0)
        producer.commit_transaction(TIMEOUT)
        seen = self.read_all(topic, **{"isolation.level": "read_committed"})
        values = [v.decode() for _, v in seen]
        detail = f"read_committed saw {values} at offsets {[o for o, _ in seen]} (expected only ['committed'])"
        return values == ["committed"], detail

    def fencing(self) -> tuple[bool, str]:
        topic = self.topic("fencing")
        txn_id = f"ordo-probe-{self.run_id}-fence"
        old = self.transactional(txn_id)
        new = self.transactional(txn_id)  # same id: must fence `old`
        try:
            old.begin_transaction()
            old.produce(topic, value=b"zombie", partition=0)
            old.commit_transaction(TIMEOUT)
        except KafkaException as exc:
            error = exc.args[0]
            new.begin_transaction()
            new.produce(topic, value=b"new", partition=0)
            new.commit_transaction(TIMEOUT)
            values = [v.decode() for _, v in self.read_all(topic, **{"isolation.level": "read_committed"})]
            fenced = (
                error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
                or error.fatal()
            )
            return fenced and values == ["new"], f"zombie commit refused ({error.name()}); committed: {values}"
        values = [v.decode() for _, v in self.read_all(topic, **{"isolation.level": "read_committed"})]
        return False, f"zombie producer committed after being replaced; committed: {values}"

    def offsets_in_transaction(self) -> tuple[bool, str]:
        topic = self.topic("offsets")
        group = f"ordo-probe-{self.run_id}-txn-group"
        producer = self.transactional(f"ordo-probe-{self.run_id}-offsets")
        consumer = self.consumer(**{"group.id": group})
        try:
            producer.begin_transaction()
            producer.produce(topic, value=b"x", partition=0)
            producer.send_offsets_to_transaction(
                [TopicPartition(topic, 0, 42)], consumer.consumer_group_metadata(), TIMEOUT
            )
            producer.commit_transaction(TIMEOUT)
            committed = consumer.committed([TopicPartition(topic, 0)], timeout=TIMEOUT)[0].offset
        finally:
            consumer.close()
        return committed == 42, f"sent offset 42 for {group}; committed() returned {committed}"

    def commit_latency(self) -> tuple[bool, str]:
        topic = self.topic("latency")
        producer = self.transactional(f"ordo-probe-{self.run_id}-latency")
        whole, commit = [], []
        for i in range(20):
            start = time.perf_counter()
            producer.begin_transaction()
            producer.produce(topic, value=b"%d" % i, partition=0)
            _flush(producer)
            flushed = time.perf_counter()
            producer.commit_transaction(TIMEOUT)
            done = time.perf_counter()
            whole.append((done - start) * 1000)
            commit.append((done - flushed) * 1000)
        whole.sort(), commit.sort()
        return True, (
            f"20 one-record transactions: median {whole[10]:.1f} ms each (max {whole[-1]:.1f}), "
            f"of which commit_transaction {commit[10]:.1f} ms"
        )

    def max_message_size(self) -> tuple[bool, str]:
        topic = self.topic("size")
        try:
            self.producer().produce(topic, value=b"x" * 3_000_000, partition=0)
            default_client = "3 MB accepted by a default client"
        except KafkaException as exc:
            default_client = f"3 MB refused by a default client ({exc.args[0].name()}, client-side)"
        # Lift the client's own 1 MB limit so the broker's limit is what gets measured.
        producer = self.producer(**{"message.max.bytes": 64 << 20, "linger.ms": 0})
        accepted, refused = [], None
        for mib in (0.9, 1, 2, 4, 8, 16, 32):
            size = int(mib * (1 << 20))
            errors = []
            producer.produce(
                topic, value=b"x" * size, partition=0, on_delivery=lambda err, _msg: err and errors.append(err)
            )
            _flush(producer)
            if errors:
                refused = (mib, errors[0].name())
                break
            accepted.append(mib)
        read_back = self.read_all(
            topic,
            **{
                "fetch.max.bytes": 64 << 20,
                "max.partition.fetch.bytes": 64 << 20,
                "receive.message.max.bytes": 80 << 20,
            },
        )
        biggest = max((len(v) for _, v in read_back), default=0) / (1 << 20)
        limit = f"refused {refused[0]} MiB ({refused[1]})" if refused else "no limit up to 32 MiB"
        detail = (
            f"{default_client}; with the client limit raised, broker accepted up to "
            f"{accepted[-1] if accepted else 0} MiB, {limit}, read back {biggest:.0f} MiB "
            f"(Kafka refuses > 1 MiB by default)"
        )
        # Kafka refuses > ~1 MiB by default; a broker that accepts more is lenient, not wrong.
        return bool(refused) and refused[0] <= 2, detail

    def kafka_python(self) -> tuple[bool, str]:
        from kafka import KafkaConsumer, KafkaProducer
        from kafka import TopicPartition as KTopicPartition

        topic = self.topic("kafka-python")
        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap, request_timeout_ms=int(TIMEOUT * 1000), max_block_ms=int(TIMEOUT * 1000)
        )
        producer.send(topic, b"from-kafka-python", partition=0).get(TIMEOUT)
        producer.close(TIMEOUT)
        confluent_saw = [v for _, v in self.read_all(topic)]

        writer = self.producer()
        writer.produce(topic, value=b"from-confluent", partition=0)
        _flush(writer)
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=2000,
        )
        consumer.assign([KTopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        python_saw, deadline = [], time.monotonic() + TIMEOUT
        while len(python_saw) < 2 and time.monotonic() < deadline:
            python_saw += [m.value for m in consumer]
        consumer.close()
        ok = confluent_saw == [b"from-kafka-python"] and python_saw == [b"from-kafka-python", b"from-confluent"]
        return ok, f"kafka-python produce -> confluent read {confluent_saw}; mixed read by kafka-python {python_saw}"

    def auto_created(self) -> tuple[bool, str]:
        """A producer naming a topic that does not exist: Apache Kafka creates it with its
        default of 1 partition. A reader of an output topic that names it before the engine
        makes it gets the broker's layout instead of the engine's."""
        topic = f"ordo-probe-{self.run_id}-auto-created"
        producer = self.producer()
        producer.produce(topic, value=b"first")
        _flush(producer)
        metadata = self.admin.list_topics(topic, timeout=TIMEOUT).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return True, "not created by a producer naming it"
        count = len(metadata.partitions)
        return count == 1, f"created by a producer naming it, with {count} partition(s) (Kafka's default: 1)"


def _flush(producer: Producer) -> None:
    if producer.flush(TIMEOUT):
        raise TimeoutError(f"producer did not deliver within {TIMEOUT}s")


PROBES: list[tuple[str, Callable[[Probe], tuple[bool, str]]]] = [
    ("high watermark after a multi-record produce", Probe.watermark),
    ("aborted transaction hidden by read_committed", Probe.aborted_hidden),
    ("transactional fencing of a zombie producer", Probe.fencing),
    ("send_offsets_to_transaction -> committed()", Probe.offsets_in_transaction),
    ("transaction commit latency", Probe.commit_latency),
    ("largest message accepted", Probe.max_message_size),
    ("kafka-python interoperates", Probe.kafka_python),
    ("topic created by a producer naming it", Probe.auto_created),
]


def run(bootstrap: str, out=sys.stdout) -> dict[str, tuple[str, str]]:
    probe, results = Probe(bootstrap), {}
    print(f"broker probe of {bootstrap}", file=out, flush=True)
    for name, check in PROBES:
        try:
            ok, detail = check(probe)
            verdict = "OK" if ok else "QUIRK"
        except Exception as exc:  # a probe that cannot even run is a finding too
            verdict, detail = "QUIRK", f"failed: {type(exc).__name__}: {exc}"
        results[name] = (verdict, detail)
        print(f"{verdict:5}  {name}\n       {detail}", file=out, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ordo.broker.probe", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", metavar="HOST:PORT", help="broker to probe (default: start a local one)")
    args = parser.parse_args(argv)
    if args.bootstrap_servers:
        run(args.bootstrap_servers)
        return 0
    from ordo.broker.local import local_broker

    with local_broker() as broker:
        run(broker.bootstrap_servers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
