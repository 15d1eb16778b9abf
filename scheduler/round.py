"""Rounds: consecutive batches a lagging worker executes as one.

Every batch pays a fixed cost on each partition whatever its size: an overlay, a read of
its keys from the shard, a scheduler run, a message to each peer per scheduling step, a
write to the shard. An engine that keeps up executes one batch at a time, as soon as it
is cut. One that has fallen behind finds several batches waiting; executing them one by
one pays that cost for each and keeps it behind. It executes them as one round instead.

Why the result is the same. The log fixes one serial order over all batches: batch by
batch, entry by entry. A round's transactions are its batches' transactions in that
order, and every scheduler gives the result of a serial run in the order of the
transactions it is given; so the state after a round is the state after its batches one
by one. Each transaction keeps what makes it deterministic: its batch's time and its seed
(batch id, entry index), its executor among the active participants (by entry index), and
the key its peers' reads arrive under (batch id, entry index). None of these depends on
the round, so partitions need not agree on rounds: one may run batches 7-12 as a round
while its peer runs them one at a time, and their messages still meet. They cannot wait
for each other in a circle either: a transaction waits only for transactions before it
in the serial order, on either side.

What stays per batch: outcomes, change data and stream tuples are split back to their
batches and published as theirs. What becomes per round: the write to the shard, with
the marker of the round's last batch (a crash inside a round replays the whole round,
as it replays a whole batch). So a round never runs past a batch at which something must
be seen on its own: a checkpoint, a stop or hold, another procedure set or ordering.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from ordo.log.records import Batch

# A round's size: enough to pay the fixed cost once for many small batches, small enough
# that its first batch's outcomes do not wait long for the rest.
ROUND_TXNS = 2_048
ROUND_BATCHES = 128


def joins(first: Batch, batch: Batch) -> bool:
    """Whether `batch` may run in a round that `first` opened: the same procedure set
    (named by both) and log order (an aria batch runs alone, scheduler/aria.py)."""
    return (
        batch.ordering is None
        and first.ordering is None
        and first.procedures is not None
        and batch.procedures == first.procedures
    )


def offsets_of(batches: Sequence[Batch]) -> list[int]:
    """Where each batch's entries begin in the round's numbering."""
    offsets, offset = [], 0
    for batch in batches:
        offsets.append(offset)
        offset += len(batch.entries)
    return offsets


def merge(prepared: Sequence[tuple[list, list]], offsets: Sequence[int]) -> list:
    """The round's transactions, in log order, each numbered by its place in the round
    (`offset` keeps its entry's index in its batch: scheduler/batch.py)."""
    txns: list = []
    for (batch_txns, _), offset in zip(prepared, offsets):
        if offset:
            for txn in batch_txns:
                txn.index += offset
                txn.offset = offset
        txns += batch_txns
    return txns


def split(
    offsets: Sequence[int], outcomes: list, changes: list[list], streamed: list[list]
) -> list[tuple[list, list[list], list[list]]]:
    """The round's outputs back per batch, each numbered by its entry in its batch and in
    that order (outcomes are objects with `index`; changes and tuples lists led by it)."""
    per: list[tuple[list, list[list], list[list]]] = [([], [], []) for _ in offsets]
    for outcome in sorted(outcomes, key=_index_of):
        k = bisect_right(offsets, outcome.index) - 1
        outcome.index -= offsets[k]
        per[k][0].append(outcome)
    for position, rows in ((1, changes), (2, streamed)):
        for row in sorted(rows, key=_first):
            k = bisect_right(offsets, row[0]) - 1
            row[0] -= offsets[k]
            per[k][position].append(row)
    return per


def _index_of(outcome: Any) -> int:
    return outcome.index


def _first(row: list) -> int:
    return row[0]
