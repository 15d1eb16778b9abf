"""When the sequencer cuts a batch: with Calvin's epochs at most one batch per epoch length
unless full (--max-delay-ms; with --min-delay-ms a length that follows the rate requests
arrive at, sequencer/epochs.py); with group commit (--max-delay-ms 0) as soon as the last
append returned, with every request that came meanwhile."""

from __future__ import annotations

import time

import pytest

from ordo.procedures.registry import default_registry
from ordo.sequencer.epochs import EpochLength
from ordo.sequencer.sequencer import Sequencer, SequencerConfig, _Epoch


@pytest.fixture
def sequencer_of():
    made = []

    def make(config: SequencerConfig) -> Sequencer:
        # Nothing here talks to a broker: the cut's timing alone is looked at.
        made.append(Sequencer("127.0.0.1:1", "batching", default_registry(), config))
        return made[-1]

    yield make
    for sequencer in made:
        sequencer.close()


def _epoch_opened_by_a_request_during_the_last_append(sequencer: Sequencer) -> tuple[_Epoch, float]:
    appended_at = time.monotonic()
    sequencer._last_cut_at = appended_at - 0.004  # the last batch was cut 4 ms ago and its append just returned
    epoch = _Epoch(entries=[b"request"])
    epoch.opened = sequencer._opening(appended_at)
    return epoch, appended_at


def test_group_commit_cuts_as_soon_as_the_last_append_returns(sequencer_of):
    sequencer = sequencer_of(SequencerConfig(max_delay_ms=0))
    epoch, appended_at = _epoch_opened_by_a_request_during_the_last_append(sequencer)
    assert sequencer._due(epoch, appended_at)
    assert not sequencer._due(_Epoch(), appended_at)  # nothing to cut


def test_by_default_one_partition_gets_short_epochs_and_several_calvin_epochs():
    assert SequencerConfig().epoch_ms == 2
    assert SequencerConfig(partitions=2).epoch_ms == 10
    assert SequencerConfig(5, partitions=1).epoch_ms == 5


def test_calvin_epochs_wait_for_the_epoch_to_end(sequencer_of):
    sequencer = sequencer_of(SequencerConfig(partitions=2))
    assert sequencer.config.epoch_ms == 10
    epoch, appended_at = _epoch_opened_by_a_request_during_the_last_append(sequencer)
    assert not sequencer._due(epoch, appended_at)
    assert not sequencer._due(epoch, appended_at + 0.006 - 1e-6)
    assert sequencer._due(epoch, appended_at + 0.006 + 1e-9)  # 10 ms after the last cut (past float rounding)


def _steady(epochs: EpochLength, rate: float, seconds: float, start: float = 0.0) -> float:
    """Feed `epochs` `rate` requests a second for `seconds`, one cut per epoch; the time at the end."""
    now, due = start, 0.0
    while now < start + seconds:
        step = epochs.seconds()
        now += step
        due += rate * step  # requests come one by one: an epoch takes those that arrived in it
        epochs.taken(int(due), now)
        due -= int(due)
    return now


@pytest.mark.parametrize(
    "rate, expected_ms",
    [(0, 2), (100, 2), (200, 2), (400, 4), (500, 5), (750, 7.5), (1_000, 10), (2_000, 10), (60_000, 10)],
)
def test_epochs_that_follow_the_rate_grow_with_it_to_their_longest(rate, expected_ms):
    epochs = SequencerConfig(partitions=2, min_delay_ms=2).epoch_length()
    _steady(epochs, rate, 3.0)
    assert epochs.seconds() * 1000 == pytest.approx(expected_ms, rel=0.1)


def test_epochs_shorten_within_a_second_once_the_load_is_gone_and_lengthen_as_it_comes_back():
    epochs = SequencerConfig(partitions=4, min_delay_ms=2).epoch_length()
    now = _steady(epochs, 3_000, 2.0)
    assert epochs.seconds() == pytest.approx(0.010)
    now += 5.0  # a quiet spell; then one request
    epochs.taken(1, now)
    assert epochs.seconds() == pytest.approx(0.002)
    _steady(epochs, 3_000, 1.0, now)
    assert epochs.seconds() == pytest.approx(0.010)


def test_epochs_stay_fixed_whatever_the_rate_unless_told_to_follow_it():
    fixed = (
        (SequencerConfig(), 2),
        (SequencerConfig(partitions=2), 10),
        (SequencerConfig(5, partitions=2), 5),
        (SequencerConfig(0, partitions=2), 0),
        (SequencerConfig(5, partitions=2, min_delay_ms=5), 5),  # no shorter than the longest
    )
    for config, ms in fixed:
        epochs = config.epoch_length()
        _steady(epochs, 50_000, 1.0) if ms else epochs.taken(1_000, 1.0)
        assert epochs.fixed and epochs.seconds() == ms / 1000


def test_the_sequencer_cuts_at_the_epoch_the_rate_sets(sequencer_of):
    sequencer = sequencer_of(SequencerConfig(partitions=2, min_delay_ms=2))
    epoch, appended_at = _epoch_opened_by_a_request_during_the_last_append(sequencer)
    assert sequencer._due(epoch, appended_at + 1e-9)  # idle so far: 2 ms epochs, and the last cut was 4 ms ago
    _steady(sequencer._epochs, 2_000, 2.0)
    epoch, appended_at = _epoch_opened_by_a_request_during_the_last_append(sequencer)
    assert not sequencer._due(epoch, appended_at)
    assert not sequencer._due(epoch, appended_at + 0.006 - 1e-6)
    assert sequencer._due(epoch, appended_at + 0.006 + 1e-9)  # under load: 10 ms after the last cut


@pytest.mark.parametrize("given", [(), ("--max-delay-ms", "6"), ("--min-delay-ms", "2"), ("--max-delay-ms", "0")])
def test_ordo_run_hands_its_epochs_to_the_sequencer_process_it_starts(given):
    from ordo.cli import _sequencer_config, build_parser
    from ordo.services import sequencer_command

    parser = build_parser()
    run = parser.parse_args(
        [
            "run",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--namespace",
            "ns",
            "--data-dir",
            "d",
            "--partitions",
            "2",
            *given,
        ]
    )
    config = _sequencer_config(run)
    command = sequencer_command("127.0.0.1:1", "ns", config)
    started = parser.parse_args(command[command.index("sequence") : command.index("--log-level")])
    assert _sequencer_config(started).epoch_length() == config.epoch_length()
    assert _sequencer_config(started).min_delay_ms == config.min_delay_ms
