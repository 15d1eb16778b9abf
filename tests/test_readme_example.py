"""The README's quick start, as written: the app and the client shown are the files under
examples/, and its commands, run in a shell, print what the README says."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SECTION = "## Quick start: an app of your own"


def quick_start() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    start = readme.index(SECTION)
    return readme[start : readme.index("\n## ", start + 1)]


def blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of one language ("" for plain ones), in order."""
    found, current, inside = [], [], None
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if inside is None:
                inside, current = line[3:].strip(), []
            else:
                if inside == language:
                    found.append("".join(current))
                inside = None
        elif inside is not None:
            current.append(line)
    return found


def test_the_readme_shows_the_example_files_verbatim():
    section = quick_start()
    app, client = blocks(section, "python")
    for shown, name in ((app, "bank.py"), (client, "bank_client.py")):
        with open(os.path.join(ROOT, "examples", name)) as f:
            assert shown == f.read(), f"README and examples/{name} differ"


@pytest.mark.slow
def test_the_readme_quick_start_runs_as_written(tmp_path):
    section = quick_start()
    [commands] = blocks(section, "bash")
    [expected] = blocks(section, "")
    lines = commands.strip().splitlines()
    # The shell's first line activates the venv the README made; here the venv running the
    # tests stands in for it (its bin directory goes first on PATH).
    assert lines[0] == ". .venv/bin/activate"
    with socket.socket() as s:  # a free port instead of 9092, which may be taken on this machine
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    # Then the README's own stop line, the engine first: both gone once it has run.
    stop_line = stop_lines(section)
    script = "\n".join(
        ["trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT", *lines[1:], stop_line, "wait", "jobs -r | wc -l >&2"]
    ).replace("9092", port)
    shutil.copytree(
        os.path.join(ROOT, "examples"), tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__", "bank-data")
    )
    bin_dir = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(bin_dir, "ordo")):
        pytest.skip(f"no ordo command beside {sys.executable}")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": ROOT}
    process = subprocess.Popen(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, err
    printed = [line for line in out.splitlines() if not line.startswith("broker listening on")]
    assert printed == expected.strip().splitlines(), (out, err)
    said = err.strip().splitlines()
    assert said[-1] == "0", err  # no job left running
    assert any(line.startswith("stopped after batch ") for line in said), err  # the engine stopped of itself
    assert "does not answer" not in err and "Traceback" not in err, err  # before its broker


def stop_lines(section: str) -> str:
    """The command the quick start gives to stop what it started."""
    found = re.search(r"`([^`]*kill[^`]*)` stops the engine, then the broker", section)
    assert found, "the quick start says how to stop the engine and the broker"
    return found.group(1)
