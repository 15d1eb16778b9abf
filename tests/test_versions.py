"""Versioned procedures: a procedure set's identity covers its code, the log changes sets
only through an upgrade record, every engine follows the set the log names, and replays
run each batch with the code that first ran it (log/versions.py, docs/operations.md,
'Upgrading procedures')."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from ordo.client import Client
from ordo.procedures.fingerprint import describe, set_id
from ordo.procedures.loading import load_registry
from tests.helpers import ROOT, read_results, stop

BANK = '''"""A bank whose deposit adds {factor} times the amount."""
import ordo
from ordo import Int

app = ordo.App("bank")
app.table("account", default=0)


@app.procedure(args={{"account": Int(0), "amount": Int(1)}}, keys=[("account", "account")])
class deposit:
    def run(ctx, args):
        balance = ctx.read("account", args["account"]) + {factor} * args["amount"]
        ctx.write("account", args["account"], balance)
        return balance
'''

SENSORS = """import ordo
from ordo import Int

app = ordo.App("sensors")
app.table("reading", default=0)


@app.procedure(args={"sensor": Int(0), "value": Int()}, keys=[("reading", "sensor")])
class record:
    def run(ctx, args):
        ctx.write("reading", args["sensor"], args["value"])
"""


def _write(folder, name: str, text: str) -> None:
    with open(os.path.join(folder, f"{name}.py"), "w") as f:
        f.write(text)


def _registry(folder, spec: str, fresh: bool = True):
    sys.path.insert(0, str(folder))
    try:
        if fresh:
            sys.modules.pop(spec.partition(":")[0], None)
        return load_registry([spec])
    finally:
        sys.path.remove(str(folder))


_started: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_process_left():
    """Every ordo process a test starts is gone when the test ends, failed or not."""
    yield
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.kill()
            process.wait()


def _ordo(folder, *args, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(folder), ROOT])}
    process = subprocess.Popen(
        [sys.executable, "-m", "ordo.cli", *args], cwd=folder, env=env, text=True, stderr=subprocess.PIPE, **kwargs
    )
    _started.append(process)
    return process


def _finish(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    _, err = process.communicate(timeout=timeout)
    return process.returncode, err


def _answer(client: Client, request_id: str, engine: subprocess.Popen, timeout: float = 120) -> dict:
    """The outcome of `request_id`; if none comes, what the engine said instead."""
    found = client.wait([request_id], timeout)
    if request_id not in found:
        code = engine.poll()
        if code is None:
            engine.kill()
        _, err = engine.communicate()
        raise AssertionError(
            f"no outcome for {request_id} within {timeout:.0f} s; the engine (exit {code}) said: {err}"
        )
    return found[request_id]


def _log_end(broker: str, namespace: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker, "group.id": "versions-test"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(f"{namespace}.log", 0), timeout=10, cached=False)[1]
    finally:
        consumer.close()


def _run(folder, broker, namespace, data_dir, spec, *extra) -> subprocess.Popen:
    return _ordo(
        folder,
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(data_dir),
        "--app",
        spec,
        "--runtime",
        "local",
        "--quiet",
        "--checkpoint-every",
        "5",
        "--max-delay-ms",
        "5",
        *extra,
    )


def _deposits(client: Client, prefix: str, accounts: range, amount: int = 1, timeout: float = 120) -> dict:
    ids = [client.submit("deposit", {"account": a, "amount": amount}, request_id=f"{prefix}-{a}") for a in accounts]
    return client.wait(ids, timeout=timeout)


def _deposit_load(client: Client, rate: int, sent: list[str], done: threading.Event) -> threading.Thread:
    """A started thread that deposits `rate` times a second, each to an account of its own,
    until `done`; the ids go to `sent`."""

    def load() -> None:
        n = 0
        started = time.monotonic()
        while not done.is_set():
            delay = started + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent.append(client.submit("deposit", {"account": n, "amount": 1}, request_id=f"load-{n}"))
            n += 1

    feeder = threading.Thread(target=load)
    feeder.start()
    return feeder


def _digest(folder, data_dir) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-m", "ordo.cli", "digest", "--data-dir", str(data_dir)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# -- the identity -------------------------------------------------------------------------


def test_the_identity_covers_the_code_of_run_not_only_the_arguments(tmp_path):
    _write(tmp_path, "bank_a", BANK.format(factor=1))
    _write(tmp_path, "bank_b", BANK.format(factor=2))
    _write(tmp_path, "bank_a_copy", BANK.format(factor=1))
    one, two = describe(_registry(tmp_path, "bank_a:app")), describe(_registry(tmp_path, "bank_b:app"))
    assert one["procedures"]["deposit"] != two["procedures"]["deposit"]
    assert one["tables"] == two["tables"]
    # The arguments-only form (logs from before versions) cannot tell them apart.
    assert describe(_registry(tmp_path, "bank_a:app"), code=False) == describe(
        _registry(tmp_path, "bank_b:app"), code=False
    )
    # An earlier version kept under another module name is still that version.
    assert set_id(describe(_registry(tmp_path, "bank_a_copy:app"))) == set_id(one)


def test_a_helper_module_named_in_code_is_covered(tmp_path):
    app = BANK.format(factor=1).replace(
        'app = ordo.App("bank")', 'import helper\napp = ordo.App("bank", code=[helper])'
    )
    _write(tmp_path, "bank_h", app)
    _write(tmp_path, "helper", "RATE = 1\n")
    before = set_id(describe(_registry(tmp_path, "bank_h:app")))
    _write(tmp_path, "helper", "RATE = 2\n")
    assert set_id(describe(_registry(tmp_path, "bank_h:app"))) != before


def test_the_identity_is_the_same_in_every_process(tmp_path):
    _write(tmp_path, "bank_p", BANK.format(factor=3))
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from ordo.procedures.fingerprint import describe, set_id; "
        "from ordo.procedures.loading import load_registry; print(set_id(describe(load_registry(['bank_p:app']))))"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": ROOT, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert len(seen) == 1 and seen != {""}
    assert seen == {str(set_id(describe(_registry(tmp_path, "bank_p:app"))))}


def test_versions_follow_one_another_and_copies_name_nothing():
    """The readers' rule (LogCursor): an upgrade names the next version only, so a byte copy
    of an earlier upgrade is passed over and counted; in a versioned log a start record of
    another set (a stray sequencer, or a copy) changes nothing."""
    from ordo.log.records import LogCursor, encode_start, encode_upgrade

    sets = [{"procedures": {"p": str(n)}, "tables": {}, "format": 2} for n in range(3)]
    cursor = LogCursor(namespace="ns")
    cursor.accept(encode_start("ns", None, "L", sets[0]), 0)
    second = encode_upgrade("ns", sets[1], 2, "L")
    cursor.accept(second, 1)
    cursor.accept(encode_upgrade("ns", sets[2], 3, "L"), 2)
    assert cursor.procedures[:3] == [3, set_id(sets[2]), 2]
    cursor.accept(second, 3)  # a copy of the upgrade to v2
    cursor.accept(encode_start("ns", "L", "stray", sets[0]), 4)  # a start record of v1's set
    assert cursor.procedures[:3] == [3, set_id(sets[2]), 2]
    assert cursor.dropped == 1 and "out of place" in cursor.unreported[0][1]
    cursor.accept(encode_upgrade("ns", sets[0], 5, "L"), 5)  # a version skipped: no upgrade of this log
    assert cursor.procedures[0] == 3 and cursor.dropped == 2


# -- on Kafka -----------------------------------------------------------------------------


@pytest.mark.slow
def test_an_edited_run_needs_an_upgrade_and_every_replay_runs_the_code_that_ran(
    broker, namespace, tmp_path, fault_report
):
    _write(tmp_path, "bank", BANK.format(factor=1))
    live = tmp_path / "live"
    engine = _run(tmp_path, broker, namespace, live, "bank:app")
    with Client(broker, namespace) as client:
        client.wait_for_topics()
        before = _deposits(client, "v1", range(0, 20))
    assert stop(engine) == 0
    assert {o["result"] for o in before.values()} == {1}

    # The RUN body changes, its arguments do not; the old code is kept for replays.
    _write(tmp_path, "bank_v1", BANK.format(factor=1))
    _write(tmp_path, "bank", BANK.format(factor=2))
    end = _log_end(broker, namespace)
    code, err = _finish(_run(tmp_path, broker, namespace, live, "bank:app"))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "procedure 'deposit' changed" in lines[0] and "ordo upgrade" in lines[0], err
    assert _log_end(broker, namespace) == end  # nothing written

    upgraded = _ordo(tmp_path, "upgrade", "--bootstrap-servers", broker, "--namespace", namespace, "--app", "bank:app")
    code, err = _finish(upgraded)
    assert code == 0 and "to v2" in err, err

    engine = _run(tmp_path, broker, namespace, live, "bank:app")
    with Client(broker, namespace) as client:
        after = _deposits(client, "v2", range(0, 20))
    assert stop(engine) == 0
    assert {o["result"] for o in after.values()} == {3}  # 1 from v1, then 2 more from v2
    boundary = min(o["batch"] for o in after.values())
    assert max(o["batch"] for o in before.values()) < boundary
    live_digest = _digest(tmp_path, live)

    # Told to run only the code given, a replay from scratch without v1's refuses, naming the version it needs.
    code, err = _finish(
        _ordo(
            tmp_path,
            "recover",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            str(tmp_path / "without"),
            "--app",
            "bank:app",
            "--no-kept-code",
            "--from-scratch",
            "--runtime",
            "local",
            "--quiet",
            "--idle",
            "0",
        )
    )
    assert code == 2 and "v1" in err and "--app-version" in err and "Traceback" not in err, err
    for partitions, scheduler in (("1", "serial"), ("2", "locking")):
        rebuilt = tmp_path / f"rebuilt-{partitions}"
        code, err = _finish(
            _ordo(
                tmp_path,
                "recover",
                "--bootstrap-servers",
                broker,
                "--namespace",
                namespace,
                "--data-dir",
                str(rebuilt),
                "--app",
                "bank:app",
                "--app-version",
                "bank_v1:app",
                "--from-scratch",
                "--partitions",
                partitions,
                "--scheduler",
                scheduler,
                "--runtime",
                "local",
                "--idle",
                "0",
            ),
            timeout=300,
        )
        assert code == 0, err
        assert _digest(tmp_path, rebuilt) == live_digest, err
        # The summary counts both stretches (from scratch: every batch, all 40 deposits), and
        # while the first replays, the lag counts to the log's head, past the upgrade.
        summary = re.search(
            r"^recovered: .* replay of ([\d,]+) batches, ([\d,]+) txns .* through batch (\d+)$", err, re.M
        )
        assert summary, err
        assert int(summary[1].replace(",", "")) == int(summary[3]) and summary[2] == "40", err
        first_stretch = err.split(f"from batch {boundary}: procedure set", 1)[0]
        lags = re.findall(r"^replay: batch \d+ .*\| log lag ~(\d+|\?)$", first_stretch, re.M)
        assert all(lag != "0" for lag in lags), err
    fault_report(
        f"1 RUN edit refused (log unchanged at offset {end}), 1 upgrade at batch {boundary}, "
        f"40 deposits checked by version, 3 replays (without v1: refused; 1P serial, 2P locking: equal)"
    )


@pytest.mark.slow
def test_another_app_on_a_running_namespace_is_refused_and_changes_nothing(broker, namespace, tmp_path, fault_report):
    _write(tmp_path, "bank", BANK.format(factor=1))
    _write(tmp_path, "sensors", SENSORS)
    engine = _run(tmp_path, broker, namespace, tmp_path / "bank-data", "bank:app")
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics()
            first = _deposits(client, "a", range(0, 5))
            end = _log_end(broker, namespace)
            code, err = _finish(_run(tmp_path, broker, namespace, tmp_path / "sensors-data", "sensors:app"))
            lines = [line for line in err.splitlines() if line.strip()]
            assert code == 2 and len(lines) == 1, err
            assert "procedure 'record' added" in lines[0] and "procedure 'deposit' removed" in lines[0], err
            assert _log_end(broker, namespace) == end
            second = _deposits(client, "b", range(0, 5))
        assert engine.poll() is None
    finally:
        assert stop(engine) == 0
    assert {o["result"] for o in first.values()} == {1} and {o["result"] for o in second.values()} == {2}
    fault_report("1 other app started on a serving namespace: refused, log unchanged; 10 requests answered")


@pytest.mark.slow
def test_an_upgrade_to_code_the_engine_does_not_have_stops_it_at_its_batch_and_loses_nothing(
    broker, namespace, tmp_path, fault_report
):
    _write(tmp_path, "bank", BANK.format(factor=1))
    live = tmp_path / "live"
    engine = _run(tmp_path, broker, namespace, live, "bank:app")
    sent: list[str] = []
    with Client(broker, namespace) as client:
        client.wait_for_topics()
        _deposits(client, "warm", range(100_000, 100_005))
        done = threading.Event()

        feeder = _deposit_load(client, 500, sent, done)
        try:
            time.sleep(4)
            _write(tmp_path, "bank_v2", BANK.format(factor=2))  # bank.py, the engine's, stays v1
            started = time.monotonic()
            code, err = _finish(
                _ordo(
                    tmp_path, "upgrade", "--bootstrap-servers", broker, "--namespace", namespace, "--app", "bank_v2:app"
                )
            )
            assert code == 0, err
            appended_s = float(err.split(" in ")[1].split(" s")[0])  # the command's own figure
            code, err = _finish(engine, timeout=120)  # the v1 engine stops at the upgrade, in one line
            stopped_s = time.monotonic() - started
            ordo_lines = [line for line in err.splitlines() if line.startswith("ordo run:")]
            assert code == 2 and len(ordo_lines) == 1 and "from batch" in ordo_lines[0], err
            assert "(the code of bank:app on disk is another set)" in ordo_lines[0], err
            assert "Traceback" not in err, err
            engine = _run(tmp_path, broker, namespace, live, "bank_v2:app")
            probe = client.submit("deposit", {"account": 10**6, "amount": 1}, request_id="probe")
            assert _answer(client, probe, engine)["result"] == 2
            upgrade_s = time.monotonic() - started  # from `ordo upgrade` to the first answer of v2
            time.sleep(3)
        finally:
            done.set()
            feeder.join()
        outcomes = client.wait(sent, timeout=180)
    assert stop(engine) == 0
    boundary = int(ordo_lines[0].split("from batch ")[1].split(",")[0])
    assert len(outcomes) == len(sent)
    published = read_results(broker, f"{namespace}.results", len(sent) + 6)
    assert len(published) == len({record["id"] for record in published}) == len(sent) + 6  # each once
    by_version = {1: 0, 2: 0}
    for outcome in outcomes.values():
        assert outcome["status"] == "committed", outcome
        expected = 1 if outcome["batch"] < boundary else 2
        assert outcome["result"] == expected, (outcome, boundary)
        by_version[expected] += 1
    assert by_version[1] and by_version[2]
    fault_report(
        f"1 upgrade under 500 req/s at batch {boundary}: {len(sent)} requests answered once "
        f"({by_version[1]} by v1, {by_version[2]} by v2); the upgrade record appended in {appended_s:.2f} s, "
        f"the v1 engine stopped {stopped_s:.1f} s and v2 answered {upgrade_s:.1f} s after the upgrade began"
    )


def _published_at(broker: str, topic: str, count: int, timeout: float = 120) -> dict[str, tuple[int, int]]:
    """Each outcome's id -> (its result, the time the engine published it, ms)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": broker, "group.id": f"{topic}-times", "isolation.level": "read_committed"}
    )
    found: dict[str, tuple[int, int]] = {}
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout
        while len(found) < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                if message.error() is None:
                    record = json.loads(message.value())
                    found.setdefault(record["id"], (record.get("result"), message.timestamp()[1]))
    finally:
        consumer.close()
    return found


