import json

import pytest

from procedures.registry import default_registry
from sequencer.dedupe import RecentIds
from sequencer.log import BATCH, LogCursor, LogError, decode, encode_batch, encode_entry, encode_start
from sequencer.wire import parse_request

registry = default_registry()
GOOD = {"id": "r-1", "proc": "sl_deposit",
        "args": {"account": 1, "asset": 2, "account_amount": 3, "asset_amount": 4}}


def parse(value, key=b"k", limit=1000):
    return parse_request(value, key, 0, 17, registry, limit)


def test_valid_request_becomes_a_runnable_entry():
    assert parse(json.dumps(GOOD).encode()) == ["r-1", "sl_deposit", GOOD["args"]]


@pytest.mark.parametrize("value, key, expected_id, error", [
    (b"{nope", b"k-7", "k-7", "invalid JSON"),
    (b"\xff\xfe", None, "@0:17", "invalid JSON"),
    (None, b"k", "k", "empty message"),
    (b"[1, 2]", b"k", "k", "request must be a JSON object"),
    (json.dumps({"proc": "x", "args": {}}).encode(), b"k", "k", "missing or invalid 'id'"),
    (json.dumps({"id": 5, "proc": "x", "args": {}}).encode(), b"k", "k", "missing or invalid 'id'"),
    (json.dumps({"id": "a", "args": {}}).encode(), b"k", "a", "missing field(s): proc"),
    (json.dumps({"id": "a", "proc": "sl_deposit"}).encode(), b"k", "a", "missing field(s): args"),
    (json.dumps({**GOOD, "code": "import os"}).encode(), b"k", "r-1", "unknown field(s): code"),
    (json.dumps({**GOOD, "proc": "drop_tables"}).encode(), b"k", "r-1", "unknown procedure 'drop_tables'"),
    (json.dumps({**GOOD, "args": {**GOOD["args"], "asset": "x"}}).encode(), b"k", "r-1",
     "argument 'asset': expected integer"),
    (b"x" * 2000, b"big", "big", "request too large: 2000 bytes > limit 1000"),
])
def test_bad_messages_become_rejections_never_exceptions(value, key, expected_id, error):
    request_id, proc, reason = parse(value, key)
    assert request_id == expected_id and proc is None and error in reason


def batch_record(batch_id, generation, entries=(["a", None, "x"],), offsets=None):
    return encode_batch(batch_id, generation, 1000 + batch_id, offsets or {0: (0, 1)},
                        [encode_entry(e) for e in entries])


def test_batch_record_round_trip():
    kind, batch = decode(batch_record(4, 2, [["a", "p", {"x": 1}], ["b", None, "bad"]], {0: (3, 9), 2: (0, 1)}))
    assert kind == BATCH
    assert (batch.batch_id, batch.generation, batch.time_ms) == (4, 2, 1004)
    assert batch.offsets == {0: [3, 9], 2: [0, 1]}
    assert batch.entries == [["a", "p", {"x": 1}], ["b", None, "bad"]]


def test_cursor_accepts_next_batch_of_current_generation_only():
    cursor = LogCursor()
    assert cursor.accept(encode_start("s1"), 0) is None and cursor.generation == 1
    assert cursor.accept(batch_record(1, 1), 1).batch_id == 1
    assert cursor.accept(batch_record(1, 1), 2) is None  # a repeat (e.g. visible aborted copy)
    assert cursor.accept(encode_start("s2"), 3) is None and cursor.generation == 2
    assert cursor.accept(batch_record(2, 1), 4) is None  # a fenced sequencer's late write
    accepted = cursor.accept(batch_record(2, 2, offsets={0: (1, 5)}), 5)
    assert accepted.batch_id == 2 and accepted.log_offset == 5
    assert cursor.to_dict() == {"next_batch": 3, "generation": 2, "next_offset": 6, "request_offsets": {0: 5}}
    assert LogCursor.from_dict(cursor.to_dict()) == cursor


def test_cursor_refuses_to_skip_a_missing_batch():
    cursor = LogCursor()
    cursor.accept(encode_start("s"), 0)
    with pytest.raises(LogError, match="expected batch 1, found batch 3"):
        cursor.accept(batch_record(3, 1), 1)


def test_unreadable_record_is_a_clear_error():
    with pytest.raises(LogError, match="unreadable log record"):
        LogCursor().accept(b"\xc1garbage", 0)


def test_recent_ids_forget_the_oldest_beyond_capacity():
    recent = RecentIds(3)
    recent.add_batch_entries([["a", "p", {}], ["b", None, "bad"], ["c", "p", {}], ["d", "p", {}]])
    assert "a" in recent and "b" not in recent and len(recent) == 3
    recent.add("e")
    assert "a" not in recent and {"c", "d", "e"} <= {i for i in "cde" if i in recent}


@pytest.mark.parametrize("namespace", ["", "a b", "slθ", "x" * 201, ".hidden"])
def test_namespaces_that_kafka_cannot_name_are_refused(namespace):
    from sequencer.topics import Topics

    with pytest.raises(ValueError, match="invalid namespace"):
        Topics(namespace)
