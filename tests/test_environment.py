"""A procedure set's environment (procedures/environment.py): the interpreter and the installed
libraries its code imports, by version and code, are part of what a set is, so a replay, a
restart or an upgrade in place in another environment refuses in one line naming what
differs (docs/operations.md, 'What the identity covers').

The library here is a real installed distribution: a wheel built in the test and installed
by pip into a folder of its own, on the path of every process the test starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from ordo.client import Client
from ordo.procedures.environment import environment_changes, interpreter
from ordo.procedures.fingerprint import changes, set_id
from tests.helpers import ROOT, stop, topic_reader

LIBRARY = "ordoenvlib"

APP = f'''"""A shop whose price comes from an installed library."""
import ordo
from ordo import Int

import {LIBRARY}

app = ordo.App("shop")
app.table("till", default=0)


@app.procedure(args={{"till": Int(0), "amount": Int(1)}}, keys=[("till", "till")])
class sell:
    def run(ctx, args):
        total = ctx.read("till", args["till"]) + {LIBRARY}.price(args["amount"])
        ctx.write("till", args["till"], total)
        return total
'''


def _wheel(folder, version: str, body: str) -> str:
    """A wheel of LIBRARY at `version` whose module is `body`."""
    info = f"{LIBRARY}-{version}.dist-info"
    files = {
        f"{LIBRARY}/__init__.py": body,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {LIBRARY}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: ordo-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": f"{LIBRARY}\n",
    }
    path = os.path.join(folder, f"{LIBRARY}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]))
    return path


def _install(tmp_path, version: str, body: str) -> None:
    """pip installs LIBRARY into tmp_path/site-packages, replacing what is there (as pip does
    in an environment of its own: `--target` would leave the old version's metadata)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    target = tmp_path / "site-packages"
    for old in target.glob(f"{LIBRARY}*") if target.exists() else ():
        shutil.rmtree(old)
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--upgrade"]
    done = subprocess.run(
        [*command, "--target", str(target), _wheel(str(wheels), version, body)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


def _env(tmp_path) -> dict:
    path = os.pathsep.join([str(tmp_path / "app"), str(tmp_path / "site-packages"), ROOT])
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}


def _described(tmp_path) -> dict:
    """The shop's set as a fresh process describes it."""
    code = (
        "import json; from ordo.procedures.fingerprint import describe; "
        "from ordo.procedures.loading import load_registry; print(json.dumps(describe(load_registry(['shop:app']))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env(tmp_path), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _project(tmp_path) -> None:
    (tmp_path / "app").mkdir(exist_ok=True)
    (tmp_path / "app" / "shop.py").write_text(APP)


def test_the_environment_names_the_interpreter_and_each_imported_library_by_version_and_code(tmp_path):
    _project(tmp_path)
    _install(tmp_path, "1.0", "def price(amount):\n    return amount\n")
    first = _described(tmp_path)
    assert first["format"] == 4
    assert first["environment"]["python"] == interpreter()
    assert list(first["environment"]["libraries"]) == [LIBRARY]
    assert first["environment"]["libraries"][LIBRARY]["version"] == "1.0"

    # Comments, docstrings and formatting change nothing, as for the project's own code.
    _install(tmp_path, "1.0", '"""Prices."""\n\n\ndef price(amount):  # the same\n    return amount\n')
    assert _described(tmp_path) == first

    _install(tmp_path, "2.0", "def price(amount):\n    return 2 * amount\n")
    second = _described(tmp_path)
    assert second["procedures"] == first["procedures"]  # the project's code is the same
    assert set_id(second) != set_id(first)
    assert changes(first, second) == [f"library {LIBRARY} 1.0 -> 2.0"]

    # Edited where it is installed, its version unchanged: its code tells.
    (tmp_path / "site-packages" / LIBRARY / "__init__.py").write_text("def price(amount):\n    return 3 * amount\n")
    edited = _described(tmp_path)
    assert set_id(edited) not in (set_id(first), set_id(second))
    assert environment_changes(second["environment"], edited["environment"]) == [
        f"library {LIBRARY} 2.0: module {LIBRARY} differs"
    ]
    other = {**first["environment"], "python": "cpython 3.99.0"}
    assert environment_changes(first["environment"], other) == [f"interpreter {interpreter()} -> cpython 3.99.0"]


def _ordo(tmp_path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ordo.cli", *args],
        cwd=tmp_path,
        env=_env(tmp_path),
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _refusal(process: subprocess.Popen, timeout: float = 300) -> str:
    """The one line a refusing command printed; fails unless it exited 2 with just that."""
    try:
        _, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == 2 and len(lines) == 1, err
    return lines[0]


def _outputs(broker: str, namespace: str) -> list:
    found = []
    for topic in (f"{namespace}.results", f"{namespace}.changes"):
        consumer = topic_reader(broker, topic, consumer_timeout_ms=3000, isolation_level="read_uncommitted")
        try:
            found += sorted((topic, m.partition, m.offset, m.key, m.value) for m in consumer)
        finally:
            consumer.close()
    return found


@pytest.mark.slow
def test_after_an_installed_library_changed_a_rebuild_and_a_restart_refuse_in_one_line_and_publish_nothing(
    broker, namespace, tmp_path, fault_report
):
    _project(tmp_path)
    _install(tmp_path, "1.0", "def price(amount):\n    return amount\n")
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    live = str(tmp_path / "live")
    run = ("run", *kafka, "--data-dir", live, "--app", "shop:app", "--runtime", "local", "--quiet")
    engine = _ordo(tmp_path, *run, "--max-delay-ms", "5")
    with Client(broker, namespace) as client:
        client.wait_for_topics()
        ids = [client.submit("sell", {"till": n % 3, "amount": 5}, request_id=f"s-{n}") for n in range(12)]
        outcomes = client.wait(ids, timeout=120)
    assert stop(engine) == 0
    assert outcomes["s-0"]["result"] == 5
    published = _outputs(broker, namespace)

    _install(tmp_path, "2.0", "def price(amount):\n    return 2 * amount\n")
    wanted = f"library {LIBRARY} 1.0 -> 2.0"
    recover = ("recover", *kafka, "--runtime", "local", "--quiet", "--idle", "0", "--from-scratch")
    given = _refusal(_ordo(tmp_path, *recover, "--data-dir", str(tmp_path / "given"), "--app", "shop:app"))
    assert wanted in given and "another environment" in given and "from 1 on" in given, given
    kept = _refusal(_ordo(tmp_path, *recover, "--data-dir", str(tmp_path / "kept")))  # the code the log keeps
    assert wanted in kept, kept
    copy = str(tmp_path / "copy")
    shutil.copytree(live, copy)  # a copy of the engine's own directory publishes by default: it refuses first
    own = _refusal(_ordo(tmp_path, *recover, "--data-dir", copy, "--app", "shop:app"))
    assert wanted in own, own
    restart = _refusal(_ordo(tmp_path, *run))
    assert wanted in restart and "ordo upgrade" in restart, restart
    assert _outputs(broker, namespace) == published, "a refused command published outputs"

    # The way on: an upgrade records the new environment, and the engine runs it.
    upgraded = _ordo(tmp_path, "upgrade", *kafka, "--app", "shop:app")
    _, err = upgraded.communicate(timeout=120)
    assert upgraded.returncode == 0 and "to v2" in err, err
    engine = _ordo(tmp_path, *run, "--max-delay-ms", "5")
    with Client(broker, namespace) as client:
        after = client.wait([client.submit("sell", {"till": 0, "amount": 5}, request_id="s-after")], timeout=120)
    assert stop(engine) == 0
    assert after["s-after"]["result"] == 4 * 5 + 10  # four sales of 5 at price 1, then one at price 2
    fault_report(
        f"12 sales at 1.0; after 2.0 was installed 3 replays and 1 restart refused, nothing published: {wanted}"
    )