@pytest.mark.slow
def test_ordo_upgrade_says_what_a_running_engine_does_and_it_does_so(broker, namespace, tmp_path):
    """`ordo upgrade`'s line tells the operator that a running engine whose app on disk is
    the new code goes on in place (and one whose disk is not stops at the upgrade, the
    test above): here the engine's bank.py is the new code, and the same process answers with it."""
    _write(tmp_path, "bank", BANK.format(factor=1))
    engine = _run(tmp_path, broker, namespace, tmp_path / "live", "bank:app")
    with Client(broker, namespace) as client:
        client.wait_for_topics()
        assert _deposits(client, "v1", range(0, 3))["v1-0"]["result"] == 1
        time.sleep(1.1)  # a new mtime for the edited file, as any deploy gives it
        _write(tmp_path, "bank", BANK.format(factor=2))
        code, err = _finish(
            _ordo(tmp_path, "upgrade", "--bootstrap-servers", broker, "--namespace", namespace, "--app", "bank:app")
        )
        assert code == 0, err
        line = " ".join(err.split())
        assert "the batches after it run these procedures. A running `ordo run` whose app on disk is this code " in line
        assert "goes on with it in place; one whose app on disk is other code applies every batch before the " in line
        assert "upgrade and stops there: start it again with this code" in line
        assert "engines of v1" not in line
        probe = client.submit("deposit", {"account": 10, "amount": 1}, request_id="v2-probe")
        assert _answer(client, probe, engine)["result"] == 2
        assert engine.poll() is None  # the same process
    engine.terminate()
    code, err = _finish(engine)
    assert code == 0 and "ordo run: procedures upgraded in place: set " in err, err


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [1, 2])
def test_upgrades_in_place_v1_v2_v1_under_load_keep_the_engine_running_and_each_version_answers_its_batches(
    broker, namespace, tmp_path, fault_report, partitions
):
    """`ordo upgrade` to the code the running engine's app now has on disk: the same `ordo
    run` process goes on with it (sequencer, and every worker, Ray's too), v1 -> v2 -> v1
    under 300 requests/s; each request is answered once, by the version of its batch."""
    _write(tmp_path, "bank", BANK.format(factor=1))
    live = tmp_path / "live"
    extra = ("--partitions", "2", "--runtime", "ray") if partitions == 2 else ()
    engine = _run(tmp_path, broker, namespace, live, "bank:app", *extra)
    sent: list[str] = []
    with Client(broker, namespace) as client:
        client.wait_for_topics()
        _deposits(client, "warm", range(100_000, 100_005), timeout=240)
        done = threading.Event()

        feeder = _deposit_load(client, 300, sent, done)
        try:
            time.sleep(3)
            for factor in (2, 1):
                time.sleep(1.1)  # a new mtime for the edited file, as any deploy gives it
                _write(tmp_path, "bank", BANK.format(factor=factor))
                code, err = _finish(
                    _ordo(
                        tmp_path,
                        "upgrade",
                        "--bootstrap-servers",
                        broker,
                        "--namespace",
                        namespace,
                        "--app",
                        "bank:app",
                    )
                )
                assert code == 0, err
                time.sleep(4)
        finally:
            done.set()
            feeder.join()
        outcomes = client.wait(sent, timeout=180)
        assert engine.poll() is None, _finish(engine)  # the same process throughout
    if len(outcomes) < len(sent):
        engine.terminate()
        code, err = _finish(engine)
        raise AssertionError(f"{len(sent) - len(outcomes)} of {len(sent)} unanswered; ordo run (exit {code}): {err}")
    assert stop(engine) == 0
    timed = _published_at(broker, f"{namespace}.results", len(sent) + 5)
    assert len(timed) == len(sent) + 5
    ordered = sorted(outcomes.values(), key=lambda o: (o["batch"], o["txn"]))
    assert all(o["status"] == "committed" for o in ordered)
    runs = [ordered[0]["result"]] + [b["result"] for a, b in zip(ordered, ordered[1:]) if a["result"] != b["result"]]
    assert runs == [1, 2, 1], runs  # v1, then v2 from one batch on, then v1 again
    times = sorted(timed[i][1] for i in sent)
    gap_ms = max(b - a for a, b in zip(times, times[1:]))
    # A new engine on the same log, its app on disk at v1: it replays v2's stretch, which the
    # log has moved past, with the code the log keeps.
    live_digest = _digest(tmp_path, live)
    fresh = _run(tmp_path, broker, namespace, tmp_path / "fresh", "bank:app")
    deadline = time.monotonic() + 180
    while True:
        try:
            if _digest(tmp_path, tmp_path / "fresh") == live_digest:
                break
        except AssertionError:
            pass  # no shard yet
        assert fresh.poll() is None and time.monotonic() < deadline, _finish(fresh)
        time.sleep(1)
    assert stop(fresh) == 0
    # No copy of any version's code anywhere: a rebuild runs the code the log keeps.
    (tmp_path / "bank.py").unlink()
    shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)
    if partitions == 1:  # told to run only the code it is given, it has none for batch 1
        code, err = _finish(
            _ordo(
                tmp_path, "recover", "--bootstrap-servers", broker, "--namespace", namespace, "--data-dir",
                str(tmp_path / "given-only"), "--from-scratch", "--runtime", "local", "--no-kept-code",
            ),
            timeout=300,
        )  # fmt: skip
        lines = [line for line in err.splitlines() if line.startswith("ordo recover:")]
        assert code == 2 and len(lines) == 1 and "the batches from 1 on were sequenced with" in lines[0], err
    rebuilt = tmp_path / "rebuilt"
    other = (
        ("--partitions", "2", "--scheduler", "vll")
        if partitions == 1
        else ("--partitions", "1", "--scheduler", "opchain")
    )
    code, err = _finish(
        _ordo(
            tmp_path, "recover", "--bootstrap-servers", broker, "--namespace", namespace, "--data-dir", str(rebuilt),
            "--from-scratch", "--runtime", "local", *other,
        ),
        timeout=300,
    )  # fmt: skip
    assert code == 0, err
    assert "(the code the log keeps: bank:app)" in err, err  # v1 here; v2 there or in the workers
    assert _digest(tmp_path, rebuilt) == live_digest
    fault_report(
        f"in-place upgrades v1 -> v2 -> v1 at {partitions} partition(s) under 300 req/s: {len(sent)} requests "
        f"answered once by their batch's version, the same ordo run process; longest gap between two "
        f"outcomes {gap_ms} ms; a new engine caught up through v2 with the code the log keeps, and a rebuild "
        f"with no code given at {other[1]} partition(s), {other[3]}: the live digest"
    )


