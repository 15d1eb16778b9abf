"""Toll Processing (TStream, after Linear Road): position reports of vehicles on road
segments; each report updates its segment's average speed and count of distinct vehicles
and returns the toll the vehicle owes.

State layout (integers only, so every result is exact and deterministic):
- `speed`: segment -> {"n": reports, "sum": sum of reported speeds}; the average speed
  is sum // n. Keeping the sum, not a running average, avoids rounding drift.
- `count`: segment -> number of distinct vehicles reported on it.
- `seen`: vehicle * SPAN + segment -> 1 once that vehicle has been reported there. One
  scalar per pair keeps values small and fixed-size (a per-segment vehicle list would grow
  without bound and be copied on every report).
All three tables partition by key modulo the partition count; SPAN = lcm(1..16), so for any
partition count up to 16 (and every divisor of SPAN) a `seen` key lives on its segment's
partition and a report stays a single-partition transaction.

tp_report {vehicle, segment, speed} always writes all three keys (the count unchanged when
the vehicle was already seen) and returns 2 * (count - 50)^2 when the new average speed is
below 40 and the new count above 50, else 0.
"""

from __future__ import annotations

import random
from typing import Iterator

from ordo.procedures.args import Int
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.operations import READ_MODIFY, WRITE, Operations
from ordo.procedures.workloads.sampling import Zipf, request

SEGMENTS = 100
VEHICLES = 1_000
SPAN = 720_720  # lcm(1..16)
TABLES = [
    Table("speed", default={"n": 0, "sum": 0}, partitioner="modulo"),
    Table("count", default=0, partitioner="modulo"),
    Table("seen", default=0, partitioner="modulo"),
]
SLOW = 40  # average speed below which a segment is congested
BUSY = 50  # distinct vehicles above which a congested segment charges tolls


def toll(average: int, count: int) -> int:
    if average < SLOW and count > BUSY:
        return 2 * (count - BUSY) ** 2
    return 0


def seen_key(vehicle: int, segment: int) -> int:
    return vehicle * SPAN + segment


def _keys(args):
    segment = args["segment"]
    keys = [("speed", segment), ("count", segment), ("seen", seen_key(args["vehicle"], segment))]
    return keys, keys


def _report(ctx, args):
    segment, vehicle = args["segment"], args["vehicle"]
    stats = ctx.read("speed", segment)
    stats = {"n": stats["n"] + 1, "sum": stats["sum"] + args["speed"]}
    ctx.write("speed", segment, stats)
    key = seen_key(vehicle, segment)
    count = ctx.read("count", segment) + (0 if ctx.read("seen", key) else 1)
    ctx.write("count", segment, count)
    ctx.write("seen", key, 1)
    return toll(stats["sum"] // stats["n"], count)


def _speed_adder(speed: int):
    def add_report(stats: dict) -> dict:
        return {"n": stats["n"] + 1, "sum": stats["sum"] + speed}

    return add_report


def _count_vehicle(count: int, seen: int) -> int:
    return count if seen else count + 1


def _toll_of(outputs: list) -> int:
    stats, count = outputs[0], outputs[1]
    return toll(stats["sum"] // stats["n"], count)


def _operations(args):
    segment = args["segment"]
    key = seen_key(args["vehicle"], segment)
    # The count depends on `seen` as it was before this report: a cross-chain dependency.
    return Operations(
        [
            READ_MODIFY("speed", segment, _speed_adder(args["speed"])),
            READ_MODIFY("count", segment, _count_vehicle, deps=[("seen", key)]),
            WRITE("seen", key, 1),
        ],
        _toll_of,
    )


tp_report = Procedure(
    "tp_report",
    {"vehicle": Int(0, 2**40), "segment": Int(0, SPAN - 1), "speed": Int(0, 1_000)},
    _keys,
    _report,
    operations=_operations,
)

PROCEDURES = [tp_report]

KNOBS = {
    "segments": (int, SEGMENTS, "road segments"),
    "vehicles": (int, VEHICLES, "distinct vehicles"),
    "theta": (float, 0.2, "Zipf skew of segment choice"),
}


def generate(
    count: int, seed: int = 0, segments: int = SEGMENTS, vehicles: int = VEHICLES, theta: float = 0.2
) -> Iterator[dict]:
    if not 1 <= segments <= SPAN:
        raise ValueError(f"need 1..{SPAN} segments")
    rng = random.Random(seed)
    zipf = Zipf(segments, theta)
    for i in range(count):
        args = {"vehicle": rng.randrange(vehicles), "segment": zipf.sample(rng), "speed": rng.randint(5, 75)}
        yield request("tp", seed, i, "tp_report", args)
