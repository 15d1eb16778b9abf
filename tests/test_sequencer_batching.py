"""When the sequencer cuts a batch: with Calvin's epochs (the default, --max-delay-ms 10)
at most one batch per epoch length unless full; with group commit (--max-delay-ms 0) as
soon as the last append returned, with every request that came meanwhile."""

from __future__ import annotations

import time

import pytest

from ordo.procedures.registry import default_registry
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
    assert sequencer._due(epoch, appended_at + 0.006)  # 10 ms after the last cut
