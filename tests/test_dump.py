"""`ordo dump` prints an app's own tables; the engine's tables of output streams and windows
(`stream.*`, `window.*`) only with `--internal` or when named with `--table`, while `ordo
digest` covers every table. Data directories written by the real partition workers
(ordo.testing.TestEngine), read by the real command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import ordo
from ordo import Int, Str
from ordo.testing import TestEngine
from tests.helpers import ROOT

app = ordo.App("noted")
app.table("note", default=None)


@app.procedure(args={"k": Int(0), "text": Str()}, keys=[("note", "k")])
def note(ctx, args):
    ctx.write("note", args["k"], args["text"])
    ctx.emit("noted", [args["k"]])


@app.procedure(args={}, analyze=lambda args: ([], []))
def keep(ctx, batch):
    for item in batch:
        ctx.window_insert("recent", item)


@app.procedure(args={"text": Str()}, keys=[])
def announce(ctx, args):  # writes no table of the app's: only its output stream's
    ctx.emit("announcements", [args["text"]])


app.stream("noted", producers=["note"], consumers=["keep"])
app.window("recent", owner="keep", rows=10, slide=1)
app.stream("announcements", producers=["announce"])


def ordo_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ordo.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=120,
    )


def dumped(*args: str) -> list[tuple[str, object, object]]:
    done = ordo_cli("dump", *args)
    assert done.returncode == 0, done.stderr
    return [(r["table"], r["key"], r["value"]) for r in map(json.loads, done.stdout.splitlines())]


def run(data_dir: str, requests: list[tuple[str, dict]]) -> None:
    with TestEngine(app, partitions=2, data_dir=data_dir) as engine:
        for proc, args in requests:
            assert engine.call(proc, args)["status"] == "committed"


def test_dump_shows_the_apps_tables_and_the_engines_on_request(tmp_path):
    data_dir = str(tmp_path / "d")
    run(data_dir, [("note", {"k": 1, "text": "a"}), ("note", {"k": 2, "text": "b"}), ("announce", {"text": "hi"})])
    assert dumped("--data-dir", data_dir) == [("note", 1, "a"), ("note", 2, "b")]
    everything = dumped("--data-dir", data_dir, "--internal")
    assert [r for r in everything if r[0] == "note"] == [("note", 1, "a"), ("note", 2, "b")]
    assert ("stream.announcements", 0, [["hi"]]) in everything
    assert ("window.recent", 0, {"rows": [[1], [2]]}) in everything
    assert {r[0] for r in everything} == {"note", "stream.announcements", "window.recent"}
    assert dumped("--data-dir", data_dir, "--table", "window.recent") == [
        r for r in everything if r[0] == "window.recent"
    ]
    helped = ordo_cli("dump", "--help")
    assert "--internal" in helped.stdout and "stream.*, window.*" in " ".join(helped.stdout.split())


def test_the_digest_covers_the_engines_tables_too(tmp_path):
    one, other = str(tmp_path / "one"), str(tmp_path / "other")
    run(one, [("announce", {"text": "hi"})])
    run(other, [("announce", {"text": "ho"})])
    assert dumped("--data-dir", one) == dumped("--data-dir", other) == []  # no table of the app's
    digests = [ordo_cli("digest", "--data-dir", d) for d in (one, other)]
    assert all(d.returncode == 0 for d in digests)
    assert digests[0].stdout != digests[1].stdout


def test_an_app_cannot_declare_a_table_under_the_engines_prefixes():
    for name in ("stream.alerts", "window.recent"):
        with pytest.raises(ValueError, match=f"table '{name}': names starting with 'stream.' or 'window.'"):
            ordo.App("x").table(name)
