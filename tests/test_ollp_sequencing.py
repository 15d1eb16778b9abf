"""The sequencer and re-sequenced dependent transactions: each step of one request enters
the log once; a step published again (a replay of the batch that produced it) is dropped
without an entry or an outcome, while a client's duplicate id is still rejected. Steps are
the engine's (signed, as `restart_request` makes them); a client's own "@ollp" is a
request like any other."""

import json

from ordo.client import Client
from ordo.embedded import SequencerThread, read_log
from ordo.procedures.ollp import OLLP_FIELD
from ordo.log.steps import restart_request
from ordo.sequencer.dedupe import RecentIds
from ordo.sequencer.sequencer import SequencerConfig
from ordo.broker.topics import ensure_topics


def _step(restarts: int, assumed: list) -> dict:
    """A step as the engine re-sequences it: signed."""
    return json.loads(
        restart_request(
            "t1",
            {
                "proc": "alias_deposit",
                "args": {"alias": "a", "amount": 3, OLLP_FIELD: {"restarts": restarts, "assumed": assumed}},
            },
        )
    )


def _plain(record: dict | None) -> dict | None:
    return None if record is None else {k: v for k, v in record.items() if k != "sig"}


def test_a_republished_step_is_dropped_and_a_client_duplicate_rejected(broker, namespace):
    ensure_topics(broker, namespace, request_partitions=1)
    first = {"id": "t1", "proc": "alias_deposit", "args": {"alias": "a", "amount": 3}}
    unsigned = {
        "id": "t1",
        "proc": "alias_deposit",
        "args": {"alias": "a", "amount": 3, OLLP_FIELD: {"restarts": 2, "assumed": [5]}},
    }
    requests = [first, _step(0, [None]), _step(0, [None]), _step(1, [4]), first, _step(1, [4]), unsigned]
    client = Client(broker, namespace)
    client.submit([(r["id"], json.dumps(r).encode()) for r in requests])
    client.close()
    sequencer = SequencerThread(broker, namespace, SequencerConfig(max_txns=2)).start()
    try:
        sequencer.wait_for(5)  # the two repeated steps never enter the log
        last = sequencer.sequencer.next_batch - 1
    finally:
        sequencer.stop()
    entries = [entry for batch in read_log(broker, namespace, last) for entry in batch.entries]
    assert [(e[0], e[1], _plain(e[2].get(OLLP_FIELD)) if isinstance(e[2], dict) else e[2]) for e in entries] == [
        ("t1", "alias_deposit", None),
        ("t1", "alias_deposit", {"restarts": 0, "assumed": [None]}),
        ("t1", "alias_deposit", {"restarts": 1, "assumed": [4]}),
        ("t1", None, "duplicate request id 't1'"),
        ("t1", None, "duplicate request id 't1'"),  # an unsigned "@ollp" is a client's request, not a step
    ]
    assert sequencer.sequencer.stats.requests == 5  # the dropped ones are not counted as requests

    # A restarted sequencer rebuilds the same memory from the log.
    memory = RecentIds(100)
    for batch in read_log(broker, namespace, last):
        memory.add_batch_entries(batch.entries)
    assert "t1" in memory and "t1\x000" in memory and "t1\x001" in memory and "t1\x002" not in memory
