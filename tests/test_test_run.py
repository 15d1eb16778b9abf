"""The test run reads as it goes: a line per test (pyproject.toml's addopts), and none of
kafka-python's DeprecationWarnings (its filterwarnings). Checked by running pytest with the
project's own configuration on two small tests that load kafka-python."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import ROOT

TESTS = """
import kafka
from kafka import KafkaConsumer


def test_loads_kafka_python():
    assert KafkaConsumer


def test_other():
    pass
"""


def test_each_test_is_a_line_and_kafka_python_s_deprecations_are_not_reported(tmp_path):
    (tmp_path / "test_sample.py").write_text(TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", os.path.join(ROOT, "pyproject.toml"), "--rootdir", str(tmp_path)]
        + ["-n", "0", "-p", "no:cacheprovider", str(tmp_path / "test_sample.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for name in ("test_loads_kafka_python", "test_other"):
        assert any(line.startswith(f"test_sample.py::{name} PASSED") for line in lines), done.stdout
    assert "DeprecationWarning" not in done.stdout and "warnings summary" not in done.stdout, done.stdout
