"""A consumer that fetches nothing more although its partitions hold records past its
position is read on by a new consumer: the sequencer's requests consumer, after a broker restart
under load, was seen to stop there for good."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from ordo.client import Client
from ordo.procedures.workloads import sl
from ordo.broker.fetch_stall import EndWatch, FetchStall
from ordo.broker.clients import consumer_config, kafka_config
from ordo.sequencer.sequencer import Sequencer, SequencerConfig
from ordo.broker.topics import ensure_topics
from tests.test_sequencer_takeover import Running, accepted_log

P = ("t", 0)


def test_a_partition_is_stuck_once_its_position_holds_still_for_the_whole_time_with_records_past_it():
    stall = FetchStall(10.0)
    assert stall.stuck({P: 5}, {P: 9}, 0.0) == []
    assert stall.stuck({P: 5}, {P: 9}, 9.9) == []
    assert stall.stuck({P: 5}, {P: 9}, 10.0) == [P]
    assert stall.stuck({P: 5}, {P: 9}, 15.0) == []  # fetched again: as long again before the next time
    assert stall.stuck({P: 5}, {P: 9}, 20.0) == [P]


def test_progress_a_caught_up_partition_or_an_unknown_end_is_no_stall():
    stall = FetchStall(10.0)
    stall.stuck({P: 5}, {P: 9}, 0.0)
    assert stall.stuck({P: 6}, {P: 9}, 10.0) == []  # it moved: counted from now
    assert stall.stuck({P: 6}, {P: 9}, 19.0) == []
    assert stall.stuck({P: 8}, {P: 9}, 30.0) == []  # one past: a transaction marker may follow
    assert stall.stuck({P: 8}, {P: 9}, 45.0) == []
    assert stall.stuck({P: 8}, {}, 60.0) == []  # the broker did not say where it ends
    assert stall.stuck({P: -1001}, {P: 9}, 80.0) == []  # nothing fetched yet


def test_the_end_watch_asks_with_a_new_consumer_once_its_own_has_answered_nothing_for_a_while(broker, namespace):
    """A consumer stuck after a broker restart answers nothing, and the sequencer would then
    never see a stalled fetch; the first consumer here stands in for it."""

    class Stuck:
        def get_watermark_offsets(self, *args, **kwargs):
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

        def close(self) -> None:
            pass

    made = []

    def consumer():
        made.append(
            Stuck()
            if not made
            else Consumer(consumer_config(broker, {"group.id": f"{namespace}.ends", "enable.auto.commit": False}))
        )
        return made[-1]

    topic = f"{namespace}.requests"
    ensure_topics(broker, namespace)
    producer = Producer(kafka_config(broker, {}))
    for i in range(3):
        producer.produce(topic, value=b"r", partition=0)
    assert producer.flush(10) == 0
    watch = EndWatch(broker, 0.1, renew_after=0.5, consumer=consumer)
    try:
        watch.watch([(topic, 0)])
        deadline = time.monotonic() + 20
        while (topic, 0) not in watch.ends and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.ends.get((topic, 0)) == 3
        assert watch.renewed == 1 and len(made) == 2
    finally:
        watch.close()


@pytest.mark.slow
def test_a_sequencer_whose_requests_consumer_fetches_nothing_more_reads_on_with_a_new_one_and_sequences_every_request(
    broker, namespace, monkeypatch
):
    """Its requests partition paused (a consumer that fetches nothing, as after the broker
    restart seen), requests submitted then are sequenced once a new consumer reads on from
    its position. The pause is made on the sequencer's own thread, between two reads."""
    pause = threading.Event()
    paused = []
    look = Sequencer._take_new_partitions

    def pausing_first(self) -> None:
        if pause.is_set():
            pause.clear()
            self._consumer.pause([TopicPartition(self.topics.requests, 0)])
            paused.append(self._consumer)
        look(self)

    monkeypatch.setattr(Sequencer, "_take_new_partitions", pausing_first)
    ensure_topics(broker, namespace)
    requests = list(sl.generate(60, seed=31))
    engine = uuid.uuid4().hex
    running = Running(broker, namespace, SequencerConfig(), {"id": engine, "who": "the sequencer"})
    client = Client(broker, namespace)
    try:
        client.submit(requests[:30])
        counts, _ = accepted_log(broker, namespace, {r["id"] for r in requests[:30]})
        assert set(counts) == {r["id"] for r in requests[:30]}
        pause.set()
        while pause.is_set():
            time.sleep(0.01)
        client.submit(requests[30:])
        counts, _ = accepted_log(broker, namespace, {r["id"] for r in requests}, timeout=90)
    finally:
        client.close()
        running.sequencer.stop()
        running.thread.join(30)
    assert running.ended is None, running.ended
    assert set(counts) == {r["id"] for r in requests}
    assert max(counts.values()) == 1
    assert paused and running.sequencer._consumer is not paused[0]


def test_fetch_states_come_from_a_real_consumers_statistics_and_name_a_fetcher_stuck_with_its_broker_up(
    broker, namespace
):
    """The statistics of a consumer reading a real broker: its partition `active`, its broker
    `UP`. The same statistics with the partition held in `validate-epoch-wait` (where a
    fetcher was seen to stay after a broker restart) count as not fetching once that has
    lasted the time asked, and never while a broker is down (then the broker is away)."""
    import json

    from ordo.broker.fetch_states import FetchStates

    ensure_topics(broker, namespace)
    topic = f"{namespace}.requests"
    raw: list[str] = []
    states = FetchStates()

    def took(text: str) -> None:
        raw.append(text)
        states.took(text)

    consumer = Consumer(
        consumer_config(broker, {**states.settings(), "stats_cb": took, "group.id": f"states-{uuid.uuid4().hex}"})
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while "active" not in states.describe() and time.monotonic() < deadline:
            consumer.poll(0.5)
    finally:
        consumer.close()
    line = states.describe()
    assert f"{topic}[0] active leader" in line and " UP" in line, line
    assert states.inactive(time.monotonic() + 60, 10.0) == []

    stats = json.loads(raw[-1])
    stats["topics"][topic]["partitions"]["0"]["fetch_state"] = "validate-epoch-wait"
    stuck = FetchStates()
    stuck.took(json.dumps(stats))
    now = time.monotonic()
    assert stuck.inactive(now + 5, 10.0) == []
    assert stuck.inactive(now + 11, 10.0) == [(topic, 0)]
    assert "validate-epoch-wait" in stuck.describe()
    for about in stats["brokers"].values():
        about["state"] = "DOWN"
    stuck.took(json.dumps(stats))
    assert stuck.inactive(now + 60, 10.0) == []
