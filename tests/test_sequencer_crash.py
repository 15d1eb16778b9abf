"""SIGKILL the sequencer mid-stream, again and again: every request still gets exactly
one outcome and enters the log exactly once. With two sequencers, they are killed in turn."""

import signal
import threading
import time
from collections import Counter

import pytest

from ordo.client import Client
from ordo.embedded import read_log
from ordo.procedures.workloads import sl
from ordo.broker.topics import ensure_topics
from tests.helpers import dump_state, interpret_log, ordo, read_results, reference_state, stop

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sequencers", [1, 2])
def test_sequencer_sigkill_loses_and_repeats_nothing(broker, namespace, tmp_path, sequencers):
    ensure_topics(broker, namespace, request_partitions=2)
    data_dir = str(tmp_path / "d")
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    engine = ordo("execute", *kafka, "--data-dir", data_dir, "--quiet")
    requests = list(sl.generate(6000, seed=5))
    client = Client(broker, namespace)

    def feed():
        for start in range(0, len(requests), 100):
            client.submit(requests[start : start + 100])
            time.sleep(0.05)

    def sequencer(index: int):
        return ordo(
            "sequence", *kafka, "--max-txns", "150", "--sequencers", str(sequencers), "--sequencer-index", str(index)
        )

    feeder = threading.Thread(target=feed)
    running = [sequencer(k) for k in range(sequencers)]
    feeder.start()
    kills = 0
    try:
        while feeder.is_alive() or kills < 3:
            time.sleep(0.7)
            victim = kills % sequencers
            running[victim].send_signal(signal.SIGKILL)
            running[victim].wait()
            kills += 1
            running[victim] = sequencer(victim)
        feeder.join()
        records = read_results(broker, f"{namespace}.results", len(requests), timeout=180)
    finally:
        for process in running:
            stop(process)
        stop(engine)
        client.close()
    assert kills >= 3
    per_id = Counter(record["id"] for record in records)
    assert set(per_id) == {r["id"] for r in requests}
    assert max(per_id.values()) == 1, [i for i, n in per_id.items() if n > 1][:5]
    assert {r["status"] for r in records} <= {"committed", "aborted"}  # no duplicate rejections

    last_batch = max(r["batch"] for r in records)
    in_log = Counter(entry[0] for batch in read_log(broker, namespace, last_batch) for entry in batch.entries)
    assert set(in_log) == set(per_id) and max(in_log.values()) == 1
    assert dump_state(data_dir) == reference_state(interpret_log(broker, namespace, last_batch))
