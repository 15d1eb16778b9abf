import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from ordo.broker.clients import kafka_config
from ordo.broker.topics import ensure_topics
from ordo.scheduler import stalled_outputs
from ordo.scheduler.stalled_outputs import StallWatch, TailsUnread, written_since


def _watch(answers: list[bool]) -> StallWatch:
    watch = StallWatch(30.0, lambda: answers[0])
    watch.progress(0, 0.0)
    return watch


def _first_stall(watch: StallWatch, count_at, until: float, t: float = 0.0) -> float | None:
    while t <= until:
        if watch.stalled(count_at(t), t):
            return t
        t += 1.0
    return None


def _quiet(watch: StallWatch, t: float, until: float) -> float:
    """No stall from `t` to `until`, nothing acknowledged; returns `until`."""
    while t < until:
        assert not watch.stalled(0, t)
        t += 1
    return t


def test_a_stall_counts_only_while_the_broker_answers():
    """Away for 40 s, then answering: acknowledgements that stopped with the broker are an
    outage; the producer is stalled only once the broker has answered 30 s with nothing
    acknowledged."""
    answers = [False]
    watch = _watch(answers)
    t = _quiet(watch, 0.0, 40)
    answers[0] = True
    stalled = _first_stall(watch, lambda _: 0, 200, t)
    assert stalled is not None and 40 + 30 <= stalled <= 40 + 30 + watch.look_every


def test_an_acknowledgement_starts_the_count_again():
    answers = [True]
    watch = _watch(answers)
    stalled = _first_stall(watch, lambda t: 0 if t < 25 else 1, 200)
    assert stalled is not None and stalled >= 25 + 30


def test_a_broker_that_goes_away_in_between_starts_the_count_again():
    answers = [True]
    watch = _watch(answers)
    t = _quiet(watch, 0.0, 20)
    answers[0] = False
    t = _quiet(watch, t, 30)
    answers[0] = True
    t = _quiet(watch, t, 55)
    while not watch.stalled(0, t):
        t += 1
    assert 60 <= t <= 60 + watch.look_every


def test_the_broker_is_asked_only_every_few_seconds():
    asked = []
    watch = StallWatch(30.0, lambda: asked.append(1) or True)
    watch.progress(0, 0.0)
    for tenth in range(0, 200):
        watch.stalled(0, tenth / 10)
    assert len(asked) <= 20 / watch.look_every


def _answering_first(monkeypatch, code: int) -> list[int]:
    """The broker's first answer to a read-back is `code`; every later one is its own.
    Returns the list of read-backs made, one entry each."""
    read, calls = stalled_outputs._read_since, []

    def read_since(*args):
        calls.append(args)
        if len(calls) == 1:
            raise KafkaException(KafkaError(code))
        return read(*args)

    monkeypatch.setattr(stalled_outputs, "_read_since", read_since)
    return calls


def _written(broker: str, namespace: str) -> tuple[str, int, set[tuple[str, bytes, bytes]]]:
    topic = ensure_topics(broker, namespace).results
    since_ms = int(time.time() * 1000)
    producer = Producer(kafka_config(broker))
    for i in range(3):
        producer.produce(topic, key=f"r-{i}".encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0
    return topic, since_ms, {(topic, f"r-{i}".encode(), f"v{i}".encode()) for i in range(3)}


@pytest.mark.parametrize(
    "code",
    [KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.FENCED_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION],
    ids=["watermark-behind", "fenced-epoch", "not-leader"],
)
def test_a_read_back_that_meets_a_leader_change_asks_again(broker, namespace, monkeypatch, code):
    """What a partition answers while its leader moves (a new leader whose high watermark
    has not caught up answers OFFSET_NOT_AVAILABLE) is asked again: taken as a failed
    read-back, every unacknowledged output would go again as a copy."""
    topic, since_ms, written = _written(broker, namespace)
    calls = _answering_first(monkeypatch, code)
    assert written_since(broker, [topic], since_ms, 30) == written
    assert len(calls) == 2


def test_a_read_back_refused_for_good_is_said_at_once(broker, namespace, monkeypatch):
    topic, since_ms, _ = _written(broker, namespace)
    calls = _answering_first(monkeypatch, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(TailsUnread):
        written_since(broker, [topic], since_ms, 30)
    assert len(calls) == 1
