import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordo.procedures.registry import default_registry
from ordo.sequencer.dedupe import RecentIds
from ordo.log.records import (
    BATCH,
    LogCursor,
    LogError,
    LogMismatch,
    decode,
    encode_batch,
    encode_entry,
    encode_start,
    record_context,
)
from ordo.log.secret import seal, tag
from ordo.sequencer.wire import parse_request

registry = default_registry()
GOOD = {"id": "r-1", "proc": "sl_deposit", "args": {"account": 1, "asset": 2, "account_amount": 3, "asset_amount": 4}}


def parse(value, key=b"k", limit=1000):
    return parse_request(value, key, 0, 17, registry, limit)


def test_valid_request_becomes_a_runnable_entry():
    assert parse(json.dumps(GOOD).encode()) == ["r-1", "sl_deposit", GOOD["args"]]


@pytest.mark.parametrize(
    "value, key, expected_id, error",
    [
        (b"{nope", b"k-7", "@0:17", "invalid JSON"),
        (b"\xff\xfe", None, "@0:17", "invalid JSON"),
        (None, b"k", "@0:17", "empty message"),
        (b"[1, 2]", b"k", "@0:17", "request must be a JSON object"),
        (json.dumps({"proc": "x", "args": {}}).encode(), b"k", "@0:17", "missing or invalid 'id'"),
        (json.dumps({"id": 5, "proc": "x", "args": {}}).encode(), b"k", "@0:17", "missing or invalid 'id'"),
        (json.dumps({"id": "@0:3", "proc": "x", "args": {}}).encode(), b"k", "@0:17", "must not start with '@'"),
        (json.dumps({"id": "a", "args": {}}).encode(), b"k", "@0:17", "missing field(s): proc"),
        (json.dumps({"id": "a", "proc": "sl_deposit"}).encode(), b"a", "@0:17", "missing field(s): args"),
        (json.dumps({**GOOD, "code": "import os"}).encode(), b"k", "@0:17", "unknown field(s): code"),
        (json.dumps({**GOOD, "proc": "drop_tables"}).encode(), b"k", "r-1", "unknown procedure 'drop_tables'"),
        (
            json.dumps({**GOOD, "args": {**GOOD["args"], "asset": "x"}}).encode(),
            b"k",
            "r-1",
            "argument 'asset': expected integer",
        ),
        (b"x" * 2000, b"big", "@0:17", "request too large: 2000 bytes > limit 1000"),
    ],
)
def test_bad_messages_become_rejections_never_exceptions(value, key, expected_id, error):
    request_id, proc, reason = parse(value, key)
    assert request_id == expected_id and proc is None and error in reason


NS = "t"  # the namespace of every record here


def first(token="s1", sequencer=0, sequencers=1, namespace=NS):
    """A log's first start record: its token becomes the log's identity."""
    return encode_start(namespace, None, token, None, sequencer, sequencers)


def start(token, sequencer=0, sequencers=1, log="s1"):
    """A later start record of log `log`."""
    return encode_start(NS, log, token, None, sequencer, sequencers)


def batch_record(
    epoch, generation, entries=(["a", None, "x"],), offsets=None, log_id="s1", sequencer=0, time_ms=None, namespace=NS
):
    """A batch of sequencer `sequencer` whose start record is at offset `generation`."""
    return encode_batch(
        epoch,
        generation,
        1000 + epoch if time_ms is None else time_ms,
        offsets or {0: (0, 1)},
        [encode_entry(e) for e in entries],
        log_id=log_id,
        sequencer=sequencer,
        namespace=namespace,
    )


def test_batch_record_round_trip():
    kind, batch = decode(
        batch_record(4, 2, [["a", "p", {"x": 1}], ["b", None, "bad"]], {0: (3, 9), 2: (0, 1)}, sequencer=1), NS, "s1"
    )
    assert kind == BATCH
    assert (batch.epoch, batch.generation, batch.time_ms, batch.sequencer) == (4, 2, 1004, 1)
    assert batch.offsets == {0: [3, 9], 2: [0, 1]}
    assert batch.entries == [["a", "p", {"x": 1}], ["b", None, "bad"]]


