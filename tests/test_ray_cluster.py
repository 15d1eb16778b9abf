"""Partition workers spread over a two-node Ray cluster (both nodes on this machine)."""

import os

import pytest

from ordo.procedures.workloads import micro
from tests.helpers import assert_same_as_reference, run_engine, sequence_requests

pytestmark = pytest.mark.slow


def test_workers_on_two_nodes_give_the_serial_result(broker, tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    from ordo.scheduler.ray_group import RayGroup
    from ordo.storage.layout import check_layout

    namespace = f"cluster-{os.getpid()}"
    requests = list(micro.generate(800, seed=31, partitions=2, keys=100, hot=3, mp=0.5))
    last_batch, reference = sequence_requests(broker, namespace, requests, max_txns=80)

    ray.shutdown()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"}
    )
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    try:
        ray.init(address=cluster.address)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        check_layout(str(tmp_path / "probe"), 2)
        group = RayGroup(str(tmp_path / "probe"), 2, "locking", address=cluster.address)
        try:
            nodes = {w["node"] for w in group.where()}
        finally:
            group.close()
        assert len(nodes) == 2, "workers were not placed on both nodes"
        outputs, state_digest = run_engine(
            broker, namespace, last_batch, tmp_path / "d", "locking", 2, runtime="ray", ray_address=cluster.address
        )
        assert_same_as_reference(outputs, state_digest, last_batch, reference)
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_local_ray_is_its_own_while_a_cluster_on_this_machine_is_noted_in_tmp_ray(fault_report):
    """A Ray cluster started on this machine (`ray start`, or another test run's cluster) is
    noted in /tmp/ray/ray_current_cluster; Ray joins it from any `ray.init()` without an
    address. The engine's local Ray must be its own: another worker's or user's cluster has
    other code, other cores, and goes away with its owner."""
    import subprocess
    import sys

    import ray
    from ray.cluster_utils import Cluster

    from tests.helpers import ROOT

    ray.shutdown()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"}
    )
    noted = cluster.address
    try:
        code = (
            "import ray; from ordo.scheduler.ray_group import start_ray; start_ray(); "
            "print(ray.get_runtime_context().gcs_address); ray.shutdown()"
        )
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        joined = done.stdout.strip().splitlines()[-1]
        assert noted and joined != noted, f"start_ray joined the cluster noted in /tmp/ray ({noted})"
    finally:
        cluster.shutdown()
    fault_report(
        f"a Ray cluster noted in /tmp/ray at {noted} while the engine started its local Ray: "
        f"it started its own at {joined}"
    )
