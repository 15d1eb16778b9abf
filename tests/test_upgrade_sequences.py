"""Upgrades in quick succession under load: `ordo upgrade` to v10, at once back to v1, and
five seconds later to v100, while `ordo run` serves 200 requests a second. The same engine
follows each in place, and every acknowledged request gets exactly one outcome, from the
version its batch ran (docs/operations.md, 'Upgrading procedures').

The sequencer is held (SIGSTOP) from before v10 is deployed until its files are back at v1,
as a busy machine holds it: it then reads the upgrade to v10 with v1 on disk, or the log
already back at its own set, the two ways it once left the namespace without a sequencer
(it stopped, and nothing started it again) or stopped the engine, saying another sequencer
had taken its lane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from ordo.client import Client
from tests.helpers import ROOT, read_results, stop

UPG = '''"""An app whose deposit adds {factor} times the amount."""
import ordo
from ordo import Int

app = ordo.App("upg")
app.table("account", default=0)


@app.procedure(args={{"account": Int(0), "amount": Int(1)}}, keys=[("account", "account")])
class deposit:
    def run(ctx, args):
        balance = ctx.read("account", args["account"]) + {factor} * args["amount"]
        ctx.write("account", args["account"], balance)
        return balance
'''

# The versions the log runs, in order, each with the pause after its upgrade before the next
# deploy and whether the sequencer is held through it: a rollback at once (the deploy undone
# as soon as the first upgrade returned), then a third upgrade within five seconds.
SEQUENCE = ((10, 0.0, True), (1, 5.0, False), (100, 3.0, False))
RATE = 200  # requests a second


def deploy(folder, factor: int) -> None:
    """The app's file, as a deploy writes it: in one step, never read half written."""
    path = os.path.join(folder, "upg.py")
    with open(f"{path}.new", "w") as f:
        f.write(UPG.format(factor=factor))
    os.replace(f"{path}.new", path)


def ordo_in(folder, *args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(folder), ROOT])}
    return subprocess.Popen(
        [sys.executable, "-m", "ordo.cli", *args], cwd=folder, env=env, text=True, stderr=subprocess.PIPE
    )


def finish(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    return process.returncode, err


def drain(process: subprocess.Popen) -> list[str]:
    """The lines `process` writes on standard error, read as they come (a full pipe would
    stop it)."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stderr), name="stderr", daemon=True).start()
    return lines


def sequencer_of(engine: subprocess.Popen) -> psutil.Process:
    """The sequencer process `ordo run` runs now."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(engine.pid).children():
            try:
                if "sequence" in child.cmdline():
                    return child
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.1)
    raise AssertionError("ordo run runs no sequencer")


def load(client: Client, rate: int, sent: list[str], done: threading.Event) -> threading.Thread:
    """A started thread that deposits `rate` times a second, each to an account of its own,
    until `done`; each id goes to `sent` once the broker has acknowledged it."""

    def feed() -> None:
        n = 0
        started = time.monotonic()
        while not done.is_set():
            delay = started + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent.append(client.submit("deposit", {"account": n, "amount": 1}, request_id=f"load-{n}"))
            n += 1

    feeder = threading.Thread(target=feed, name="load")
    feeder.start()
    return feeder


