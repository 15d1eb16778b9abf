"""A data directory's layout: one RocksDB shard per partition (`shard-P`) and `ordo.json`,
which names the namespace and the partition count the shards were laid out for, and whether
the directory is an engine's own: one whose engine publishes its outputs to the namespace's
topics, as opposed to a rebuild beside the live engine that publishes nothing."""

from __future__ import annotations

import json
import os

LAYOUT_FILE = "ordo.json"


def shard_path(data_dir: str, partition: int) -> str:
    return os.path.join(data_dir, f"shard-{partition}")


class DataDirError(RuntimeError):
    """A data directory that cannot be used: says which and why."""


def prepare_data_dir(data_dir: str) -> None:
    """Create the data directory if it is missing and make sure it can be written, so that
    a path that is a file, a read-only disk or a full one is one line before anything starts."""
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise DataDirError(f"data directory {data_dir} is a file, not a directory: name a directory")
    probe = os.path.join(data_dir, ".ordo-write-check")
    try:
        os.makedirs(data_dir, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise DataDirError(f"data directory {data_dir} cannot be written: {exc.strerror or exc}") from None


def check_layout(data_dir: str, partitions: int, namespace: str | None = None) -> None:
    """A data directory holds one namespace's state, laid out for one partition count; say
    so rather than mix. A layout written before namespaces were recorded adopts the first
    one it runs with."""
    prepare_data_dir(data_dir)
    path = os.path.join(data_dir, LAYOUT_FILE)
    layout = {}
    if os.path.exists(path):
        with open(path) as f:
            layout = json.load(f)
        existing = layout["partitions"]
        if existing != partitions:
            raise ValueError(
                f"{data_dir} holds {existing} partition(s), not {partitions}: use --partitions {existing} "
                "or a new data directory (the log rebuilds any layout from scratch)"
            )
        recorded = layout.get("namespace")
        if namespace is None or recorded == namespace:
            return
        if recorded is not None:
            raise ValueError(
                f"{data_dir} holds the state of namespace '{recorded}', not '{namespace}': use "
                f"--namespace {recorded} or a new data directory"
            )
    layout.update({"partitions": partitions, **({"namespace": namespace} if namespace is not None else {})})
    with open(path, "w") as f:
        json.dump(layout, f)


def layout_partitions(data_dir: str) -> int:
    path = os.path.join(data_dir, LAYOUT_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{data_dir} is not an Ordo data directory (no {LAYOUT_FILE})")
    with open(path) as f:
        return json.load(f)["partitions"]


PUBLISHES = "publishes"  # the layout's key: True for an engine's own data directory


def publishes(data_dir: str) -> bool:
    """Whether `data_dir` is an engine's own: laid out by an engine that published its
    outputs. A directory laid out before this was recorded is taken as one (its engine
    published), a missing one is not."""
    path = os.path.join(data_dir, LAYOUT_FILE)
    if not os.path.exists(path):
        return False
    with open(path) as f:
        return bool(json.load(f).get(PUBLISHES, True))


def mark_publishing(data_dir: str, publishing: bool) -> None:
    """Record whether the engine that opened `data_dir` (laid out already) publishes."""
    path = os.path.join(data_dir, LAYOUT_FILE)
    with open(path) as f:
        layout = json.load(f)
    if layout.get(PUBLISHES) == publishing:
        return
    layout[PUBLISHES] = publishing
    temporary = path + ".writing"
    with open(temporary, "w") as f:
        json.dump(layout, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
