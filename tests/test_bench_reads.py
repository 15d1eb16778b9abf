"""`ordo bench reads` end to end, briefly: its three measurements on a real engine and
broker, reported in its table and JSON (the figures themselves are docs/benchmarks.md's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow


def test_bench_reads_reports_point_read_latency_and_reads_beside_writes(tmp_path):
    report = tmp_path / "reads.json"
    done = subprocess.run(
        [sys.executable, "-m", "ordo.cli", "bench", "reads", "--seconds", "2", "--json", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "point reads, one at a time: p50" in done.stdout and "writes alone" in done.stdout
    figures = json.loads(report.read_text())
    assert figures["partitions"] == 2 and figures["machine"]["cpus"]
    light, beside = figures["light"], figures["writes_with_reads"]
    assert light["reads"] > 0 and 0 < light["p50_ms"] <= light["p99_ms"]
    assert beside["reads_per_s"] > 0 and beside["read_p50_ms"] <= beside["read_p99_ms"]
    assert figures["writes_alone"]["writes_per_s"] > 0 and beside["writes_per_s"] > 0
    assert figures["writes_kept"] == round(beside["writes_per_s"] / figures["writes_alone"]["writes_per_s"], 3)
