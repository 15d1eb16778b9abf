"""Ray started by Ordo on one machine listens on 127.0.0.1 only.

Ray binds its servers (GCS, raylet, object manager, the core worker in every worker and
in the driver, the runtime-env agent) to the node's address. Asked for 127.0.0.1, Ray on
Linux replaces it by the machine's outward address so that other machines could join,
and its servers then listen on every interface. Ray's own switch for a machine-local
node (the one it uses on macOS and Windows) keeps 127.0.0.1: Ordo turns it on when it
starts Ray itself. With `--ray-address` Ordo joins a cluster, and the cluster's owner
decides where it listens.
"""

from __future__ import annotations

import os
import sys

LOOPBACK = "127.0.0.1"
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": no multi-machine cluster, node on loopback


def keep_node_address_on_loopback() -> None:
    """For this process (which starts Ray's processes with the node address it resolves)
    and, through the environment, for every Ray process it starts."""
    from ray._private import ray_constants

    os.environ[LOCAL_ONLY_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import time; ray is imported already


def check_node_address(address: str, stream=None) -> None:
    """One line if Ray ended up elsewhere (a Ray version that resolves the address some
    other way): then it listens beyond this machine."""
    if address != LOOPBACK:
        print(
            f"warning: Ray's node address is {address}, not {LOOPBACK}: Ray listens beyond this machine "
            f"(run Ray yourself and pass --ray-address to decide where)",
            file=stream or sys.stderr,
            flush=True,
        )