def before_places(record: bytes) -> bytes:
    """A record as Ordo sealed it before tags covered where a record belongs: the same
    body, its tag over the body alone."""
    from ordo.log.secret import TAG_BYTES, tag

    body = record[:-TAG_BYTES]
    return body + tag(b"log", body)


def test_a_log_from_before_places_is_read_up_to_its_first_record_sealed_in_place():
    from ordo.log.records import LogCursor, encode_batch, encode_entry, encode_start

    old_start = before_places(encode_start("ns", None, "L"))
    old_batch = before_places(encode_batch(1, 0, 5, {}, [encode_entry(["a", "p", {}])], log_id="L", namespace="ns"))
    cursor = LogCursor(namespace="ns")
    assert cursor.accept(old_start, 0) is None and cursor.log_id == "L"
    assert cursor.accept(old_batch, 1).batch_id == 1
    cursor.accept(encode_start("ns", "L", "new"), 2)  # the first record sealed in its place
    assert cursor.placed
    copy = before_places(encode_batch(1, 2, 6, {}, [encode_entry(["b", "p", {}])], log_id="L", namespace="ns"))
    assert cursor.accept(copy, 3) is None and cursor.dropped == 1  # after it, an old-style record is a copy
    resumed = LogCursor.from_dict(cursor.to_dict(), "ns")
    assert resumed.placed and resumed.accept(copy, 3) is None and resumed.dropped == 1


