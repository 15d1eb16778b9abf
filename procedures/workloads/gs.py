"""Grep and Sum (TStream): each transaction reads or writes ten keys of one table.
`gs_read` returns the sum of its keys' values (a repeated key counts twice); `gs_write`
writes one value to every key, blind (nothing read)."""

from __future__ import annotations

import random
from typing import Iterator

from ordo.procedures.args import Int, List
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.operations import READ, WRITE, Operations
from ordo.procedures.workloads.sampling import Zipf, request

RECORDS = 10_000
KEYS_PER_TXN = 10
TABLES = [Table("gs")]
_KEYS = List(Int(0), min_len=1, max_len=64)


def _read_keys(args):
    return [("gs", k) for k in args["keys"]], ()


def _read(ctx, args):
    read = ctx.read
    return sum(read("gs", k) for k in args["keys"])


def _read_ops(args):
    return Operations([READ("gs", k) for k in args["keys"]], sum)


def _write_keys(args):
    return (), [("gs", k) for k in args["keys"]]


def _write(ctx, args):
    value = args["value"]
    for k in args["keys"]:
        ctx.write("gs", k, value)
    return None


def _write_ops(args):
    value = args["value"]
    return Operations([WRITE("gs", k, value) for k in args["keys"]])


gs_read = Procedure("gs_read", {"keys": _KEYS}, _read_keys, _read, operations=_read_ops)
gs_write = Procedure(
    "gs_write", {"keys": _KEYS, "value": Int(-(2**40), 2**40)}, _write_keys, _write, operations=_write_ops
)

PROCEDURES = [gs_read, gs_write]

KNOBS = {
    "records": (int, RECORDS, "records of table gs"),
    "theta": (float, 0.6, "Zipf skew of key choice"),
    "read": (float, 0.5, "share of gs_read (the rest are gs_write)"),
}


def generate(
    count: int, seed: int = 0, records: int = RECORDS, theta: float = 0.6, read: float = 0.5
) -> Iterator[dict]:
    if records < KEYS_PER_TXN:
        raise ValueError(f"need at least {KEYS_PER_TXN} records")
    rng = random.Random(seed)
    zipf = Zipf(records, theta)
    for i in range(count):
        keys = zipf.distinct(rng, KEYS_PER_TXN)
        if rng.random() < read:
            yield request("gs", seed, i, "gs_read", {"keys": keys})
        else:
            yield request("gs", seed, i, "gs_write", {"keys": keys, "value": rng.randrange(1_000_000)})
