"""Routing: the sequencer's record, in each batch, of which partitions take part in each
entry, so that a partition worker finds its slice of a batch without analyzing the rest.

    routing = [partitions, slices]
    slices[p] = items of partition p, in log order, msgpack-encoded as one bin, so that a
                worker decodes its own slice only (`slice_of`); an item is
        index                           an entry only p handles: a single-partition
                                        transaction on p, or a rejected entry p reports
        [index, participants, active]   a multi-partition transaction whose keys are too
                                        many to carry: p analyzes it
        [index, participants, active, keys, writes_from, reads_to]
                                        a multi-partition transaction p takes part in
                                        without executing it: the keys p owns, encoded,
                                        each once; keys[:reads_to] are read and
                                        keys[writes_from:] written
        [index, participants, active, keys, writes_from, reads_to, written]
                                        one p executes (runs its RUN: `executor_of`): its
                                        own keys as above, and `written`, the keys each
                                        other active participant writes, in `active` order

A participant that does not execute a transaction only reads its own keys for the
executor and applies the writes the executor sends back, so with its keys in the routing
it needs neither the entry nor ANALYZE. The executor decodes the entry for RUN's
arguments, and takes the keys RUN may read here and write anywhere from the routing: the
sequencer's ANALYZE is the one that counts for a multi-partition transaction, as its
placement already was (the start record's procedure description makes sure the engine's
procedures take the arguments the sequencer checked).

Routing is made for the partition count the sequencer was told. The log does not depend
on it: a worker of an engine laid out for another count places every entry itself
(`scheduler.batch.prepare`), as a batch without routing asks it to.
"""

from __future__ import annotations

import msgpack

from ordo.storage.partitioning import Partitioner, executor_of, owned_keys, place

# Bytes of encoded keys one entry may carry in the routing: past this, its participants
# ANALYZE it themselves, and a batch's routing stays small beside its entries.
CARRIED_KEYS_MAX = 2048
_KEY_FRAMING = 3  # a bin's header, for a key under 64 KiB
_CARRIED_FRAMING = 16  # the keys' array header and the two positions
SINGLE_ITEM_BYTES = 5  # an entry index


def reporter_of_rejected(index: int, partitions: int) -> int:
    """The partition that reports an entry rejected before it could be placed: spread
    over the partitions, a function of the log position alone."""
    return index % partitions


def placement_of(partitioner: Partitioner, read_set, write_set) -> tuple:
    """(participants, active, carried, routing bytes) of an accepted entry: `carried` maps
    each participant to its keys as a routing item carries them, or is None (a
    single-partition entry, or more keys than CARRIED_KEYS_MAX); the last is an upper
    bound of the bytes the entry adds to a batch's routing."""
    participants, active = place(partitioner, read_set, write_set)
    if len(participants) == 1:
        return participants, active, None, SINGLE_ITEM_BYTES
    carried, size = {}, 0
    for p, (read_only, both, write_only) in owned_keys(partitioner, participants, read_set, write_set).items():
        keys = read_only + both + write_only
        carried[p] = [keys, len(read_only), len(read_only) + len(both)]
        size += _CARRIED_FRAMING + _KEY_FRAMING * len(keys) + sum(map(len, keys))
    if size > CARRIED_KEYS_MAX:
        return participants, active, None, _base_bytes(len(participants))
    return participants, active, carried, _base_bytes(len(participants)) + 2 * size  # written keys twice


def own_part(item: list) -> tuple[tuple[bytes, ...], tuple[bytes, ...]] | None:
    """(local reads, local writes) a routing item carries for its partition, or None."""
    if len(item) < 6:
        return None
    keys, _, reads_to = carried = item[3:6]
    return tuple(keys[:reads_to]), tuple(_written(carried))


def writers(item: list, here: int, own_writes: tuple[bytes, ...]) -> dict[bytes, int] | None:
    """The executor's item only: each key of the transaction's write set -> the participant
    that owns it (`here` for `own_writes`). None for any other item."""
    if len(item) < 7:
        return None
    owners = dict.fromkeys(own_writes, here)
    for partition, keys in zip((p for p in item[2] if p != here), item[6]):
        owners.update(dict.fromkeys(keys, partition))
    return owners


def _written(carried: list) -> list[bytes]:
    keys, writes_from, _ = carried
    return keys[writes_from:]


def _base_bytes(n: int) -> int:
    return n * (6 + 2 * (3 + 3 * n))


def item_bytes(placement: tuple | None) -> int:
    """An upper bound of the bytes an entry adds to a batch's routing."""
    return SINGLE_ITEM_BYTES if placement is None else placement[3]


def routing_bytes(partitions: int) -> int:
    """An upper bound of a batch's routing beyond its items' `item_bytes`."""
    return 16 + 10 * partitions


def max_item_bytes(partitions: int) -> int:
    """An upper bound of `item_bytes` for any entry under `partitions` partitions."""
    if partitions == 1:
        return SINGLE_ITEM_BYTES
    return _base_bytes(partitions) + 2 * (partitions * _CARRIED_FRAMING + CARRIED_KEYS_MAX)


def build_routing(partitions: int, placements: list[tuple | None]) -> list | None:
    """The routing of a batch whose i-th entry has `placement_of`'s placement, or None
    where the entry is rejected."""
    if partitions == 1:
        return None  # one partition takes everything: nothing to route
    slices: list[list] = [[] for _ in range(partitions)]
    for index, entry_placement in enumerate(placements):
        if entry_placement is None:
            slices[reporter_of_rejected(index, partitions)].append(index)
            continue
        participants, active, carried, _ = entry_placement
        if len(participants) == 1:
            slices[participants[0]].append(index)
            continue
        item = [index, list(participants), list(active)]
        executor = executor_of(index, active)
        if carried is None:
            for p in participants:
                slices[p].append(item)
            continue
        for p in participants:
            if p == executor:
                written = [_written(carried[a]) for a in active if a != executor]
                slices[p].append(item + carried[p] + [written])
            else:
                slices[p].append(item + carried[p])
    return [partitions, [msgpack.packb(items) for items in slices]]


def slice_of(routing: list, partition: int) -> list:
    """The items of `partition`'s slice (a log written before slices were bins holds lists)."""
    items = routing[1][partition]
    return msgpack.unpackb(items) if type(items) is bytes else items