def with_an_earlier_log_module(tmp_path, commit: str, release: str, code: str) -> str:
    """The standard output of `code` run against `ordo.sequencer.log` (and its log secret) of
    `commit`, where the log's module lived then, taken from the repository's history;
    skipped where the history lacks it."""
    old = tmp_path / "old" / "ordo" / "sequencer"
    old.mkdir(parents=True)
    for name in ("log.py", "log_secret.py"):
        shown = subprocess.run(["git", "show", f"{commit}:sequencer/{name}"], cwd=ROOT, capture_output=True)
        if shown.returncode != 0:
            pytest.skip(f"the repository's history lacks the release {release}: {shown.stderr[:200]!r}")
        (old / name).write_bytes(shown.stdout)
    for package in (old.parent, old):
        (package / "__init__.py").write_text("")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(old.parent.parent)},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_previous_release_s_own_encoder_writes_what_before_places_makes(tmp_path):
    """The old-style records these tests build are those the release before versions wrote:
    log module, taken from the repository's history, encodes the same bytes, and
    this version reads them."""
    from ordo.log.records import LogCursor, encode_batch, encode_entry, encode_start

    described = {"procedures": {"p": "1"}, "tables": {}}
    code = (
        "import sys; from ordo.sequencer.log import encode_start, encode_batch, encode_entry; "
        f"print(encode_start('L', {described!r}).hex()); "
        "print(encode_batch(1, 0, 5, {0: (0, 1)}, [encode_entry(['a', 'p', {}])], log_id='L').hex())"
    )
    out = with_an_earlier_log_module(tmp_path, "f13108cf1a1c85a495b22ad53641571c2c76af2e", "before versions", code)
    written = [bytes.fromhex(line) for line in out.split()]
    assert written == [
        before_places(encode_start("ns", None, "L", described)),
        before_places(encode_batch(1, 0, 5, {0: (0, 1)}, [encode_entry(["a", "p", {}])], log_id="L", namespace="ns")),
    ]
    cursor = LogCursor(namespace="ns")
    cursor.accept(written[0], 0)
    assert cursor.accept(written[1], 1).batch_id == 1 and cursor.log_id == "L"


