"""Composite keys: tuples of integers and strings, order-preserving, decoded back to
tuples; tables partitioned on one component; lists from msgpack/JSON taken as tuples."""

import pytest
from hypothesis import given, strategies as st

from ordo.procedures.contract import Table
from ordo.storage.keys import decode_key, encode_key, normal_key, prefix_bytes
from ordo.storage.partitioning import Partitioner, place

int64 = st.integers(-(2**63), 2**63 - 1)
component = st.one_of(int64, st.text(max_size=6))
composite = st.lists(component, min_size=1, max_size=4).map(tuple)


def _order(key: tuple) -> tuple:
    """Tuple order with integers before strings in each position, strings by UTF-8."""
    return tuple((0, c, b"") if type(c) is int else (1, 0, c.encode()) for c in key)


@given(composite)
def test_composite_round_trip(key):
    assert decode_key(encode_key("t", key)) == ("t", key)


@given(composite, composite)
def test_byte_order_is_tuple_order(a, b):
    assert (encode_key("t", a) < encode_key("t", b)) == (_order(a) < _order(b))


@given(composite, composite)
def test_prefix_bytes_select_exactly_the_keys_with_that_prefix(key, prefix):
    starts = encode_key("t", key).startswith(prefix_bytes("t", prefix))
    assert starts == (key[: len(prefix)] == prefix)


def test_strings_with_zero_bytes_and_prefixes_sort_right():
    keys = [(1, "a"), (1, "a", 3), (1, "a\x00"), (1, "ab"), (1, ""), (2,), ("x",), (1,)]
    assert sorted(keys, key=lambda k: encode_key("t", k)) == [
        (1,),
        (1, ""),
        (1, "a"),
        (1, "a", 3),
        (1, "a\x00"),
        (1, "ab"),
        (2,),
        ("x",),
    ]


def test_scalar_keys_sort_before_composite_keys_and_bad_components_fail():
    assert encode_key("t", 5) < encode_key("t", "z") < encode_key("t", (0,))
    with pytest.raises(TypeError):
        encode_key("t", (1.5,))
    with pytest.raises(TypeError):
        encode_key("t", ())
    with pytest.raises(TypeError):
        encode_key("t", (2**63,))
    with pytest.raises(ValueError):
        decode_key(b"t\x00\x03\x02ab")  # a string component without its end


def test_lists_are_normalized_to_tuples():
    assert normal_key([1, "a"]) == (1, "a") and normal_key(7) == 7


def test_partition_by_component_keeps_a_warehouse_together():
    tables = [Table("district", partition_by=0), Table("item"), Table("micro_like", partitioner="modulo")]
    partitioner = Partitioner.for_tables(3, {t.name: t.partitioner for t in tables})
    assert tables[0].partitioner == "component:0"
    for w in range(1, 7):
        owners = {partitioner.of_key("district", (w, d)) for d in range(1, 11)}
        assert owners == {w % 3}
        assert partitioner.of("district", (w, 1), encode_key("district", (w, 1))) == w % 3
    assert partitioner.of_key("micro_like", 5) == 2
    parts, active = place(partitioner, [("district", (1, 1)), ("district", (2, 1))], [("district", (2, 5))])
    assert parts == (1, 2) and active == (2,)
    with pytest.raises(ValueError):
        Table("bad", partition_by=-1)
    with pytest.raises(ValueError):
        Table("bad", partitioner="range")