def upgrades_under_load(
    broker: str, namespace: str, folder, partitions: int, answer_within: float = 120, hold: str = "sequencer"
) -> str:
    """Run SEQUENCE under RATE requests a second against one `ordo run`, holding `hold`
    ("sequencer", "engine": the `ordo run` process, or "" for none) where SEQUENCE says;
    raise AssertionError unless every acknowledged request got exactly one outcome, from the
    version of its batch, and the engine served throughout. Returns a line on what was done."""
    deploy(folder, 1)
    engine = ordo_in(
        folder,
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(folder / "data"),
        "--app",
        "upg:app",
        "--partitions",
        str(partitions),
        "--runtime",
        "local",
        "--quiet",
    )
    said = drain(engine)
    sent: list[str] = []
    upgrades: list[str] = []
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics()
            warm = client.submit("deposit", {"account": 10**6, "amount": 1}, request_id="warm")
            assert warm in client.wait([warm], timeout=240), "the engine did not answer its first request"
            done = threading.Event()
            feeder = load(client, RATE, sent, done)
            try:
                time.sleep(2)
                held = None
                for factor, pause, held_through in SEQUENCE:
                    if held is not None:
                        held.resume()  # the files are back at v1 now
                        held = None
                    if hold and held_through:
                        held = sequencer_of(engine) if hold == "sequencer" else psutil.Process(engine.pid)
                        held.suspend()
                    deploy(folder, factor)
                    upgrade = ordo_in(
                        folder, "upgrade", "--bootstrap-servers", broker, "--namespace", namespace, "--app", "upg:app"
                    )
                    code, err = finish(upgrade)
                    assert code == 0, err
                    upgrades.append(err.strip())
                    if held is not None:
                        deploy(folder, 1)  # the rollback's deploy, before the held process runs again
                    time.sleep(pause)
            finally:
                done.set()
                feeder.join()
            outcomes = client.wait(sent, timeout=answer_within)
            running = engine.poll() is None
        if len(outcomes) < len(sent) or not running:
            if running:
                engine.terminate()
            code = engine.wait(60)
            raise AssertionError(
                f"{len(sent) - len(outcomes)} of {len(sent)} acknowledged requests unanswered within "
                f"{answer_within:.0f} s (ordo run {'was running' if running else 'had exited'}, exit {code}); "
                f"the upgrades said {upgrades}; ordo run said: {''.join(said)}"
            )
        published = read_results(broker, f"{namespace}.results", len(sent) + 1)
        counts: dict[str, int] = {}
        for record in published:
            counts[record["id"]] = counts.get(record["id"], 0) + 1
        twice = sorted(request_id for request_id, count in counts.items() if count > 1)
        assert not twice, f"{len(twice)} requests answered more than once, e.g. {twice[:5]}"
        assert set(counts) == set(sent) | {"warm"}, "outcomes for requests never sent, or missing"
        ordered = sorted(outcomes.values(), key=lambda o: (o["batch"], o["txn"]))
        assert all(o["status"] == "committed" for o in ordered), [o for o in ordered if o["status"] != "committed"]
        runs = [ordered[0]["result"]] + [
            b["result"] for a, b in zip(ordered, ordered[1:]) if a["result"] != b["result"]
        ]
        # v10 may have run no batch at all (rolled back before its sequencer cut one).
        assert runs in ([1, 10, 1, 100], [1, 100]), runs
        assert stop(engine) == 0
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    return (
        f"v1 -> v10 -> v1 (at once) -> v100 (5 s later) at {partitions} partition(s) under {RATE} req/s"
        f"{f', the {hold} held through the first' if hold else ''}: "
        f"{len(sent)} requests answered once, by versions {runs}, the same ordo run process"
    )


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [1, 2])
def test_an_upgrade_an_immediate_rollback_and_another_upgrade_under_load_answer_every_request_once(
    broker, namespace, tmp_path, fault_report, partitions
):
    fault_report(upgrades_under_load(broker, namespace, tmp_path, partitions))


@pytest.mark.slow
def test_an_engine_held_through_an_upgrade_whose_files_are_rolled_back_runs_that_set_from_the_log(
    broker, namespace, tmp_path, fault_report
):
    """The engine, held, meets v10's batches with v1 on disk again and the log still at v10
    (the rollback's `ordo upgrade` not yet appended): it runs v10 from the code the log
    keeps of this same app, rather than stopping at its first batch."""
    fault_report(upgrades_under_load(broker, namespace, tmp_path, 1, hold="engine"))


# A stand-in for `ordo sequence` under SequencerProcess: its first run leaves for version 2 of
# the log's set (as UpgradedAway does), every later one beats until stopped.
LEAVES_FOR_V2 = """
import os, sys, time
fd, runs = int(os.environ["ORDO_HEARTBEAT_FD"]), sys.argv[1]
run = len(os.listdir(runs))
open(os.path.join(runs, str(run)), "w").close()
if run == 0:
    os.write(fd, b"U2;")
    sys.exit(4)
while True:
    os.write(fd, b".")
    time.sleep(0.1)
"""


class LogAt:
    """What `current_set` answers: the log's set, as a test moves it."""

    def __init__(self, version: int, identity: int):
        self.version, self.identity = version, identity

    @property
    def name(self) -> str:
        return f"v{self.version} ({self.identity})"


