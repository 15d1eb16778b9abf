"""Calvin's microbenchmark: read-modify-write of 10 keys, one of them hot.

Keys of partition p are p, p + P, p + 2P, … (the `micro` table partitions by key modulo
the partition count), so the generator can aim a transaction at chosen partitions.
In each partition the first `hot` keys are hot; contention index CI = 1 / hot.
"""

from __future__ import annotations

import random
from typing import Iterator

from ordo.procedures.args import Int, List
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.operations import increment_ops
from ordo.procedures.workloads.sampling import request

TABLES = [Table("micro", default=0, partitioner="modulo")]


def _analyze(args):
    keys = [("micro", k) for k in args["keys"]]
    return keys, keys


def _run(ctx, args):
    for key in args["keys"]:
        ctx.write("micro", key, ctx.read("micro", key) + 1)
    return None


def _operations(args):
    return increment_ops("micro", args["keys"])


micro_rmw = Procedure(
    "micro_rmw",
    {"keys": List(Int(0), min_len=1, max_len=64)},
    _analyze,
    _run,
    operations=_operations,
)

PROCEDURES = [micro_rmw]

KNOBS = {
    "partitions": (int, 1, "partitions the keys are spread over"),
    "keys": (int, 100_000, "records per partition (Calvin: 1,000,000)"),
    "hot": (int, 10_000, "hot records per partition; contention index = 1/hot"),
    "mp": (float, 0.0, "share of multi-partition transactions, 0..1"),
}


def generate(
    count: int, seed: int = 0, partitions: int = 1, keys: int = 100_000, hot: int = 10_000, mp: float = 0.0
) -> Iterator[dict]:
    if not 1 <= hot < keys:
        raise ValueError("need 1 <= hot < keys")
    if keys - hot < 9:
        raise ValueError("need at least 9 cold keys per partition")
    rng = random.Random(seed)

    def pick(partition: int, cold: int) -> list[int]:
        hot_key = rng.randrange(hot)
        cold_keys = rng.sample(range(hot, keys), cold)
        return [partition + partitions * j for j in [hot_key, *cold_keys]]

    for i in range(count):
        if partitions > 1 and rng.random() < mp:
            first, second = rng.sample(range(partitions), 2)
            chosen = pick(first, 4) + pick(second, 4)
        else:
            chosen = pick(rng.randrange(partitions), 9)
        yield request("micro", seed, i, "micro_rmw", {"keys": chosen})