@pytest.mark.slow
def test_a_namespace_another_app_broke_before_versions_has_a_way_back(broker, namespace, tmp_path, fault_report):
    """A log as Ordo wrote it before versions (sets described by arguments, records sealed
    over their body alone), where another app's sequencer took over (its start record, then
    a batch rejecting the bank's requests): the bank refuses to start in one line, `ordo
    upgrade` takes the namespace back, and every request is answered."""
    from confluent_kafka import Producer

    from ordo.log.records import encode_batch, encode_entry, encode_start
    from ordo.broker.topics import ensure_topics

    _write(tmp_path, "bank", BANK.format(factor=1))
    _write(tmp_path, "sensors", SENSORS)
    ensure_topics(broker, namespace, request_partitions=1)
    with Client(broker, namespace) as client:
        early = [client.submit("deposit", {"account": a, "amount": 5}, request_id=f"early-{a}") for a in range(5)]
    args = {"account": 0, "amount": 5}
    log_id = "bank-sequencer"
    records = [
        encode_start(namespace, None, log_id, describe(_registry(tmp_path, "bank:app"), code=False)),
        encode_batch(
            1,
            0,
            1000,
            {0: (0, 3)},
            [encode_entry([f"early-{a}", "deposit", {**args, "account": a}]) for a in range(3)],
            log_id=log_id,
            namespace=namespace,
        ),
        encode_start(namespace, log_id, "sensors-sequencer", describe(_registry(tmp_path, "sensors:app"), code=False)),
        encode_batch(
            2,
            2,
            1001,
            {0: (3, 5)},
            [encode_entry([f"early-{a}", None, "unknown procedure 'deposit'"]) for a in (3, 4)],
            log_id=log_id,
            namespace=namespace,
        ),
    ]
    producer = Producer({"bootstrap.servers": broker})
    for record in records:  # sealed as Ordo sealed records before tags covered their place
        producer.produce(f"{namespace}.log", before_places(record), partition=0)
    assert producer.flush(30) == 0

    data = tmp_path / "data"
    code, err = _finish(_run(tmp_path, broker, namespace, data, "bank:app"))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "ordo upgrade" in lines[0], err
    code, err = _finish(
        _ordo(tmp_path, "upgrade", "--bootstrap-servers", broker, "--namespace", namespace, "--app", "bank:app")
    )
    assert code == 0, err
    engine = _run(tmp_path, broker, namespace, data, "bank:app")
    try:
        with Client(broker, namespace) as client:
            later = _deposits(client, "later", range(0, 5))
            answered = client.wait(early, timeout=60, from_beginning=True)
    finally:
        assert stop(engine) == 0
    assert [answered[f"early-{a}"]["status"] for a in range(5)] == ["committed"] * 3 + ["rejected"] * 2
    assert [later[f"later-{a}"]["result"] for a in range(5)] == [6, 6, 6, 1, 1]
    fault_report(
        "a log from before versions with another app's start record and batch: refused in one line, "
        "taken back by ordo upgrade, 10 requests answered"
    )