def supervised(tmp_path, monkeypatch, log: list, statuses: list):
    """A SequencerProcess of LEAVES_FOR_V2, its engine's workers' statuses `statuses`, the
    log's set log[0]."""
    import ordo.services as services
    from ordo.sequencer.sequencer import SequencerConfig

    monkeypatch.setattr(services, "UPGRADE_LOOK_EVERY", 0.05)
    monkeypatch.setattr(services, "current_set", lambda bootstrap, topic, timeout=30.0, until=None: log[0])
    runs = tmp_path / "runs"
    runs.mkdir()
    process = services.SequencerProcess("127.0.0.1:1", "ns", SequencerConfig(), engine=lambda: list(statuses))
    process._command = [sys.executable, "-c", LEAVES_FOR_V2, str(runs)]
    return process, runs


def wait_for(condition, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_sequencer_that_left_for_a_set_is_started_again_once_the_engine_goes_on_with_a_later_one(
    tmp_path, monkeypatch, capfd
):
    """It left for v2; the engine runs v2 (its workers had the code), which its app on disk
    is not: it waits. The log moves on to v3 and the engine with it: it is started again."""
    log = [LogAt(2, 22)]
    statuses = [{"executed": 7, "switches": [(8, 22)]}, {"executed": 7, "switches": [(8, 22)]}]
    process, runs = supervised(tmp_path, monkeypatch, log, statuses)
    process.start()
    try:
        assert wait_for(lambda: process._process.poll() == 4)
        time.sleep(1)
        assert len(list(runs.iterdir())) == 1 and process.restarts == 0
        assert process.silences() == []  # no process, so none silent
        log[0] = LogAt(3, 11)
        statuses[1] = {"executed": 7, "switches": [(8, 22), (8, 11)]}  # one worker there, not the other
        time.sleep(1)
        assert len(list(runs.iterdir())) == 1
        statuses[0] = {"executed": 7, "switches": [(8, 22), (8, 11)]}
        assert wait_for(lambda: len(list(runs.iterdir())) == 2)
        assert process.restarts == 1 and process.failure is None
    finally:
        process.stop(5)
    err = capfd.readouterr().err
    assert "the engine goes on with procedure set v3 (11), which the log runs: starting it again" in err, err


def test_a_sequencer_that_left_for_a_set_is_started_again_when_the_engine_runs_nothing_for_the_limit(
    tmp_path, monkeypatch, capfd
):
    """The engine neither stops nor goes on with a later set: after SEQUENCER_SILENT_LIMIT
    without a batch run, the sequencer starts again, to go on or be refused in one line
    (which stops the engine once it repeats): never silence."""
    import ordo.services as services

    monkeypatch.setattr(services, "SEQUENCER_SILENT_LIMIT", 1.5)
    process, runs = supervised(tmp_path, monkeypatch, [LogAt(2, 22)], [{"executed": 7, "switches": [(8, 22)]}])
    process.start()
    try:
        assert wait_for(lambda: len(list(runs.iterdir())) == 2)
        assert process.restarts == 1
    finally:
        process.stop(5)
    assert "the engine has run no batch for 2 s since: starting it again" in capfd.readouterr().err


def test_a_sequencer_that_left_for_a_set_is_not_started_again_while_its_engine_stops(tmp_path, monkeypatch):
    """The engine stops at the first batch of the set (its own line says why)."""
    process, runs = supervised(tmp_path, monkeypatch, [LogAt(2, 22)], [{"executed": 7, "switches": []}])
    process.start()
    assert wait_for(lambda: process._process.poll() == 4)
    time.sleep(0.5)
    process.stop(5)
    process._watch.join(5)
    assert not process._watch.is_alive() and process.restarts == 0 and len(list(runs.iterdir())) == 1


if __name__ == "__main__":
    # The sequence again and again, outside the suite:
    # python -m tests.test_upgrade_sequences RUNS [PARTITIONS [sequencer|engine|free]]
    import tempfile
    import pathlib

    from ordo.broker.local import local_broker

    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    partitions = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    hold = (sys.argv[3] if sys.argv[3] != "free" else "") if len(sys.argv) > 3 else "sequencer"
    passed = 0
    with local_broker() as running:
        for run in range(1, runs + 1):
            with tempfile.TemporaryDirectory() as folder:
                try:
                    line = upgrades_under_load(
                        running.bootstrap_servers,
                        f"seq-{os.getpid()}-{run}",
                        pathlib.Path(folder),
                        partitions,
                        hold=hold,
                    )
                    passed += 1
                    print(f"run {run}: passed: {line}", flush=True)
                except AssertionError as exc:
                    print(f"run {run}: FAILED: {exc}", flush=True)
            print(json.dumps({"runs": run, "passed": passed}), flush=True)
