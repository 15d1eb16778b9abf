"""Typed arguments: Float, Bool, Object, Optional and lists of them, checked with errors that
name the field, logged in the form every engine runs (an integer given for a Float is
logged as that float, a left-out Optional as its default), covered by the procedure-set
identity, and exactly the same floats in every scheduler, partition count and replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from ordo import Bool, Float, Int, List, Object, Optional, Str
from ordo.procedures.args import ArgumentError, check_args
from ordo.procedures.fingerprint import describe
from ordo.testing import TestEngine
from tests import typed_app
from tests.helpers import ROOT, stop

SCHEMA = {
    "price": Float(0),
    "gift": Optional(Bool(), False),
    "meta": Object(),
    "tags": Optional(List(Str(8)), []),
    "size": Object({"w": Float(), "h": Optional(Float(), 1)}),
}


def test_fields_are_checked_and_brought_to_their_logged_form():
    args = {"price": 3, "meta": {"a": [1, 2.5, None, True]}, "size": {"w": 2}}
    assert check_args(SCHEMA, args) == {
        "price": 3.0,
        "meta": {"a": [1, 2.5, None, True]},
        "size": {"w": 2.0, "h": 1.0},
        "gift": False,
        "tags": [],
    }
    assert type(args["price"]) is float and type(args["size"]["h"]) is float  # in place: what the log holds


@pytest.mark.parametrize(
    "args, message",
    [
        ({"price": "1.5", "meta": {}, "size": {"w": 1}}, "argument 'price': expected number, got string"),
        ({"price": True, "meta": {}, "size": {"w": 1}}, "argument 'price': expected number, got boolean"),
        ({"price": -1.0, "meta": {}, "size": {"w": 1}}, "argument 'price': -1.0 outside [0, inf]"),
        ({"price": 1.0, "gift": 1, "meta": {}, "size": {"w": 1}}, "argument 'gift': expected boolean, got integer"),
        ({"price": 1.0, "meta": [], "size": {"w": 1}}, "argument 'meta': expected object, got list"),
        ({"price": 1.0, "meta": {}, "size": {"w": "x"}}, "argument 'size.w': expected number, got string"),
        ({"price": 1.0, "meta": {}, "size": {}}, "missing argument(s): size.w"),
        ({"price": 1.0, "meta": {}, "size": {"w": 1, "d": 2}}, "unknown argument(s): size.d"),
        (
            {"price": 1.0, "meta": {}, "size": {"w": 1}, "tags": ["x", 2]},
            "argument 'tags[1]': expected string, got integer",
        ),
        ({"price": 2**60, "meta": {}, "size": {"w": 1}}, f"argument 'price': integer {2**60} has no exact float"),
    ],
)
def test_errors_name_the_field(args, message):
    with pytest.raises(ArgumentError) as raised:
        check_args(SCHEMA, args)
    assert str(raised.value) == message


def test_optional_defaults_are_private_copies_and_part_of_the_identity():
    field = Optional(List(Int()), [1])
    first, second = check_args({"x": field}, {}), check_args({"x": field}, {})
    first["x"].append(2)
    assert second["x"] == [1]
    from ordo.procedures.registry import Registry
    from ordo.procedures.contract import Procedure

    def registry(default) -> Registry:
        built = Registry()
        built.add_procedure(Procedure("p", {"x": Optional(Int(), default)}, lambda a: ((), ()), lambda c, a: None))
        return built

    assert describe(registry(1))["procedures"]["p"] != describe(registry(2))["procedures"]["p"]


FLOATS = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
LINE = st.fixed_dictionaries(
    {
        "cart": st.integers(0, 5),
        "item": st.sampled_from(["tea", "pan", "cup"]),
        "price": st.one_of(FLOATS, st.integers(0, 10**6)),
    },
    optional={
        "qty": st.integers(1, 100),
        "gift": st.booleans(),
        "tags": st.lists(st.sampled_from(["a", "b"]), max_size=2),
    },
)


@settings(max_examples=15, deadline=None)
@given(st.lists(LINE, min_size=1, max_size=40))
def test_floats_are_the_same_bits_on_every_scheduler_and_partition_count(lines):
    requests = [{"id": f"r{i}", "proc": "add_line", "args": line} for i, line in enumerate(lines)]
    seen = []
    for scheduler, partitions in (("serial", 1), ("locking", 2), ("vll", 2), ("opchain", 1)):
        engine = TestEngine(typed_app.app, scheduler=scheduler, partitions=partitions)
        try:
            outcomes = engine.run([dict(r, args=dict(r["args"])) for r in requests], batch_size=7)
            seen.append(([(o["status"], o["result"]) for o in outcomes], engine.state()))
        finally:
            engine.close()
    assert all(s == seen[0] for s in seen)
    assert all(status == "committed" for status, _ in seen[0][0])
    assert all(type(total) is float for _, total in seen[0][0])


@pytest.mark.slow
def test_typed_requests_through_ordo_run_and_a_replay(broker, namespace, tmp_path):
    from ordo.client import Client

    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    data = str(tmp_path / "live")
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            data,
            "--app",
            "tests.typed_app:app",
            "--runtime",
            "local",
            "--partitions",
            "2",
            "--scheduler",
            "locking",
            "--quiet",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics()
            ids = [
                client.submit("add_line", {"cart": 1, "item": "tea", "price": 0.1}, request_id="a"),
                client.submit("add_line", {"cart": 1, "item": "pan", "price": 0.2, "qty": 3}, request_id="b"),
                client.submit("add_line", {"cart": 1, "item": "cup", "price": 7, "gift": True}, request_id="c"),
                client.submit(
                    "annotate",
                    {"cart": 1, "note": {"text": "ok", "rating": 4.5, "extra": {"k": [1, "x", None]}}},
                    request_id="d",
                ),
                client.submit("annotate", {"cart": 2, "note": {"text": "no", "rating": 6}}, request_id="e"),
                client.submit("add_line", {"cart": 2, "item": "tea", "price": "1"}, request_id="f"),
            ]
            outcomes = client.wait(ids, timeout=120)
    finally:
        assert stop(engine) == 0
    assert outcomes["a"]["result"] == 0.1
    assert outcomes["b"]["result"] == 0.1 + 0.2 * 3  # the same float arithmetic, the same bits
    assert outcomes["c"]["result"] == outcomes["b"]["result"]  # a gift costs nothing
    assert outcomes["d"]["result"] == {"text": "ok", "rating": 4.5, "extra": {"k": [1, "x", None]}}
    assert outcomes["e"]["status"] == "rejected" and "'note.rating': 6.0 outside [0, 5]" in outcomes["e"]["error"]
    assert outcomes["f"]["status"] == "rejected" and "'price': expected number, got string" in outcomes["f"]["error"]

    def digest(folder: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "ordo.cli", "digest", "--data-dir", folder],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout

    rebuilt = str(tmp_path / "rebuilt")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "recover",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            rebuilt,
            "--app",
            "tests.typed_app:app",
            "--from-scratch",
            "--runtime",
            "local",
            "--quiet",
            "--idle",
            "0",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=180,
    )
    assert digest(rebuilt) == digest(data)
    dumped = subprocess.run(
        [sys.executable, "-m", "ordo.cli", "dump", "--data-dir", rebuilt, "--table", "cart"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    cart = json.loads(dumped.splitlines()[0])["value"]
    assert cart["lines"][1] == ["pan", 0.2, 3, False, []] and cart["lines"][2][3] is True