def test_cursor_accepts_next_batch_of_current_generation_only():
    cursor = LogCursor(namespace=NS)
    assert cursor.accept(first(), 0) is None and cursor.generation == 1
    assert cursor.accept(batch_record(1, 0), 1).batch_id == 1
    assert cursor.accept(batch_record(1, 0), 2) is None  # a repeat (e.g. visible aborted copy)
    assert cursor.accept(start("s2"), 3) is None and cursor.generation == 2
    assert cursor.accept(batch_record(2, 0), 4) is None  # a fenced sequencer's late write
    accepted = cursor.accept(batch_record(2, 3, offsets={0: (1, 5)}), 5)
    assert accepted.batch_id == 2 and accepted.log_offset == 5
    assert cursor.to_dict() == {
        "next_batch": 3,
        "generation": 2,
        "next_offset": 6,
        "request_offsets": {0: 5},
        "log_id": "s1",
        "lanes": {0: [3, 3]},
        "sequencers": 1,
        "time_ms": 1002,
        "procedures": None,
        "placed": True,
        "starts": ["s1", "s2"],
    }
    assert LogCursor.from_dict(cursor.to_dict(), NS) == cursor


def test_a_copy_of_a_start_record_already_met_is_passed_over_and_named():
    cursor = LogCursor(namespace=NS)
    cursor.accept(first("s1", 0, 2), 0)
    cursor.accept(start("b", 1, 2), 1)
    cursor.accept(start("old", 0, 1), 2)  # once reconfigured to one sequencer...
    cursor.accept(start("s2", 0, 2), 3)  # ...and back to two
    cursor.accept(start("b2", 1, 2), 4)
    assert cursor.accept(batch_record(1, 3, offsets={0: (0, 2)}), 5).batch_id == 1
    copies = [first("s1", 0, 2), start("b2", 1, 2), start("old", 0, 1), start("s2", 0, 2)]
    for offset, copy in enumerate(copies, 6):  # the log's first, the current ones, another count's
        assert cursor.accept(copy, offset) is None
    assert cursor.lanes == {0: [3, 2], 1: [4, 1]} and cursor.sequencers == 2 and cursor.generation == 5
    assert [why for _, why in cursor.unreported] == [
        "not signed with this namespace's log secret for log s1",  # the first is sealed as the first
        "a copy of an earlier start record of sequencer 1 of 2 (a start record opens its generation once)",
        "a copy of an earlier start record of sequencer 0 of 1 (a start record opens its generation once)",
        "a copy of an earlier start record of sequencer 0 of 2 (a start record opens its generation once)",
    ]
    # The live lanes go on as if the copies were not there, in every reader: one resumed too.
    resumed = LogCursor.from_dict(cursor.to_dict(), NS)
    for reader in (cursor, resumed):
        assert reader.accept(batch_record(2, 3, offsets={0: (2, 3)}), 10).batch_id == 2
        assert reader.accept(batch_record(1, 4, sequencer=1, offsets={1: (0, 1)}), 11).batch_id == 3
        assert reader.stale == 0


def test_a_cursor_remembers_the_latest_start_records_only():
    from ordo.log.records import START_MEMORY

    cursor = LogCursor(namespace=NS)
    cursor.accept(first("s1"), 0)
    for offset in range(1, START_MEMORY + 2):
        cursor.accept(start(f"t{offset}"), offset)
    assert len(cursor.starts) == START_MEMORY and "t1" not in cursor.starts and "t2" in cursor.starts
    # A copy of a start record that old opens a stale lane: counted and said (reader.py), never silent.
    cursor.accept(start("t1"), START_MEMORY + 2)
    assert cursor.lanes == {0: [START_MEMORY + 2, 1]} and not cursor.unreported
    assert cursor.accept(batch_record(1, START_MEMORY + 1), START_MEMORY + 3) is None and cursor.stale == 1


