"""No message can stop the sequencer: whatever bytes arrive, `parse_request` gives one log
entry that msgpack encodes, and the real sequencer logs one rejection per hostile message
and goes on sequencing the requests after it."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordo.procedures.args import Int, Str, value_problem
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.registry import default_registry
from ordo.sequencer.wire import MAX_DEPTH, parse_request

registry = default_registry()
DEPOSIT = {"account": 1, "asset": 2, "account_amount": 3, "asset_amount": 4}


class Anything:
    """A field type of a user's own that lets any value by: the wire must not rely on
    schemas alone to keep the log encodable."""

    def check(self, name, value):
        return value


registry.add_table(Table("loose"))
registry.add_procedure(
    Procedure(
        "loose_put",
        {"key": Int(0), "value": Anything()},
        lambda args: ([], [("loose", args["key"])]),
        lambda ctx, args: None,
    )
)


def parse(value, key=b"k"):
    return parse_request(value, key, 3, 17, registry, 1 << 20)


def loggable(entry) -> list:
    """`entry`, checked to be what the log can carry: msgpack round-trips it unchanged."""
    assert type(entry) is list and len(entry) == 3
    request_id, proc, third = entry
    assert type(request_id) is str and request_id
    if proc is None:
        assert type(third) is str and third
    else:
        assert proc in registry.procedures
    raw = msgpack.packb(entry)
    assert msgpack.unpackb(raw, strict_map_key=False, use_list=True) == entry
    return entry


def request(**fields) -> bytes:
    return json.dumps({"id": "r", "proc": "sl_deposit", "args": DEPOSIT, **fields}).encode()


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


HOSTILE = {
    "surrogate-id": (request(id="a\ud800"), "lone surrogate"),
    "surrogate-proc": (request(proc="\udfff"), "lone surrogate"),
    "surrogate-arg": (
        json.dumps({"id": "r", "proc": "loose_put", "args": {"key": 1, "value": ["ok", {"x": "\ud800"}]}}).encode(),
        "lone surrogate",
    ),
    "surrogate-arg-key": (request(args={**DEPOSIT, "\udc00": 1}), "lone surrogate"),
    "surrogate-field": (
        json.dumps({"id": "r", "proc": "sl_deposit", "args": DEPOSIT, "\ud800": 0}).encode(),
        "lone surrogate",
    ),
    "surrogate-raw-bytes": (
        '{"id": "r\udab0", "proc": "sl_deposit", "args": {}}'.encode("utf-8", "surrogatepass"),
        "not valid Unicode",
    ),
    "deep-top": (nested(20_000).encode(), f"nested deeper than {MAX_DEPTH} levels"),
    "deep-object": (('{"a":' * 5000 + "1" + "}" * 5000).encode(), "nested deeper"),
    "deep-arg": (
        ('{"id": "r", "proc": "loose_put", "args": {"key": 1, "value": ' + nested(1500) + "}}").encode(),
        "nested deeper",
    ),
    "deep-just-over-limit": (
        ('{"id": "r", "proc": "loose_put", "args": {"key": 1, "value": ' + nested(MAX_DEPTH) + "}}").encode(),
        "nested deeper",
    ),
    "huge-int": (request(args={**DEPOSIT, "account": 2**64}), "integer out of range"),
    "huge-negative-int": (request(args={**DEPOSIT, "asset": -(2**63) - 1}), "integer out of range"),
    "huge-int-anything": (
        json.dumps({"id": "r", "proc": "loose_put", "args": {"key": 1, "value": [1, 10**30]}}).encode(),
        "integer out of range",
    ),
    "nan": (b'{"id": "r", "proc": "loose_put", "args": {"key": 1, "value": NaN}}', "NaN is not a JSON number"),
    "infinity": (b'{"id": "r", "proc": "loose_put", "args": {"key": 1, "value": -Infinity}}', "Infinity"),
    "overflowing-float": (b'{"id": "r", "proc": "loose_put", "args": {"key": 1, "value": 1e400}}', "out of range"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_messages_become_loggable_rejections(name):
    value, reason = HOSTILE[name]
    request_id, proc, error = loggable(parse(value, key=name.encode()))
    assert proc is None and reason in error, error
    assert request_id in ("@3:17", "r")  # never the Kafka key: a message names no id but its own readable one


def test_nesting_within_the_limit_and_real_unicode_are_accepted():
    body = {"id": "r-\U0001f600-é", "proc": "loose_put", "args": {"key": 1, "value": json.loads(nested(MAX_DEPTH - 2))}}
    for value in (json.dumps(body).encode(), json.dumps(body, ensure_ascii=False).encode()):
        entry = loggable(parse(value))
        assert entry == [body["id"], "loose_put", body["args"]]
    # Brackets inside strings are not nesting.
    text = {"id": "[" * 200, "proc": "loose_put", "args": {"key": 1, "value": "{" * 500}}
    assert loggable(parse(json.dumps(text).encode()))[1] == "loose_put"


def test_a_key_that_is_not_text_still_gives_a_loggable_id():
    request_id, proc, error = loggable(parse(b"\x00\xff", key=b"\xed\xa0\x80\xff"))
    assert proc is None and "\ud800" not in request_id
    assert loggable(parse(b"{", key=None))[0] == "@3:17"


def test_schemas_cannot_declare_integers_the_log_cannot_hold():
    with pytest.raises(ValueError, match="within"):
        Int(0, 2**64)
    Int(0, 2**64 - 1)
    assert value_problem({"a": [1, ("x", 2.5, None, True)]}) is None
    assert "type set" in value_problem([{1}])


# --- fuzz ---------------------------------------------------------------------------------

any_char = st.one_of(st.characters(), st.characters(categories=["Cs"]))
text = st.one_of(st.text(max_size=8), st.text(any_char, max_size=8), st.sampled_from(["\ud800", "a\udfffb"]))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(2**62, 2**80),
    st.integers(-(2**80), -(2**62)),
    st.floats(),
    text,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=20,
)
DEEP = "__deep__"
# Deep values stay text: as Python objects, building and dumping them would recurse too.
deep_text = st.integers(1, 3000).map(nested)


def fields_for(proc: str):
    schema = registry.procedures[proc].args
    good = {name: 1 if type(field) is Int else "s" if type(field) is Str else [1] for name, field in schema.items()}
    variants = [st.just(good), st.builds(lambda extra, value: {**good, extra: value}, text, values), values]
    if schema:  # a procedure without arguments (a triggered one) has no field to spoil
        variants.append(
            st.builds(
                lambda name, value: {**good, name: value},
                st.sampled_from(sorted(schema)),
                st.one_of(values, st.just(DEEP)),
            )
        )
    return st.one_of(*variants)


procs = st.sampled_from(sorted(registry.procedures))
requests = procs.flatmap(
    lambda proc: st.fixed_dictionaries(
        {
            "id": st.one_of(text, values),
            "proc": st.one_of(st.just(proc), st.just(proc), text, values),
            "args": fields_for(proc),
        },
        optional={"extra": values},
    )
)


def encodings(value):
    """JSON text as clients send it: escaped, raw UTF-8 (surrogates as bytes), UTF-16;
    with a deeply nested value where the request has a placeholder."""

    def texts(deep):
        escaped = json.dumps(value).replace(f'"{DEEP}"', deep)
        raw = json.dumps(value, ensure_ascii=False).replace(f'"{DEEP}"', deep)
        return st.sampled_from([escaped.encode(), raw.encode("utf-8", "surrogatepass"), escaped.encode("utf-16")])

    return deep_text.flatmap(texts)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.one_of(st.none(), st.binary(max_size=20)))
def test_any_bytes_give_one_loggable_entry(value, key):
    loggable(parse(value, key))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(values, st.just(DEEP), requests).flatmap(encodings))
def test_any_json_gives_one_loggable_entry(value):
    loggable(parse(value))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_any_request_gives_one_loggable_entry_and_valid_ones_run(body):
    entry = loggable(parse(json.dumps(body).encode()))
    if entry[1] is not None:
        assert entry == [body["id"], body["proc"], body["args"]]


# --- through the real broker and sequencer -----------------------------------------------


def test_hostile_messages_are_rejected_in_the_log_and_later_requests_sequenced(broker, namespace):
    from kafka import KafkaProducer

    from ordo.embedded import SequencerThread, read_log
    from ordo.sequencer.sequencer import SequencerConfig
    from ordo.broker.topics import ensure_topics

    ensure_topics(broker, namespace, request_partitions=1)
    # The sequencer knows the built-in procedures only; every other check comes first.
    messages = [(name.encode(), value) for name, (value, _) in sorted(HOSTILE.items()) if name != "huge-int-anything"]
    messages.append((b"later", json.dumps({"id": "later", "proc": "sl_deposit", "args": DEPOSIT}).encode()))
    producer = KafkaProducer(bootstrap_servers=broker, max_request_size=10_000_000)
    for key, value in messages:
        producer.send(f"{namespace}.requests", key=key, value=value)
    producer.flush()
    producer.close()
    # A small batch limit puts the hostile messages and the valid one in separate batches.
    sequencer = SequencerThread(broker, namespace, SequencerConfig(max_txns=3)).start()
    try:
        sequencer.wait_for(len(messages), timeout=60)
        last_batch = sequencer.sequencer.next_batch - 1
    finally:
        sequencer.stop()
    entries = [entry for batch in read_log(broker, namespace, last_batch) for entry in batch.entries]
    assert len(entries) == len(messages)
    expected = {name: reason for name, (_, reason) in HOSTILE.items()}
    for (key, _), (request_id, proc, error) in zip(messages[:-1], entries):
        assert proc is None and expected[key.decode()] in error, (key, error)
    assert entries[-1] == ["later", "sl_deposit", DEPOSIT]
