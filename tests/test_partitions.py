"""One log, many engine layouts: 1, 2 and 4 partitions, in-process or on Ray actors,
under every scheduler, must give the same outcomes, state digest and change data as
the plain serial interpretation of the log."""

import os

import pytest

from ordo.procedures.workloads import micro, sl
from ordo.scheduler.base import available_schedulers
from tests.helpers import assert_same_as_reference, run_engine, sequence_requests

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared_log(broker):
    """Multi-partition micro and sl traffic, with aborts and bad requests, sequenced once."""
    namespace = f"partitions-{os.getpid()}"
    requests = []
    for i, (a, b) in enumerate(
        zip(
            micro.generate(600, seed=21, partitions=4, keys=200, hot=4, mp=0.5),
            sl.generate(600, seed=22, records=50, theta=0.9),
        )
    ):
        requests += [a, b]
        if i % 97 == 0:
            requests.append({"id": f"bad-{i}", "proc": "micro_rmw", "args": {"keys": "nope"}})
            requests.append(dict(a))  # duplicate id
    # Routed for 2 partitions: the 2-partition runs take their slices from the routing, the
    # others place every entry themselves.
    last_batch, reference = sequence_requests(broker, namespace, requests, max_txns=97, partitions=2)
    return namespace, last_batch, reference


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

    from ordo.scheduler.ray_group import start_ray

    start_ray()
    yield
    ray.shutdown()


@pytest.mark.parametrize("scheduler", available_schedulers())
def test_ray_workers_give_the_serial_result(broker, shared_log, tmp_path, local_ray, scheduler):
    namespace, last_batch, reference = shared_log
    outputs, state_digest = run_engine(broker, namespace, last_batch, tmp_path / "d", scheduler, 2, runtime="ray")
    assert_same_as_reference(outputs, state_digest, last_batch, reference)


def test_each_ray_worker_runs_in_its_own_process_on_its_core(tmp_path, local_ray):
    from ordo.scheduler.ray_group import RayGroup
    from ordo.storage.layout import check_layout

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
    # As urgent as the broker and the sequencer they keep pace with (Ray's default is 15).
    assert [w["nice"] for w in placed] == [os.getpriority(os.PRIO_PROCESS, 0)] * 3
