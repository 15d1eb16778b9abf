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
    done = subprocess.run([sys.executable, "-c", code + AFTER], cwd=os.path.join(ROOT, "examples"),
                          env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{where}:{line}\n{done.stderr}"
