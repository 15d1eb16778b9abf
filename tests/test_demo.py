"""`ordo demo`, the README's first command: the whole pipeline on embedded defaults, with
bad requests among the good ones, ends with every outcome and a state that a plain serial
reading of the log confirms."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT


def test_the_demo_counts_every_request_it_sends_alike():
    from ordo.demo import BAD_REQUESTS, demo_requests, intro
    from ordo.procedures.workloads import ALL_WORKLOADS

    for workload in ("sl", "tpcc"):
        requests = demo_requests(ALL_WORKLOADS[workload], 20_000)
        sent = len(requests) + len(BAD_REQUESTS)  # what "What happened" answers "N of N" of
        line = intro(requests, workload, "serial", 1)
        assert line.startswith(f"{sent:,} requests — {len(requests) - 1:,} of workload {workload}, "), line
        assert requests[-1]["id"] == requests[0]["id"]
    assert intro(demo_requests(ALL_WORKLOADS["sl"], 20_000), "sl", "serial", 1).startswith(
        "20,004 requests — 20,000 of workload sl, a second one under the first one's id and 3 malformed ones"
    )


def test_the_readme_first_screen_runs_the_demo():
    with open(os.path.join(ROOT, "README.md")) as f:
        first_block = f.read().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in first_block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert commands[0].endswith("&& .venv/bin/ordo demo")
    assert commands[1].endswith("&& .venv/bin/python -m pytest")


@pytest.mark.slow
@pytest.mark.parametrize(
    "options", [[], ["--workload", "voter", "--scheduler", "vll", "--partitions", "2"]], ids=["defaults", "voter-vll-2"]
)
def test_demo_ends_with_every_outcome_and_a_confirmed_state(options):
    done = subprocess.run(
        [sys.executable, "-m", "ordo.cli", "demo", "--count", "600", *options],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "where clients do not authenticate" not in done.stderr  # the demo's broker is on the loopback
    # 600 requests, a second copy of the first and three malformed ones, counted alike throughout
    workload = options[1] if options else "sl"
    assert (
        f"604 requests — 600 of workload {workload}, a second one under the first one's id and 3 malformed ones"
        in out.splitlines()[1]
    ), out
    assert not re.search(r"\b(600|601|603) requests\b", out), out
    committed, aborted, rejected = map(
        int,
        re.search(
            r"604 of 604 requests answered: ([\d,]+) committed, ([\d,]+) aborted, ([\d,]+) rejected", out
        ).groups(),
    )
    assert committed + aborted + rejected == 604 and rejected == 4 and committed > 0
    assert "demo-bad-json: invalid JSON" in out
    assert "demo-unknown: unknown procedure 'no_such_procedure'" in out
    assert "demo-bad-args: sl_deposit: argument 'account': expected integer, got string" in out
    assert re.search(r"the second request with id \S+: duplicate request id ", out), out
    if aborted:
        assert "Aborted: the procedure ran and decided not to commit" in out
        reasons = re.findall(r"^    ([\d,]+) × ", out, re.MULTILINE)
        assert reasons and sum(int(n.replace(",", "")) for n in reasons) <= aborted
    assert "Executing the logged requests one by one, in log order, from an empty state gives exactly the state" in out
    assert out.count('\n    {"table": ') == 3
    assert '{"table": "window.' not in out and '{"table": "stream.' not in out  # the app's records, as ordo dump
    assert "sequencer generation" not in out and "was rejected: True" not in out and "plain serial" not in out
    assert out.rstrip().splitlines()[-1].startswith("Next: ")
    if "voter" in options:
        assert re.search(r"top3\s+#\d+ \(\d+ votes\)", out), out


@pytest.mark.slow
def test_ctrl_c_stops_the_demo_and_leaves_nothing_behind():
    demo = subprocess.Popen(
        [sys.executable, "-m", "ordo.cli", "demo", "--count", "300000"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    data_dir = bootstrap = None
    for line in demo.stdout:
        lines.append(line)
        found = re.search(r"broker on (\S+) keeps the log; the engine keeps its state in (\S+)\.$", line)
        if found:
            bootstrap, data_dir = found.groups()
            break
    assert data_dir, lines
    time.sleep(10)  # the engine is at work on the requests
    os.killpg(demo.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: the demo's whole process group
    rest, _ = demo.communicate(timeout=120)
    assert demo.returncode == 130, rest
    assert re.search(r"^Stopped by SIGINT after [\d,]+ of 300,004 outcomes", rest, re.MULTILINE), rest
    assert "restarting" not in rest and "Traceback" not in rest
    assert not os.path.exists(data_dir)
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", f"ordo.cli sequence --bootstrap-servers {bootstrap}"], capture_output=True)
    assert left.stdout == b"", "a sequencer outlived the demo"
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.socket() as probe:
        assert probe.connect_ex((host, int(port))) != 0, "the demo's broker outlived it"