def test_batches_of_several_sequencers_are_numbered_in_log_order():
    cursor = LogCursor(namespace=NS)
    cursor.accept(first("s1", 0, 2), 0)
    cursor.accept(start("b", 1, 2), 1)
    assert cursor.accept(batch_record(1, 1, sequencer=1, offsets={1: (0, 4)}), 2).batch_id == 1
    assert cursor.accept(batch_record(1, 0, sequencer=0, offsets={0: (0, 3)}), 3).batch_id == 2
    assert cursor.accept(batch_record(1, 1, sequencer=1), 4) is None  # a repeat of sequencer 1's
    assert cursor.accept(batch_record(2, 1, sequencer=1, offsets={1: (4, 6)}), 5).batch_id == 3
    assert cursor.request_offsets == {0: 3, 1: 6}
    cursor.accept(start("a2", 0, 2), 6)  # sequencer 0 restarts; its epochs go on
    assert cursor.accept(batch_record(2, 0, sequencer=0), 7) is None and cursor.stale == 1  # the fenced one's
    assert cursor.accept(batch_record(2, 6, sequencer=0, time_ms=5), 8).batch_id == 4 and cursor.stale == 0
    assert cursor.lanes == {0: [6, 3], 1: [1, 3]}
    assert cursor.accept(batch_record(3, 1, sequencer=1, time_ms=500), 9).time_ms == 1002  # never goes back
    with pytest.raises(LogError, match="expected batch 4 of sequencer 1, found batch 6"):
        cursor.accept(batch_record(6, 1, sequencer=1), 10)


def test_a_new_sequencer_count_closes_every_lane():
    cursor = LogCursor(namespace=NS)
    cursor.accept(first("s1", 0, 2), 0)
    cursor.accept(start("b", 1, 2), 1)
    cursor.accept(batch_record(1, 1, sequencer=1), 2)
    cursor.accept(start("c", 0, 1), 3)  # reconfigured to one sequencer
    assert cursor.lanes == {0: [3, 1]} and cursor.sequencers == 1
    # A batch of the closed lane (a stray sequencer of the earlier count) is stale, and counted.
    assert cursor.accept(batch_record(2, 1, sequencer=1), 4) is None and cursor.stale == 1
    assert cursor.accept(batch_record(1, 3), 5).batch_id == 2


def test_a_start_record_names_a_sequencer_within_its_count():
    cursor = LogCursor(namespace=NS)
    assert cursor.accept(seal(msgpack.packb([0, "t", None, 2, 2]), record_context(NS, None)), 0) is None
    assert cursor.foreign == 1


def test_cursor_refuses_to_skip_a_missing_batch():
    cursor = LogCursor(namespace=NS)
    cursor.accept(first(), 0)
    with pytest.raises(LogError, match="expected batch 1 of sequencer 0, found batch 3"):
        cursor.accept(batch_record(3, 0), 1)


def test_unreadable_record_is_skipped_alike_by_every_reader_and_a_lost_batch_still_shows():
    cursor = LogCursor(namespace=NS)
    cursor.accept(first(), 0)
    assert cursor.accept(seal(b"\xc1garbage", record_context(NS, "s1")), 1) is None and cursor.foreign == 1
    no_token = seal(msgpack.packb([0, 7]), record_context(NS, "s1"))  # a start without a token
    assert cursor.accept(no_token, 2) is None and cursor.foreign == 2
    assert [offset for offset, _ in cursor.unreported] == [1, 2]  # each one reported
    assert cursor.accept(batch_record(1, 0), 3).batch_id == 1
    with pytest.raises(LogError, match="expected batch 2 of sequencer 0, found batch 3"):
        cursor.accept(batch_record(3, 0), 4)


