"""Routing: the sequencer's record, in each batch, of which partitions take part in each
entry, so that a partition worker finds its slice of a batch without analyzing the rest.

    routing = [partitions, slices]
    slices[p] = items of partition p, in log order; an item is
        index                           an entry only p handles: a single-partition
                                        transaction on p, or a rejected entry p reports
        [index, participants, active]   a multi-partition transaction

Routing is made for the partition count the sequencer was told. The log does not depend
on it: a worker of an engine laid out for another count places every entry itself
(`scheduler.batch.prepare`), as a batch without routing asks it to.
"""

from __future__ import annotations

from typing import Any


def reporter_of_rejected(index: int, partitions: int) -> int:
    """The partition that reports an entry rejected before it could be placed: spread
    over the partitions, a function of the log position alone."""
    return index % partitions


def routing_item(index: int, participants: tuple[int, ...], active: tuple[int, ...]) -> Any:
    if len(participants) == 1:
        return index
    return [index, list(participants), list(active)]


def item_bytes(participants: tuple[int, ...] | None) -> int:
    """An upper bound of the bytes an entry adds to a batch's routing."""
    if participants is None or len(participants) == 1:
        return 5
    n = len(participants)
    return n * (6 + 2 * (3 + 3 * n))


def build_routing(partitions: int, placements: list[tuple[tuple[int, ...], tuple[int, ...]] | None]) -> list | None:
    """The routing of a batch whose i-th entry has placement (participants, active), or
    None where the entry is rejected."""
    if partitions == 1:
        return None  # one partition takes everything: nothing to route
    slices: list[list] = [[] for _ in range(partitions)]
    for index, placement in enumerate(placements):
        if placement is None:
            slices[reporter_of_rejected(index, partitions)].append(index)
            continue
        participants, active = placement
        item = routing_item(index, participants, active)
        for p in participants:
            slices[p].append(item)
    return [partitions, slices]
