"""One log, many engine layouts: 1, 2 and 4 partitions, in-process or on Ray actors,
under every scheduler, must give the same outcomes, state digest and change data as
the plain serial interpretation of the log."""

import os

import pytest

from ordo.client import Client
from ordo.embedded import SequencerThread, read_log
from ordo.state import digest
from procedures.registry import default_registry
from procedures.workloads import micro, sl
from scheduler.base import available_schedulers
from scheduler.coordinator import Coordinator
from scheduler.outputs import CollectedOutputs
from scheduler.reference import SerialInterpreter
from sequencer.sequencer import SequencerConfig
from sequencer.topics import ensure_topics

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared_log(broker):
    """Multi-partition micro and sl traffic, with aborts and bad requests, sequenced once."""
    namespace = f"partitions-{os.getpid()}"
    ensure_topics(broker, namespace, request_partitions=2)
    requests = []
    for i, (a, b) in enumerate(zip(micro.generate(600, seed=21, partitions=4, keys=200, hot=4, mp=0.5),
                                   sl.generate(600, seed=22, records=50, theta=0.9))):
        requests += [a, b]
        if i % 97 == 0:
            requests.append({"id": f"bad-{i}", "proc": "micro_rmw", "args": {"keys": "nope"}})
            requests.append(dict(a))  # duplicate id
    client = Client(broker, namespace)
    client.submit(requests)
    client.close()
    sequencer = SequencerThread(broker, namespace, SequencerConfig(max_txns=97)).start()
    sequencer.wait_for(len(requests))
    last_batch = sequencer.sequencer.next_batch - 1
    sequencer.stop()
    reference = SerialInterpreter(default_registry()).apply(read_log(broker, namespace, last_batch))
    return namespace, last_batch, reference


def run_engine(broker, namespace, last_batch, data_dir, scheduler, partitions, runtime="local", **options):
    outputs = CollectedOutputs()
    coordinator = Coordinator(broker, namespace, str(data_dir), scheduler, partitions, runtime=runtime,
                              outputs=outputs, **options)
    coordinator.run(until_batch=last_batch)
    return outputs, digest(str(data_dir))


def assert_same_as_reference(outputs, state_digest, last_batch, reference):
    assert outputs.outcomes == reference.outcomes
    assert outputs.changes == reference.changes
    assert state_digest == (reference.digest(), last_batch)


@pytest.mark.parametrize("partitions", [1, 2, 4])
@pytest.mark.parametrize("scheduler", available_schedulers())
def test_every_layout_and_scheduler_gives_the_serial_result(broker, shared_log, tmp_path, scheduler, partitions):
    namespace, last_batch, reference = shared_log
    assert {o["status"] for o in reference.outcomes} == {"committed", "aborted", "rejected"}
    outputs, state_digest = run_engine(broker, namespace, last_batch, tmp_path / "d", scheduler, partitions)
    assert_same_as_reference(outputs, state_digest, last_batch, reference)


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from scheduler.ray_group import start_ray

    start_ray()
    yield
    ray.shutdown()


@pytest.mark.parametrize("scheduler", available_schedulers())
def test_ray_workers_give_the_serial_result(broker, shared_log, tmp_path, local_ray, scheduler):
    namespace, last_batch, reference = shared_log
    outputs, state_digest = run_engine(broker, namespace, last_batch, tmp_path / "d", scheduler, 2, runtime="ray")
    assert_same_as_reference(outputs, state_digest, last_batch, reference)


def test_each_ray_worker_runs_in_its_own_process_on_its_core(tmp_path, local_ray):
    from scheduler.ray_group import RayGroup
    from scheduler.worker import check_layout

    cores = sorted(os.sched_getaffinity(0))
    check_layout(str(tmp_path), 3)
    group = RayGroup(str(tmp_path), 3, "serial", cores=cores)
    try:
        placed = group.where()
    finally:
        group.close()
    assert [w["partition"] for w in placed] == [0, 1, 2]
    assert len({w["pid"] for w in placed} | {os.getpid()}) == 4
    assert [w["cores"] for w in placed] == [[cores[p % len(cores)]] for p in range(3)]
