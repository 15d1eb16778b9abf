"""Every code block of docs/*.md marked ```python runnable runs as written: in a fresh
interpreter, in examples/ (so `from bank import app` works), after which every `test_*`
function it defines is called and every ordo.App it declares is loaded."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

BLOCK = re.compile(r"^```python runnable\n(.*?)^```$", re.MULTILINE | re.DOTALL)
AFTER = """
import ordo.app as _app
for _name, _value in list(globals().items()):
    if isinstance(_value, _app.App):
        _value.registry()
    elif _name.startswith("test_") and callable(_value):
        _value()
"""


def runnable_blocks() -> list[tuple[str, int, str]]:
    blocks = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        text = open(path).read()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((os.path.relpath(path, ROOT), line, match.group(1)))
    return blocks


def test_the_docs_mark_their_runnable_blocks():
    assert len(runnable_blocks()) >= 4


@pytest.mark.parametrize("where, line, code", runnable_blocks(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_runnable_block_of_the_docs_runs(where, line, code):
    done = subprocess.run(
        [sys.executable, "-c", code + AFTER],
        cwd=os.path.join(ROOT, "examples"),
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{where}:{line}\n{done.stderr}"


def readme_data_dirs() -> list[str]:
    """The data directories the README's commands create, relative to the repository (a
    command after `cd examples` creates its directory there)."""
    text = open(os.path.join(ROOT, "README.md")).read()
    found = []
    for block in re.findall(r"^```(?:sh|bash)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
        where = ""
        for line in block.splitlines():
            if line.strip() == "cd examples":
                where = "examples/"
            found += [where + os.path.normpath(path) for path in re.findall(r"--data-dir (\S+)", line)]
    return found


def test_the_data_directories_of_the_readmes_commands_are_ignored_by_git():
    paths = readme_data_dirs()
    assert "examples/bank-data" in paths and "examples/kafka-data" in paths
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    for path in paths:
        done = subprocess.run(["git", "check-ignore", "-q", path + "/"], cwd=ROOT)
        assert done.returncode == 0, f"{path}/ is not in .gitignore: `git status` lists it after the README's commands"


def test_docs_that_show_pytest_functions_say_how_to_install_pytest():
    """pytest is not in the core install (pyproject's dependencies), so a page whose examples
    are test functions says how to get it, next to where `ordo.testing` is documented."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert not any(d.startswith("pytest") for d in project["dependencies"])
    showing = sorted({where for where, _, code in runnable_blocks() if re.search(r"^def test_", code, re.MULTILINE)})
    assert "docs/procedures.md" in showing
    for where in showing:
        text = open(os.path.join(ROOT, where)).read()
        assert "pip install pytest" in text, where
    testing = open(os.path.join(ROOT, "docs", "procedures.md")).read().split("## Testing procedures without Kafka")[1]
    assert "pip install pytest" in testing.split("```")[0]  # before its first example
