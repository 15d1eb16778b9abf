from ordo.scheduler.stalled_outputs import StallWatch


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
