"""Change data keyed by what it is: a namespace executed at 2 partitions on Ray and rebuilt
with `ordo recover` at 1, 3 and 2 partitions into the same <ns>.changes publishes the same
records under the same keys, so what a consumer keeping the last record per key holds is
the same after every rebuild, and equal to the change data of the log's serial reading."""

from __future__ import annotations

import json

from ordo.client import Client
from ordo.reading import Change, WholeBatches

from tests.helpers import mixed_log, ordo_output, topic_reader


def _last_per_key(bootstrap: str, topic: str) -> dict[bytes, bytes]:
    """What a compacting consumer holds: the last record of every key."""
    consumer = topic_reader(bootstrap, topic, consumer_timeout_ms=3000)
    held = {message.key: message.value for message in consumer}
    consumer.close()
    return held


def _comparable(changes) -> list[tuple]:
    """(batch, txn, table, key, value) of the client's `Change`s, keys and values as JSON
    (a composite key is a tuple in the serial reading, a list once read back)."""
    return sorted((c.batch, c.txn, c.table, json.dumps(c.key), json.dumps(c.value)) for c in changes)


def _rebuild(bootstrap: str, namespace: str, data_dir, partitions: int) -> None:
    ordo_output(
        "recover",
        "--bootstrap-servers",
        bootstrap,
        "--namespace",
        namespace,
        "--data-dir",
        str(data_dir),
        "--partitions",
        str(partitions),
        "--scheduler",
        "locking",
        "--idle",
        "0",
        "--quiet",
        "--publish",  # every layout publishes the same records under the same keys
        timeout=600,
    )


def test_every_partition_count_publishes_the_same_change_data_under_the_same_keys(
    broker, namespace, tmp_path, fault_report
):
    # Half the micro transactions span both partitions of a 2-partition layout.
    last_batch, reference = mixed_log(broker, namespace, 150, seed=9, partitions=2, max_txns=40)
    expected = _comparable(Change(*change) for change in reference.changes)
    assert any(len({c[1] for c in reference.changes if c[0] == b}) > 1 for b in range(1, last_batch + 1))
    topic = f"{namespace}.changes"

    _rebuild(broker, namespace, tmp_path / "two", 2)
    first = _last_per_key(broker, topic)
    client = Client(broker, namespace)
    try:
        read = _comparable(client.read_changes(idle=5))
    finally:
        client.close()
    assert read == expected

    whole = WholeBatches()
    assembled = [change for value in first.values() for change in whole.add(value)]
    assert _comparable(assembled) == expected
    batches = {json.loads(value)["batch"]: json.loads(value)["txns"] for value in first.values()}
    assert sorted(batches) == list(range(1, last_batch + 1))
    assert len(first) == sum(batches.values())  # one record per transaction, none split

    for partitions in (1, 3, 2):
        _rebuild(broker, namespace, tmp_path / f"rebuilt-{partitions}", partitions)
        held = _last_per_key(broker, topic)
        assert held.keys() == first.keys(), f"rebuilt at {partitions}: keys differ"
        assert held == first, f"rebuilt at {partitions}: a key holds other change data"
    fault_report(
        f"{last_batch} batches executed at 2 partitions (Ray), rebuilt into the same {topic} at 1, 3 "
        f"and 2: the {len(first)} records a last-per-key consumer holds identical after each, "
        f"and their {len(expected)} changes those of the serial reading"
    )