@pytest.mark.slow
def test_a_streaming_app_s_window_trigger_and_dependent_procedure_upgrade_and_replay(
    broker, namespace, tmp_path, fault_report
):
    """examples/inventory.py (an input stream, a triggered procedure with a window, an OLLP
    procedure) upgraded to a version whose window is shorter, whose trigger counts twice and
    whose dependent restock adds one more: each version answers its own requests, and a
    rebuild from scratch at 1 and 2 partitions with both versions gives the live state."""
    from tests.test_inventory_example import STEPS

    with open(os.path.join(ROOT, "examples", "inventory.py")) as f:
        v1 = f.read()
    v2 = (
        v1.replace(
            'app.window("recent", owner="tally", rows=5, slide=1)',
            'app.window("recent", owner="tally", rows=2, slide=1)',
        )
        .replace(
            'ctx.write("delivered", warehouse, ctx.read("delivered", warehouse) + qty)',
            'ctx.write("delivered", warehouse, ctx.read("delivered", warehouse) + 2 * qty)',
        )
        .replace(
            'ctx.write("stock", key, ctx.read("stock", key) + args["qty"])\n        return',
            'ctx.write("stock", key, ctx.read("stock", key) + args["qty"] + 1)\n        return',
        )
    )
    assert v2.count("2 * qty") == 1 and v2.count('args["qty"] + 1') == 1 and "rows=2" in v2
    _write(tmp_path, "inventory", v1)
    live = tmp_path / "live"

    def run_steps(prefix: str) -> dict:
        engine = _run(tmp_path, broker, namespace, live, "inventory:app", "--partitions", "2")
        outcomes = {}
        try:
            with Client(broker, namespace) as client:
                client.wait_for_topics()
                for step in STEPS:
                    ids = [
                        client.submit(proc, args, request_id=f"{prefix}-{request_id}")
                        for request_id, (proc, args) in step.items()
                    ]
                    outcomes.update(client.wait(ids, timeout=120))
        finally:
            assert stop(engine) == 0
        assert len(outcomes) == sum(map(len, STEPS))
        return outcomes

    first = run_steps("v1")
    assert first["v1-restock-bolt"]["result"] == 15
    _write(tmp_path, "inventory_v1", v1)
    _write(tmp_path, "inventory", v2)
    code, err = _finish(_run(tmp_path, broker, namespace, live, "inventory:app", "--partitions", "2"))
    assert code == 2 and "ordo upgrade" in err and len(err.strip().splitlines()) == 1, err
    code, err = _finish(
        _ordo(tmp_path, "upgrade", "--bootstrap-servers", broker, "--namespace", namespace, "--app", "inventory:app")
    )
    assert code == 0, err
    second = run_steps("v2")
    # v1 left 15 bolts; v2 delivers 40, ships 35 (the second 35 aborts), and its restock adds 10 + 1.
    assert second["v2-restock-bolt"]["result"] == 15 + 40 - 35 + 11
    assert second["v2-ship-2"]["status"] == "aborted"
    live_digest = _digest(tmp_path, live)
    for partitions, scheduler in (("1", "serial"), ("2", "vll")):
        rebuilt = tmp_path / f"rebuilt-{partitions}"
        code, err = _finish(
            _ordo(
                tmp_path,
                "recover",
                "--bootstrap-servers",
                broker,
                "--namespace",
                namespace,
                "--data-dir",
                str(rebuilt),
                "--app",
                "inventory:app",
                "--app-version",
                "inventory_v1:app",
                "--from-scratch",
                "--partitions",
                partitions,
                "--scheduler",
                scheduler,
                "--runtime",
                "local",
                "--idle",
                "0",
            ),
            timeout=300,
        )
        assert code == 0, err
        assert _digest(tmp_path, rebuilt) == live_digest, err
        # The summary counts both stretches: from scratch, every batch of the log.
        summary = re.search(r"^recovered: .* replay of ([\d,]+) batches, .* through batch (\d+)$", err, re.M)
        assert summary and int(summary[1].replace(",", "")) == int(summary[2]), err
    fault_report(
        f"a window, a trigger and a dependent procedure changed: plain restart refused, upgrade, "
        f"{len(first) + len(second)} requests by version, 2 rebuilds (1P serial, 2P vll) equal to the live state"
    )


