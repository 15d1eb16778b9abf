"""YCSB-T as Styx measures it: `ycsbt_transfer(a, b)` reads a and writes a - 1, reads b and
writes b + 1. Every value starts at 1,000,000 (the table's default: no load phase), keys
are drawn uniformly, and key k lies on partition k % P (the table partitions modulo), so
the generator can make a chosen share of transfers span two partitions.

This is the form with ANALYZE. The same procedure without it, routed by its home key `a`,
is examples/ycsbt.py: aria finds its keys by running it within a batch, the log-order
schedulers by a turn of its own in the log (docs/procedures.md compares them).
"""

from __future__ import annotations

import random
from typing import Iterator

from ordo.procedures.args import Int
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.workloads.sampling import request

START = 1_000_000
TABLES = [Table("ycsbt", default=START, partitioner="modulo")]
ARGS = {"a": Int(0), "b": Int(0)}


def transfer(ctx, args):
    """RUN, shared by both forms."""
    a, b = args["a"], args["b"]
    ctx.write("ycsbt", a, ctx.read("ycsbt", a) - 1)
    ctx.write("ycsbt", b, ctx.read("ycsbt", b) + 1)


def _analyze(args):
    keys = [("ycsbt", args["a"]), ("ycsbt", args["b"])]
    return keys, keys


ycsbt_transfer = Procedure("ycsbt_transfer", ARGS, _analyze, transfer)
PROCEDURES = [ycsbt_transfer]

KNOBS = {
    "records": (int, 100_000, "keys, uniformly drawn"),
    "partitions": (int, 1, "partitions the keys are spread over (key k on k % partitions)"),
    "mp": (float, 0.0, "share of transfers between two partitions, 0..1"),
    "analyze": (
        int,
        1,
        "1: the procedure with ANALYZE; 0: the same without it (procedures/workloads/"
        "ycsbt_open.py); the requests are the same",
    ),
}


def generate(
    count: int, seed: int = 0, records: int = 100_000, partitions: int = 1, mp: float = 0.0, analyze: int = 1
) -> Iterator[dict]:
    if records < 2 * partitions:
        raise ValueError("need at least two records per partition")
    rng = random.Random(seed)
    per_partition = records // partitions

    def key_on(partition: int) -> int:
        return partition + partitions * rng.randrange(per_partition)

    for i in range(count):
        if partitions > 1 and rng.random() < mp:
            first, second = rng.sample(range(partitions), 2)
            a, b = key_on(first), key_on(second)
        else:
            home = rng.randrange(partitions)
            a = key_on(home)
            b = key_on(home)
            while b == a:
                b = key_on(home)
        yield request("ycsbt", seed, i, "ycsbt_transfer", {"a": a, "b": b})
