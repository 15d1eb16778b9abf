"""Stop `ordo run` and start it again on the same data directory and namespace with another
scheduler: it continues the log and ends in the state of one uninterrupted run."""

import pytest

from ordo.client import Client
from ordo.procedures.workloads import micro, sl
from ordo.broker.topics import ensure_topics
from tests.helpers import dump_state, interpret_log, ordo, read_results, reference_state, stop

pytestmark = pytest.mark.slow


def test_restart_with_another_scheduler_continues_the_log(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=2)
    data_dir = str(tmp_path / "d")
    requests = list(sl.generate(900, seed=41, records=40)) + list(micro.generate(900, seed=42, keys=50, hot=2))
    first, second, third = requests[:600], requests[600:1200], requests[1200:]
    client = Client(broker, namespace)
    seen = 0
    for scheduler, part in (("serial", first), ("vll", second), ("opchain", third)):
        engine = ordo(
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            data_dir,
            "--scheduler",
            scheduler,
            "--max-txns",
            "70",
            "--quiet",
        )
        try:
            client.submit(part)
            seen += len(part)
            records = read_results(broker, f"{namespace}.results", seen)
        finally:
            assert stop(engine) == 0
    client.close()
    outcomes = {r["id"]: r for r in records}
    assert len(records) == len(outcomes) == len(requests)
    last_batch = max(r["batch"] for r in records)
    reference = interpret_log(broker, namespace, last_batch)
    assert outcomes == {o["id"]: o for o in reference.outcomes}
    assert dump_state(data_dir) == reference_state(reference)