def test_a_log_and_a_checkpoint_of_the_main_before_sources_are_read_as_they_were(tmp_path):
    """The release before source topics and remembered start tokens (6774588): its encoder
    writes the same bytes for a start record and a batch as this one, and a position it
    checkpointed resumes here as a reader from the head would."""
    from ordo.log.records import LogCursor, encode_batch, encode_entry, encode_start

    code = (
        "import json; from ordo.sequencer.log import LogCursor, encode_start, encode_batch, encode_entry; "
        "start = encode_start('ns', None, 'L', None); "
        "batch = encode_batch(1, 0, 5, {0: (0, 1)}, [encode_entry(['a', 'p', {}])], log_id='L', namespace='ns'); "
        "cursor = LogCursor(namespace='ns'); cursor.accept(start, 0); cursor.accept(batch, 1); "
        "print(start.hex()); print(batch.hex()); print(json.dumps(cursor.to_dict()))"
    )
    out = with_an_earlier_log_module(tmp_path, "6774588", "before sources", code)
    start_hex, batch_hex, checkpoint = out.split("\n")[:3]
    start, batch = bytes.fromhex(start_hex), bytes.fromhex(batch_hex)
    assert start == encode_start("ns", None, "L", None)
    assert batch == encode_batch(1, 0, 5, {0: (0, 1)}, [encode_entry(["a", "p", {}])], log_id="L", namespace="ns")
    saved = json.loads(checkpoint)
    assert "starts" not in saved and "source_offsets" not in saved  # what the old release kept
    resumed = LogCursor.from_dict(saved, "ns")
    assert resumed.next_batch == 2 and resumed.log_id == "L" and resumed.lanes == {0: [0, 2]}
    later = encode_batch(2, 0, 6, {0: (1, 2)}, [encode_entry(["b", "p", {}])], log_id="L", namespace="ns")
    assert resumed.accept(later, 2).batch_id == 2
    fresh = LogCursor(namespace="ns")
    for offset, record in enumerate([start, batch, later]):
        fresh.accept(record, offset)
    assert fresh.next_batch == resumed.next_batch and fresh.request_offsets == resumed.request_offsets


