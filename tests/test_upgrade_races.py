"""Upgrades are serialised and true: of two `ordo upgrade`s made from the same set, the one
readers accept succeeds and the other fails in one line naming the winner; a sequencer whose
start raced an upgrade stops before it sequences anything; and no reader accepts a batch of
a set the log has moved away from."""

from __future__ import annotations

import pytest

import ordo.log.versions as versions
from ordo.broker.topics import Topics, ensure_topics
from ordo.embedded import SequencerThread
from ordo.log.records import LogCursor, encode_batch, encode_entry, encode_start, encode_upgrade
from ordo.log.versions import UpgradedAway, UpgradeRaced, current_set, upgrade
from ordo.procedures.fingerprint import set_id
from ordo.procedures.loading import load_registry, workload_specs
from ordo.sequencer.sequencer import Sequencer, SequencerConfig


def _registry(workloads: str):
    return load_registry(workload_specs(workloads))


def _log_at_v1(broker: str, namespace: str) -> None:
    """A namespace whose log names the set of the sl workload (its first sequencer named it)."""
    ensure_topics(broker, namespace)
    first = SequencerThread(broker, namespace, SequencerConfig(), tuple(workload_specs("sl"))).start()
    first.stop()
    first.sequencer.close()


def test_of_two_upgrades_from_the_same_set_the_second_fails_naming_the_winner(broker, namespace, monkeypatch):
    _log_at_v1(broker, namespace)
    log = Topics(namespace).log
    before = current_set(broker, log)
    assert before is not None and before.version == 1
    won = upgrade(broker, namespace, _registry("sl,micro"))
    assert won is not None and won.version == 2

    # The other one read the log before the winner's record landed.
    real = versions.current_set
    reads = []

    def as_read_before(bootstrap, topic, timeout=30.0, until=None):
        reads.append(until)
        return before if len(reads) == 1 else real(bootstrap, topic, timeout, until)

    monkeypatch.setattr(versions, "current_set", as_read_before)
    with pytest.raises(UpgradeRaced) as lost:
        upgrade(broker, namespace, _registry("sl,gs"))
    line = str(lost.value)
    assert "\n" not in line and f"at offset {won.offset}" in line and "another `ordo upgrade`" in line, line
    monkeypatch.setattr(versions, "current_set", real)
    now = current_set(broker, log)
    assert (now.version, now.identity, now.offset) == (2, won.identity, won.offset)  # the winner's, unchanged


def test_a_sequencer_whose_start_an_upgrade_overtook_stops_before_sequencing(broker, namespace, monkeypatch):
    """The upgrade lands after the sequencer's set check and before its start record."""
    _log_at_v1(broker, namespace)
    import ordo.sequencer.sequencer as sequencer_module

    real = sequencer_module.refuse_if_taken

    def an_upgrade_lands_meanwhile(*args, **kwargs):
        real(*args, **kwargs)
        upgrade(broker, namespace, _registry("sl,micro"))

    monkeypatch.setattr(sequencer_module, "refuse_if_taken", an_upgrade_lands_meanwhile)
    sequencer = Sequencer(broker, namespace, _registry("sl"), SequencerConfig())
    try:
        with pytest.raises(UpgradedAway) as stopped:
            sequencer.start()
    finally:
        sequencer.close()
    line = str(stopped.value)
    assert "\n" not in line and "moved to procedure set v2" in line and "stops before sequencing" in line, line


def test_readers_pass_over_a_batch_of_the_set_the_log_moved_away_from():
    sets = [{"procedures": {"p": str(n)}, "tables": {}, "format": 2} for n in range(2)]
    old, new = set_id(sets[0]), set_id(sets[1])
    cursor = LogCursor(namespace="ns")
    cursor.accept(encode_start("ns", None, "L", sets[0]), 0)
    entry = [encode_entry(["a", "p", {}])]
    assert cursor.accept(encode_batch(1, 0, 5, {0: (0, 1)}, entry, log_id="L", namespace="ns", procedures=old), 1)
    cursor.accept(encode_upgrade("ns", sets[1], 2, "L"), 2)
    cursor.accept(encode_start("ns", "L", "late", sets[0]), 3)  # a v1 sequencer that started as it moved
    stale = encode_batch(1, 3, 6, {0: (1, 2)}, entry, log_id="L", namespace="ns", procedures=old)
    assert cursor.accept(stale, 4) is None
    assert "after the log moved to v2" in cursor.unreported[-1][1]
    cursor.accept(encode_start("ns", "L", "v2", sets[1]), 5)
    fresh = encode_batch(1, 5, 7, {0: (1, 2)}, entry, log_id="L", namespace="ns", procedures=new)
    assert cursor.accept(fresh, 6).batch_id == 2
