"""`ordo demo`, the README's first command: the whole pipeline on embedded defaults, with
bad requests among the good ones, ends with every outcome and a state that a plain serial
reading of the log confirms."""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers import ROOT, ordo_output


def test_the_readme_first_screen_runs_the_demo():
    with open(os.path.join(ROOT, "README.md")) as f:
        first_block = f.read().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in first_block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert commands[0].endswith("&& .venv/bin/ordo demo")
    assert commands[1].endswith("&& .venv/bin/python -m pytest")


@pytest.mark.slow
@pytest.mark.parametrize("options", [[], ["--workload", "voter", "--scheduler", "vll", "--partitions", "2"]],
                         ids=["defaults", "voter-vll-2"])
def test_demo_ends_with_every_outcome_and_a_confirmed_state(options):
    out = ordo_output("demo", "--count", "600", *options, timeout=300)
    assert re.search(r"outcomes\s+604 of 604 in ", out), out  # 600, a duplicate and three bad ones
    committed, aborted, rejected = map(int, re.search(
        r"committed ([\d,]+), aborted ([\d,]+), rejected ([\d,]+)", out).groups())
    assert committed + aborted + rejected == 604 and rejected == 4 and committed > 0
    assert "demo-bad-json: invalid JSON" in out
    assert "demo-unknown: unknown procedure 'no_such_procedure'" in out
    assert "demo-bad-args: sl_deposit: argument 'account': expected integer, got string" in out
    assert "was rejected: True" in out
    assert "gives the same state: yes" in out
    assert out.count("  record     {") == 3
    if "voter" in options:
        assert re.search(r"top3\s+#\d+ \(\d+ votes\)", out), out