def test_a_batch_of_another_log_is_refused():
    cursor = LogCursor(namespace=NS)
    cursor.accept(first(), 0)
    cursor.accept(batch_record(1, 0), 1)
    restored = LogCursor.from_dict(cursor.to_dict(), NS)
    restored.accept(first("t9"), 2)  # what a restarted, empty broker's new log shows
    with pytest.raises(LogMismatch, match=r"belongs to log t9, not to log s1.*`ordo log skip --offset 3`"):
        restored.accept(batch_record(1, 2, log_id="t9"), 3)


def test_a_genuine_record_of_another_namespace_or_a_copy_of_the_first_start_is_passed_over_like_a_forgery():
    cursor = LogCursor(namespace=NS)
    cursor.accept(first(), 0)
    assert cursor.accept(first("o1", 1, 2, namespace="other"), 1) is None  # another namespace's start, S=2
    assert cursor.accept(batch_record(1, 0, log_id="s1", namespace="other"), 2) is None  # same log id, even
    assert cursor.accept(first(), 3) is None  # a copy of this log's first start record
    assert cursor.lanes == {0: [0, 1]} and cursor.sequencers == 1 and cursor.stale == 0
    assert [offset for offset, _ in cursor.unreported] == [1, 2, 3] and cursor.dropped == 3
    assert cursor.accept(batch_record(1, 0), 4).batch_id == 1


def test_a_log_without_its_head_is_refused():
    with pytest.raises(LogError, match="does not begin with a sequencer's start record"):
        LogCursor(namespace=NS).accept(batch_record(900, 3), 5000)


def test_batches_ignored_after_a_start_no_batch_followed_are_counted():
    cursor = LogCursor(namespace=NS)
    cursor.accept(first(), 0)
    cursor.accept(batch_record(1, 0), 1)
    cursor.accept(start("forged"), 2)
    for offset, epoch in enumerate(range(2, 8), start=3):
        assert cursor.accept(batch_record(epoch, 0), offset) is None
    assert cursor.stale == 6 and cursor.next_batch == 2
    cursor.accept(start("s3"), 9)
    assert cursor.accept(batch_record(2, 9), 10).batch_id == 2 and cursor.stale == 0


@st.composite
def sequencer_logs(draw):
    """Records of S sequencers interleaved on one log, with what a broker and restarts leave
    in it: repeats of a batch (a visible aborted copy), restarts (a new start record for a
    lane) and the fenced predecessor's one late batch; and the (sequencer, epoch) of every
    batch a reader must accept, in log order."""
    sequencers = draw(st.integers(1, 3))
    records = [first("s0", 0, sequencers), *(start(f"s{k}", k, sequencers, log="s0") for k in range(1, sequencers))]
    generation = {k: k for k in range(sequencers)}
    epoch = {k: 1 for k in range(sequencers)}
    last = {}
    expected = []
    for action, k in draw(
        st.lists(
            st.tuples(
                st.sampled_from(["batch", "batch", "batch", "repeat", "restart"]), st.integers(0, sequencers - 1)
            ),
            max_size=40,
        )
    ):
        if action == "batch":
            last[k] = batch_record(
                epoch[k],
                generation[k],
                offsets={k: (epoch[k] - 1, epoch[k])},
                sequencer=k,
                time_ms=draw(st.integers(0, 5000)),
                log_id="s0",
            )
            records.append(last[k])
            expected.append((k, epoch[k]))
            epoch[k] += 1
        elif action == "repeat" and k in last:
            records.append(last[k])
        elif action == "restart":
            old = generation[k]
            generation[k] = len(records)
            records.append(start(f"r{len(records)}", k, sequencers, log="s0"))
            if draw(st.booleans()):  # the fenced one's transaction in flight shows up late
                records.append(batch_record(epoch[k], old, sequencer=k, log_id="s0"))
    return records, expected


