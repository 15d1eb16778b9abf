"""How the local broker copes with a topic written in tiny producer batches, and how much
batching on the producer side helps: `python -m ordo.benchmarks.tiny_batches`.

For each way of producing N small records to a fresh topic it prints the time to produce,
the number of producer batches the broker stored (its high watermark counts batches, see
docs/local-broker.md), and the time a consumer takes to read the topic back from its
beginning, with the longest wait for one fetch. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ordo.broker.clients import REQUEST_BATCHING, consumer_config, kafka_config

VALUE = b'{"id":"r-000000","proc":"micro_rmw","args":{"keys":[1,2,3,4,5,6,7,8,9,10]}}'


def produce(bootstrap: str, topic: str, count: int, flush_every: int | None, settings: dict) -> float:
    producer = Producer(kafka_config(bootstrap, {"enable.idempotence": True, **settings}))
    start = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, key=str(i).encode(), value=VALUE)
                break
            except BufferError:
                producer.poll(0.01)
        if flush_every and (i + 1) % flush_every == 0:
            producer.flush(30)
    producer.flush(60)
    return time.perf_counter() - start


def read_back(
    bootstrap: str, topic: str, count: int, timeout: float, offset: int = OFFSET_BEGINNING
) -> tuple[float, float, int]:
    """(seconds to read `count` records from `offset` or the timeout, longest gap between
    fetches that returned records, records read)."""
    consumer = Consumer(
        consumer_config(bootstrap, {"group.id": f"tiny-{uuid.uuid4().hex}", "enable.auto.commit": False})
    )
    consumer.assign([TopicPartition(topic, 0, offset)])
    start = last = time.perf_counter()
    read, longest = 0, 0.0
    try:
        while read < count and time.perf_counter() - start < timeout:
            messages = consumer.consume(10_000, 0.5)
            got = sum(1 for m in messages if m.error() is None)
            if got:
                now = time.perf_counter()
                longest = max(longest, now - last)
                last = now
                read += got
        return time.perf_counter() - start, longest, read
    finally:
        consumer.close()


def watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer(kafka_config(bootstrap, {"group.id": f"tiny-{uuid.uuid4().hex}"}))
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
    finally:
        consumer.close()


WAYS = {
    "10 per produce request (flush every 10)": (10, {"linger.ms": 0}),
    "100 per produce request (flush every 100)": (100, {"linger.ms": 0}),
    "one producer sending as fast as it can, librdkafka defaults (linger 5 ms)": (None, {}),
    "Ordo's request producers (REQUEST_BATCHING: linger 20 ms, up to 10,000 per batch)": (None, REQUEST_BATCHING),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="a broker to measure (default: a fresh local broker)")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed to read a topic back")
    args = parser.parse_args()
    if args.bootstrap_servers:
        run(args.bootstrap_servers, args.count, args.timeout)
        return
    from ordo.broker.local import local_broker

    with local_broker() as broker:
        run(broker.bootstrap_servers, args.count, args.timeout)


def run(bootstrap: str, count: int, timeout: float) -> None:
    admin = AdminClient(kafka_config(bootstrap))
    print(f"{count:,} records of {len(VALUE)} bytes per way, read back with Ordo's consumer settings")
    for name, (flush_every, settings) in WAYS.items():
        topic = f"tiny-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
        produced = produce(bootstrap, topic, count, flush_every, settings)
        high = watermark(bootstrap, topic)
        seconds, longest, read = read_back(bootstrap, topic, count, timeout)
        done = "all" if read >= count else f"only {read:,} (timed out)"
        tail_seconds, _, tail_read = read_back(bootstrap, topic, 1000, timeout, count - 1000)
        print(
            f"- {name}: produced in {produced:.1f} s, high watermark {high:,}; read back {done} in "
            f"{seconds:.1f} s ({read / seconds:,.0f}/s), longest wait for a fetch {longest:.2f} s; "
            f"the last 1,000 in {tail_seconds:.1f} s" + ("" if tail_read >= 1000 else " (timed out)")
        )


if __name__ == "__main__":
    main()
