"""Routing (sequencer/routing.py): a participant that does not execute a multi-partition
transaction takes its keys from the routing instead of decoding and analyzing the entry,
and must end up with exactly the keys it would have derived itself."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordo.procedures.registry import default_registry
from ordo.procedures.workloads import ALL_WORKLOADS
from ordo.scheduler.batch import prepare
from ordo.log.records import Batch
from ordo.sequencer.routing import (
    CARRIED_KEYS_MAX,
    build_routing,
    item_bytes,
    max_item_bytes,
    placement_of,
    routing_bytes,
    slice_of,
)
from ordo.storage.partitioning import Partitioner, executor_of

REGISTRY = default_registry()
WORKLOAD_KNOBS = {
    "micro": lambda partitions: {"partitions": partitions, "keys": 300, "hot": 6, "mp": 0.7},
    "sl": lambda partitions: {"records": 100},
    "gs": lambda partitions: {"records": 100},
    # 300 customers a district: the assumed index entries come from generating each district (3,000: 2 s each)
    "tpcc": lambda partitions: {"warehouses": partitions, "customers": 300, "load": 0, "remote_line": 0.2, "assume": 1},
    "voter": lambda partitions: {},
}


def partitioner_for(partitions: int) -> Partitioner:
    return Partitioner.for_tables(partitions, {t.name: t.partitioner for t in REGISTRY.tables.values()})


def routed_batch(requests: list[dict], partitions: int) -> Batch:
    partitioner = partitioner_for(partitions)
    entries, placements = [], []
    for n, request in enumerate(requests):
        _, read_set, write_set = REGISTRY.analyze(request["proc"], request["args"])
        entries.append([f"r{n}", request["proc"], request["args"]])
        placements.append(placement_of(partitioner, read_set, write_set))
    return Batch(1, 1, 1_000, {}, entries, routing=build_routing(partitions, placements))


def by_index(txns) -> dict:
    return {t.index: t for t in txns}


@settings(max_examples=15, deadline=None)
@given(workload=st.sampled_from(sorted(WORKLOAD_KNOBS)), partitions=st.integers(2, 5), seed=st.integers(0, 10_000))
def test_carried_keys_are_the_keys_a_participant_derives(workload, partitions, seed):
    generator = ALL_WORKLOADS[workload].generate
    requests = list(generator(120, seed=seed, **WORKLOAD_KNOBS[workload](partitions)))
    routed = routed_batch(requests, partitions)
    assert any(len(item) == 6 for item in slice_of(routed.routing, 1) if type(item) is list) or workload != "micro"
    placed = Batch(1, 1, 1_000, {}, routed.entries)  # no routing: every entry analyzed here
    partitioner = partitioner_for(partitions)
    for p in range(partitions):
        kinds = {item[0]: len(item) for item in slice_of(routed.routing, p) if type(item) is list}
        from_routing, _ = prepare(routed, REGISTRY, partitioner, p)
        derived, _ = prepare(placed, REGISTRY, partitioner, p)
        assert sorted(by_index(from_routing)) == sorted(by_index(derived))
        for index, txn in by_index(from_routing).items():
            own = by_index(derived)[index]
            assert (txn.participants, txn.active) == (own.participants, own.active)
            assert set(txn.local_reads) == set(own.local_reads)
            assert set(txn.local_writes) == set(own.local_writes)
            assert len(txn.local_reads) == len(own.local_reads)
            assert len(txn.local_writes) == len(own.local_writes)
            kind = kinds.get(index, 1)
            if kind == 6:  # takes part without executing: only its own keys, never decoded
                assert executor_of(index, txn.active) != p and txn.procedure is None
            elif kind == 7:  # executes with the sequencer's keys: every key RUN may write
                assert executor_of(index, txn.active) == p
                assert (txn.id, txn.procedure, txn.args) == (own.id, own.procedure, own.args)
                assert set(txn.writes) == set(own.writes)
                assert set(txn.owners) == set(own.writes)
                for key, writer in txn.owners.items():
                    table, plain = own.writes[key]
                    assert writer == partitioner.of(table, plain, key)
            else:  # analyzed here, as without routing
                assert (txn.reads, txn.writes, txn.args) == (own.reads, own.writes, own.args)


def test_a_participant_that_does_not_execute_never_decodes_the_entry():
    """Its slice costs what its own keys cost: the entry may be anything at all."""
    partitions = 2
    request = {"proc": "micro_rmw", "args": {"keys": [0, 1, 2, 3]}}  # keys mod 2: both partitions
    routing = routed_batch([request], partitions).routing
    executor = executor_of(0, tuple(slice_of(routing, 0)[0][2]))
    other = 1 - executor
    unreadable = Batch(1, 1, 1_000, {}, raw=[b"\xc1 not msgpack"], routing=routing)
    (txn,), rejected = prepare(unreadable, REGISTRY, partitioner_for(partitions), other)
    assert not rejected and txn.procedure is None
    assert sorted(txn.local_reads) == sorted(txn.local_writes) and len(txn.local_reads) == 2
    with pytest.raises(ValueError):  # msgpack's FormatError
        prepare(unreadable, REGISTRY, partitioner_for(partitions), executor)  # it does decode


def test_an_entry_with_too_many_keys_leaves_its_participants_to_analyze_it():
    partitions = 3
    keys = list(range(200))  # 200 keys of 15 bytes: more than CARRIED_KEYS_MAX
    partitioner = partitioner_for(partitions)
    read_set = [("micro", k) for k in keys]
    placement = placement_of(partitioner, read_set, read_set)
    participants, active, carried, _ = placement
    assert participants == (0, 1, 2) and carried is None
    routing = build_routing(partitions, [placement])
    assert all(len(slice_of(routing, p)[0]) == 3 for p in range(partitions))
    batch = Batch(1, 1, 1_000, {}, [["big", "micro_rmw", {"keys": keys[:64]}]], routing=routing)
    for p in range(partitions):
        (txn,), _ = prepare(batch, REGISTRY, partitioner, p)
        assert txn.procedure is not None  # analyzed here, as before routing carried keys


@settings(max_examples=40, deadline=None)
@given(
    partitions=st.integers(2, 16),
    txns=st.lists(
        st.lists(st.tuples(st.sampled_from(["r", "w", "rw"]), st.integers(0, 10**12)), min_size=0, max_size=150),
        min_size=1,
        max_size=30,
    ),
)
def test_item_bytes_bounds_what_an_entry_adds_to_the_routing(partitions, txns):
    """The sequencer cuts a batch by size with `item_bytes`: it must never undercount."""
    partitioner = partitioner_for(partitions)
    placements = []
    for keys in txns:
        reads = [("micro", k) for mode, k in keys if "r" in mode]
        writes = [("micro", k) for mode, k in keys if "w" in mode]
        placements.append(placement_of(partitioner, reads, writes))
    routing = build_routing(partitions, placements)
    assert len(msgpack.packb(routing)) <= routing_bytes(partitions) + sum(item_bytes(p) for p in placements)
    assert all(item_bytes(p) <= max_item_bytes(partitions) for p in placements)
    assert all(p[2] is None or sum(len(k) for c in p[2].values() for k in c[0]) <= CARRIED_KEYS_MAX for p in placements)


def test_a_log_whose_slices_are_plain_lists_still_routes():
    """Logs written before each slice became a bin of its own hold the slices as lists."""
    requests = [{"proc": "micro_rmw", "args": {"keys": [i, i + 1, i + 2]}} for i in range(20)]
    routed = routed_batch(requests, 3)
    as_lists = Batch(
        1, 1, 1_000, {}, routed.entries, routing=[3, [msgpack.unpackb(items) for items in routed.routing[1]]]
    )
    partitioner = partitioner_for(3)
    for p in range(3):
        assert prepare(as_lists, REGISTRY, partitioner, p) == prepare(routed, REGISTRY, partitioner, p)