@settings(max_examples=200, deadline=None)
@given(sequencer_logs(), st.data())
def test_every_reader_accepts_the_same_batches_of_several_sequencers_whenever_it_resumes(log, data):
    records, expected = log
    whole = LogCursor(namespace=NS)
    accepted = [whole.accept(value, offset) for offset, value in enumerate(records)]
    batches = [batch for batch in accepted if batch is not None]
    assert [(b.sequencer, b.epoch) for b in batches] == expected
    assert [b.batch_id for b in batches] == list(range(1, len(expected) + 1))
    times = [b.time_ms for b in batches]
    assert times == sorted(times)
    # A reader that stops anywhere and resumes from its persisted cursor sees the same.
    cut = data.draw(st.integers(0, len(records)))
    first = LogCursor(namespace=NS)
    resumed = [first.accept(value, offset) for offset, value in enumerate(records[:cut])]
    second = LogCursor.from_dict(first.to_dict(), NS)
    resumed += [second.accept(value, offset) for offset, value in enumerate(records[cut:], start=cut)]
    assert [(b.batch_id, b.sequencer, b.epoch, b.time_ms) for b in resumed if b is not None] == [
        (b.batch_id, b.sequencer, b.epoch, b.time_ms) for b in batches
    ]
    assert second.to_dict() == whole.to_dict()


def test_recent_ids_forget_the_oldest_beyond_capacity():
    recent = RecentIds(3)
    recent.add_batch_entries([["a", "p", {}], ["b", None, "bad"], ["c", "p", {}], ["d", "p", {}]])
    assert "a" in recent and "b" not in recent and len(recent) == 3
    recent.add("e")
    assert "a" not in recent and {"c", "d", "e"} <= {i for i in "cde" if i in recent}


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 6),
    before=st.lists(st.integers(0, 30), max_size=20, unique=True),
    after=st.lists(st.integers(31, 60), max_size=20, unique=True),
)
def test_recent_ids_rolled_back_to_a_mark_are_the_memory_as_it_was_then(capacity, before, after):
    """A sequencer handing its lane over takes back the ids of its unaccepted batches: the
    memory is then exactly what it was at the mark, including what those ids pushed out."""
    recent, reference = RecentIds(capacity), RecentIds(capacity)
    for n in before:
        recent.add(str(n))
        reference.add(str(n))
    mark = recent.mark()
    for n in after:
        recent.add(str(n))
    assert recent.rollback(mark)
    assert list(recent._order) == list(reference._order) and recent._ids == reference._ids
    recent.add("61")
    reference.add("61")
    assert list(recent._order) == list(reference._order)


def test_recent_ids_refuse_a_rollback_beyond_what_they_can_take_back(monkeypatch):
    import ordo.sequencer.dedupe as dedupe

    monkeypatch.setattr(dedupe, "ROLLBACK_LIMIT", 1)  # it remembers one id it pushed out
    recent = dedupe.RecentIds(2)
    recent.add("x")
    recent.add("y")
    mark = recent.mark()
    for n in "abc":  # push out x, y and a: three to take back
        recent.add(n)
    assert not recent.rollback(mark) and list(recent._order) == ["b", "c"]


@pytest.mark.parametrize("namespace", ["", "a b", "slθ", "x" * 201, ".hidden"])
def test_namespaces_that_kafka_cannot_name_are_refused(namespace):
    from ordo.broker.topics import Topics

    with pytest.raises(ValueError, match="invalid namespace"):
        Topics(namespace)


def test_a_record_not_signed_with_the_log_secret_is_dropped_and_reported_and_changes_nothing():
    cursor = LogCursor(namespace=NS)
    cursor.accept(first(), 0)
    genuine = batch_record(1, 0)
    forged_body = genuine[:-32]
    assert cursor.accept(forged_body + tag(b"log", forged_body, key=b"not-the-secret-at-all"), 1) is None
    assert cursor.accept(forged_body, 2) is None  # no tag at all
    assert cursor.accept(batch_record(6, 0)[:-32] + bytes(32), 3) is None  # ahead: no gap, no stop
    assert cursor.accept(genuine, 4).batch_id == 1  # the sequencer's own batch of that epoch
    assert cursor.dropped == 3 and [offset for offset, _ in cursor.unreported] == [1, 2, 3]
