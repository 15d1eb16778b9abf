"""One transaction cannot stop its batch: a value too large for one change-data message
aborts the transaction that writes it, with the reason, under every scheduler and
partition count; a procedure that declares no keys runs on partition 0 and gets its
outcome on any partition count, under opchain too."""

from __future__ import annotations

import pytest

import tests.edge_procedures as edge
from ordo.client import Client
from ordo.testing import check_deterministic
from ordo.scheduler.execution import MAX_VALUE_BYTES, BadValue, stored_value
from ordo.broker.topics import ensure_topics
from ordo.storage.partitioning import Partitioner, place
from tests.helpers import ordo, stop


def test_value_limit_is_the_size_of_the_value_in_the_change_data():
    assert stored_value("x" * (MAX_VALUE_BYTES - 2)) == "x" * (MAX_VALUE_BYTES - 2)  # with its quotes
    with pytest.raises(BadValue, match=f"value too large: {MAX_VALUE_BYTES + 1} bytes"):
        stored_value("x" * (MAX_VALUE_BYTES - 1))
    with pytest.raises(BadValue, match="value too large"):
        stored_value("\x00" * (MAX_VALUE_BYTES // 6 + 1))  # each escapes to \u0000
    with pytest.raises(BadValue, match="value too large"):
        stored_value({f"field{i}": "y" * 10_000 for i in range(60)})  # a row of many medium fields
    with pytest.raises(BadValue, match="value too large"):
        stored_value([["z" * 1000] * 100] * 6)
    assert stored_value({f"field{i}": "y" * 1000 for i in range(60)})["field0"] == "y" * 1000


def test_a_transaction_without_keys_is_placed_on_partition_0():
    for partitions in (1, 2, 5):
        assert place(Partitioner(partitions), [], []) == ((0,), (0,))


def _requests() -> list[dict]:
    texts = ["a", "abort", "b", "c", "abort", "d", "e"]
    requests = [{"id": f"echo-{i}", "proc": "edge_echo", "args": {"text": t}} for i, t in enumerate(texts)]
    requests += [
        {"id": "fits", "proc": "edge_big_write", "args": {"key": 1, "size": 400_000}},
        {"id": "too-big", "proc": "edge_big_write", "args": {"key": 2, "size": 2_000_000}},
        {"id": "after", "proc": "edge_big_write", "args": {"key": 3, "size": 10}},
    ]
    return requests


def _expected(outcome: dict) -> bool:
    if outcome["id"] == "too-big":
        return outcome["status"] == "aborted" and "value too large" in outcome["error"]
    if outcome["id"].startswith("echo-") and outcome.get("error") == "asked to abort":
        return outcome["status"] == "aborted"
    return outcome["status"] == "committed"


def test_every_scheduler_and_partition_count_agrees_and_answers_every_request():
    requests = _requests()
    outcomes = check_deterministic(edge, requests, batch_size=4, partitions=(1, 2, 3))
    assert [o["id"] for o in outcomes] == [r["id"] for r in requests]
    assert all(map(_expected, outcomes)), outcomes
    assert [o["result"] for o in outcomes[:4]] == ["A", None, "B", "C"]


@pytest.mark.slow
def test_the_pipeline_on_two_partitions_answers_them_and_goes_on(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "d"),
        "--partitions",
        "2",
        "--scheduler",
        "opchain",
        "--quiet",
        "--procedures",
        "tests.edge_procedures",
    )
    try:
        requests = _requests()
        with Client(broker, namespace) as client:
            ids = client.submit(requests)
            found = client.collect(ids, timeout=180)
        assert engine.poll() is None, "the engine stopped"
        outcomes = [found[i][0] for i in ids if i in found]
        assert [o["id"] for o in outcomes] == ids, f"no outcome for {set(ids) - set(found)}"
        assert all(map(_expected, outcomes)), outcomes
    finally:
        assert stop(engine, 60) == 0
