"""Several sequencers share the request partitions and append to one log: every request
enters the log once, whichever sequencer takes it, across restarts and a change of the
sequencer count; and every scheduler, at any partition count, executes the merged log to
the state, outcomes and change data of a serial run in log order."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from ordo.client import Client
from ordo.embedded import SequencerThread, read_log
from ordo.procedures.workloads import micro, sl
from ordo.broker.tansu import TansuBroker
from ordo.sequencer.sequencer import SequencerConfig
from ordo.broker.topics import ensure_topics
from tests.helpers import (
    assert_same_as_reference,
    dump_state,
    interpret_log,
    ordo,
    read_results,
    reference_state,
    run_engine,
    stop,
)

pytestmark = pytest.mark.slow

REQUEST_PARTITIONS = 4


def start_sequencers(broker: str, namespace: str, config: SequencerConfig) -> list[SequencerThread]:
    return [SequencerThread(broker, namespace, replace(config, index=k)).start() for k in range(config.sequencers)]


def wait_for(sequencers: list[SequencerThread], requests: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(s.sequencer.stats.sequenced for s in sequencers) < requests:
        assert time.monotonic() < deadline, [s.sequencer.stats.sequenced for s in sequencers]
        time.sleep(0.02)


def stop_all(sequencers: list[SequencerThread]) -> None:
    for sequencer in sequencers:
        sequencer.stop()


def mixed_requests(count: int, seed: int, partitions: int) -> list[dict]:
    requests = []
    for a, b in zip(
        micro.generate(count, seed=seed, partitions=partitions, keys=60, hot=4, mp=0.5),
        sl.generate(count, seed=seed + 1, records=30),
    ):
        requests += [a, b]
    return requests


def sequenced_ids(batches) -> list[str]:
    return [request_id for batch in batches for request_id, proc, _ in batch.entries if proc is not None]


def test_two_sequencers_make_one_log_that_every_scheduler_executes_alike(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=REQUEST_PARTITIONS)
    requests = mixed_requests(150, seed=11, partitions=3)
    client = Client(broker, namespace)
    client.submit(requests)
    client.close()
    sequencers = start_sequencers(broker, namespace, SequencerConfig(max_txns=16, partitions=3, sequencers=2))
    wait_for(sequencers, len(requests))
    last_batch = sum(s.sequencer.next_epoch - 1 for s in sequencers)
    stop_all(sequencers)

    batches = read_log(broker, namespace, last_batch)
    assert [b.batch_id for b in batches] == list(range(1, last_batch + 1))
    assert {b.sequencer for b in batches} == {0, 1}
    for batch in batches:  # each sequencer consumed only its own request partitions
        assert all(int(p) % 2 == batch.sequencer for p in batch.offsets)
    assert sorted(sequenced_ids(batches)) == sorted(r["id"] for r in requests)
    times = [b.time_ms for b in batches]
    assert times == sorted(times)

    reference = interpret_log(broker, namespace, last_batch)
    for scheduler, partitions in (("serial", 1), ("locking", 3), ("vll", 3), ("opchain", 3)):
        outputs, state = run_engine(
            broker, namespace, last_batch, tmp_path / f"{scheduler}-{partitions}", scheduler, partitions
        )
        assert_same_as_reference(outputs, state, last_batch, reference)


def test_a_restarted_sequencer_resumes_its_own_lane_from_its_snapshot(broker, namespace):
    ensure_topics(broker, namespace, request_partitions=REQUEST_PARTITIONS)
    config = SequencerConfig(max_txns=2, dedupe_window=20, sequencers=2)
    client = Client(broker, namespace)
    sequencers = start_sequencers(broker, namespace, config)
    expected: list[str] = []
    for round_ in range(3):
        requests = mixed_requests(30, seed=round_, partitions=1)
        for r in requests:
            r["id"] = f"{round_}-{r['id']}"
        client.submit(requests)
        expected += [r["id"] for r in requests]
        wait_for(sequencers, len(requests))
        sequencers[1].stop()  # sequencer 1 goes; a new generation of it takes over its lane
        for s in sequencers:
            s.sequencer.stats.sequenced = 0
        sequencers[1] = SequencerThread(broker, namespace, replace(config, index=1)).start()
    # A copy of a recent request is rejected by the sequencer that takes it, after restarts too.
    client.submit(
        [
            {
                "id": expected[-1],
                "proc": "sl_deposit",
                "args": {"account": 1, "asset": 0, "account_amount": 1, "asset_amount": 1},
            }
        ]
    )
    wait_for(sequencers, 1)
    restarted = sequencers[1].sequencer
    last_batch = sum(s.sequencer.next_epoch - 1 for s in sequencers)
    stop_all(sequencers)
    client.close()

    batches = read_log(broker, namespace, last_batch)
    assert sorted(sequenced_ids(batches)) == sorted(expected)
    last = batches[-1].entries[-1]
    assert last[0] == expected[-1] and last[1] is None and "duplicate request id" in last[2]
    # The fourth generation of sequencer 1 read back to the third one's start-up snapshot (a
    # round's worth of its lane is more than the dedupe window), not to the head: about a third
    # of the log's records (a batch and its transaction marker each) instead of all of them.
    assert restarted.stats.startup_records < last_batch


def test_from_one_sequencer_to_two_nothing_is_lost_or_repeated(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=REQUEST_PARTITIONS)
    client = Client(broker, namespace)
    first = mixed_requests(40, seed=3, partitions=2)
    client.submit(first)
    one = start_sequencers(broker, namespace, SequencerConfig(max_txns=8, partitions=2))
    wait_for(one, len(first))
    stop_all(one)
    second = [{**r, "id": f"b-{r['id']}"} for r in mixed_requests(40, seed=4, partitions=2)]
    client.submit(second)
    client.close()
    two = start_sequencers(broker, namespace, SequencerConfig(max_txns=8, partitions=2, sequencers=2))
    wait_for(two, len(second))
    last_batch = one[0].sequencer.next_epoch - 1 + sum(s.sequencer.next_epoch - 1 for s in two)
    stop_all(two)

    batches = read_log(broker, namespace, last_batch)
    assert sorted(sequenced_ids(batches)) == sorted(r["id"] for r in first + second)
    reference = interpret_log(broker, namespace, last_batch)
    outputs, state = run_engine(broker, namespace, last_batch, tmp_path / "vll", "vll", 2)
    assert_same_as_reference(outputs, state, last_batch, reference)


def test_ordo_run_with_two_sequencers_serves_a_client(broker, namespace, tmp_path):
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path),
        "--sequencers",
        "2",
        "--request-partitions",
        "4",
        "--runtime",
        "local",
        "--quiet",
    )
    try:
        client = Client(broker, namespace)
        requests = [
            {
                "id": f"d{i}",
                "proc": "sl_deposit",
                "args": {"account": i % 7, "asset": 0, "account_amount": 1, "asset_amount": 1},
            }
            for i in range(60)
        ]
        client.submit(requests)
        client.close()
        results = read_results(broker, f"{namespace}.results", len(requests))
    finally:
        assert stop(engine) == 0
    assert sorted(r["id"] for r in results) == sorted(r["id"] for r in requests)
    assert all(r["status"] == "committed" for r in results)
    reference = interpret_log(broker, namespace, max(r["batch"] for r in results))
    assert {o["id"]: o for o in reference.outcomes} == {r["id"]: r for r in results}
    assert dump_state(str(tmp_path)) == reference_state(reference)


def test_more_sequencers_than_request_partitions_is_refused_with_one_line(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=1)
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path),
        "--sequencers",
        "2",
        "--runtime",
        "local",
        "--quiet",
        stderr=-1,
        text=True,
    )
    _, err = engine.communicate(timeout=120)
    assert engine.returncode == 2
    assert "2 sequencers need at least 2 partitions of" in err and "Traceback" not in err, err


def test_two_busy_sequencers_on_the_local_broker_sequence_every_request_once(monkeypatch, tmp_path):
    """Two busy sequencers cutting one-request batches into one log on the local broker:
    every request enters the log once, and the broker never finds a transaction ended twice
    (it can keep a transaction that ended at the same moment as another producer's on one
    partition as still open, which stops read_committed readers; sequencers append without
    transactions, so none of theirs can)."""
    monkeypatch.setenv("RUST_LOG", "warn")
    log_path = tmp_path / "broker.log"
    with TansuBroker(log_path=str(log_path)) as own:
        bootstrap, namespace = own.bootstrap_servers, "turns"
        ensure_topics(bootstrap, namespace, request_partitions=2)
        sequencers = start_sequencers(bootstrap, namespace, SequencerConfig(max_txns=1, sequencers=2))
        requests = list(micro.generate(400, seed=5, partitions=1, keys=50, hot=4, mp=0))
        client = Client(bootstrap, namespace)
        client.submit(requests)
        client.close()
        wait_for(sequencers, len(requests))
        assert all(s.sequencer.stats.batches > 50 for s in sequencers)  # both were busy
        last_batch = sum(s.sequencer.next_epoch - 1 for s in sequencers)
        stop_all(sequencers)
        batches = read_log(bootstrap, namespace, last_batch, timeout=30)
    assert sorted(sequenced_ids(batches)) == sorted(r["id"] for r in requests)
    # The warning of a transaction found committed by another's commit before its own ended.
    # (Its `Some(Begin)` form is not counted: by the broker's code it is logged by a first try
    # of an update on a stale copy of its books, which the broker then redoes, and the runs
    # with it logged went on unharmed.)
    ended_twice = [
        line for line in log_path.read_text(errors="replace").splitlines() if "otherwise=Some(Committed)" in line
    ]
    assert ended_twice == []