def test_a_log_and_a_checkpoint_of_the_main_before_topic_ids_are_read_as_they_were(tmp_path):
    """The release before source positions carried their topic's id (13401d3): its batches
    and a cursor it checkpointed are read here with the same positions, bound to no topic id
    yet (the sequencer adopts the topic's current one at its first start, sequencer/sources.py)."""
    from ordo.log.records import LogCursor, encode_batch, encode_entry, encode_start

    code = (
        "import json; from ordo.sequencer.log import LogCursor, encode_start, encode_batch, encode_entry; "
        "start = encode_start('ns', None, 'L', None); "
        "batch = encode_batch(1, 0, 5, {0: (0, 1), 'orders:0': (0, 7)}, [encode_entry(['orders:0:0', 'p', {}])], "
        "log_id='L', namespace='ns'); "
        "cursor = LogCursor(namespace='ns'); cursor.accept(start, 0); cursor.accept(batch, 1); "
        "print(start.hex()); print(batch.hex()); print(json.dumps(cursor.to_dict()))"
    )
    out = with_an_earlier_log_module(tmp_path, "13401d3", "before topic ids", code)
    start_hex, batch_hex, checkpoint = out.split("\n")[:3]
    start, batch = bytes.fromhex(start_hex), bytes.fromhex(batch_hex)
    assert start == encode_start("ns", None, "L", None)
    assert batch == encode_batch(
        1, 0, 5, {0: (0, 1), "orders:0": (0, 7)}, [encode_entry(["orders:0:0", "p", {}])], log_id="L", namespace="ns"
    )
    fresh = LogCursor(namespace="ns")
    fresh.accept(start, 0)
    assert fresh.accept(batch, 1).batch_id == 1
    assert fresh.consumed_to("orders:0") == 7 and fresh.source_ids == {}
    resumed = LogCursor.from_dict(json.loads(checkpoint), "ns")
    assert resumed.consumed_to("orders:0") == 7 and resumed.request_offsets == fresh.request_offsets
    assert resumed.next_batch == fresh.next_batch == 2
