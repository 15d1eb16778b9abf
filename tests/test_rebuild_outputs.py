"""Where a rebuild's outputs go (ordo/recover.py, docs/recovery.md, 'Where a replay's outputs
go'): a rebuild into a data directory that is not an engine's own publishes nothing, so a
check beside a serving engine leaves the live topics byte for byte as they were; a replay of
an engine's own data directory publishes copies of what its engine published, as a restart
does."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from ordo.client import Client
from tests.helpers import ROOT, stop, topic_reader

BANK = '''"""A bank of deposits."""
import ordo
from ordo import Int

app = ordo.App("bank")
app.table("account", default=0)


@app.procedure(args={"account": Int(0), "amount": Int(1)}, keys=[("account", "account")])
class deposit:
    def run(ctx, args):
        balance = ctx.read("account", args["account"]) + args["amount"]
        ctx.write("account", args["account"], balance)
        return balance
'''

_started: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_process_left():
    yield
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.kill()
            process.wait()


def _ordo(folder, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(folder), ROOT])}
    process = subprocess.Popen(
        [sys.executable, "-m", "ordo.cli", *args],
        cwd=folder,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _started.append(process)
    return process


def _finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def _contents(broker: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of `topic`: (partition, offset, key, value), in order."""
    consumer = topic_reader(broker, topic, consumer_timeout_ms=3000, isolation_level="read_uncommitted")
    try:
        found = [(m.partition, m.offset, m.key, m.value) for m in consumer]
        ends = consumer.end_offsets(list(consumer.assignment()))
    finally:
        consumer.close()
    assert sum(ends.values()) >= len(found)
    return sorted(found)


def _recover(folder, broker: str, namespace: str, data_dir, *extra: str) -> tuple[int, str]:
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    command = ("recover", *kafka, "--data-dir", str(data_dir), "--app", "bank:app", "--runtime", "local")
    code, out, err = _finish(_ordo(folder, *command, "--idle", "0", "--quiet", *extra))
    return code, err


def _digest(folder, data_dir) -> str:
    code, out, err = _finish(_ordo(folder, "digest", "--data-dir", str(data_dir)), timeout=120)
    assert code == 0, err
    return out.strip()


@pytest.mark.slow
def test_a_rebuild_beside_the_serving_engine_publishes_nothing_and_the_engine_s_own_replay_publishes_copies(
    broker, namespace, tmp_path, fault_report
):
    (tmp_path / "bank.py").write_text(BANK)
    live = tmp_path / "live"
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    engine = _ordo(
        tmp_path, "run", *kafka, "--data-dir", str(live), "--app", "bank:app", "--runtime", "local", "--quiet",
        "--partitions", "2", "--max-delay-ms", "5",
    )  # fmt: skip
    with Client(broker, namespace) as client:
        client.wait_for_topics()
        ids = [client.submit("deposit", {"account": n % 7, "amount": n}, request_id=f"d-{n}") for n in range(60)]
        outcomes = client.wait(ids, timeout=120)
    assert len(outcomes) == 60
    topics = [f"{namespace}.results", f"{namespace}.changes", f"{namespace}.requests"]
    before = {topic: _contents(broker, topic) for topic in topics}
    assert len({key for _, _, key, _ in before[f"{namespace}.results"]}) == 60

    # A check beside the serving engine: nothing of it reaches the live topics.
    code, err = _recover(tmp_path, broker, namespace, tmp_path / "scratch", "--from-scratch", "--partitions", "1")
    assert code == 0, err
    assert "Traceback" not in err
    after = {topic: _contents(broker, topic) for topic in topics}
    assert after == before, "the rebuild wrote into the live topics"
    # Done again on the same directory (not an engine's own): still nothing.
    code, err = _recover(tmp_path, broker, namespace, tmp_path / "scratch", "--from-scratch", "--partitions", "1")
    assert code == 0, err
    assert {topic: _contents(broker, topic) for topic in topics} == before
    assert engine.poll() is None, "the live engine stopped"
    assert stop(engine) == 0
    assert _digest(tmp_path, tmp_path / "scratch") == _digest(tmp_path, live)

    # The engine's own data directory, replayed from scratch: its outputs go out again, as
    # copies of those already there.
    results = f"{namespace}.results"
    code, err = _recover(tmp_path, broker, namespace, live, "--from-scratch")
    assert code == 0, err
    first = Counter((key, value) for _, _, key, value in before[results])
    again = Counter((key, value) for _, _, key, value in _contents(broker, results))
    assert again == first + first  # each outcome once more, byte for byte
    copies = sum(first.values())
    assert _digest(tmp_path, live) == _digest(tmp_path, tmp_path / "scratch")
    fault_report(
        f"60 outcomes; 2 rebuilds beside the engine left {len(topics)} topics byte for byte; the engine's own "
        f"replay published {copies} identical copies"
    )


def test_where_a_replay_s_outputs_go_is_said_before_it_starts(tmp_path):
    from ordo.recover import outputs_line
    from ordo.storage.layout import check_layout, mark_publishing, publishes

    data_dir = str(tmp_path / "d")
    assert not publishes(data_dir)  # nothing there: a rebuild
    check_layout(data_dir, 1, "shop")
    assert publishes(data_dir)  # laid out before the mark was recorded: an engine's
    mark_publishing(data_dir, False)
    assert not publishes(data_dir)
    mark_publishing(data_dir, True)
    assert publishes(data_dir)
    assert outputs_line("shop", data_dir, False, True) == (
        f"outputs: none published ({data_dir} is not an engine's own data directory); shop's topics are left "
        "as they are"
    )
    assert "(--publish)" in outputs_line("shop", data_dir, True, False)


RATED = '''"""Deposits at a rate read from a data file beside the module: a read the identity does not cover."""
import os

import ordo
from ordo import Int

app = ordo.App("rated")
app.table("account", default=0)
RATE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rate.txt")


@app.procedure(args={"account": Int(0), "amount": Int(1)}, keys=[("account", "account")])
class deposit:
    def run(ctx, args):
        with open(RATE_FILE) as f:
            rate = int(f.read())
        balance = ctx.read("account", args["account"]) + rate * args["amount"]
        ctx.write("account", args["account"], balance)
        return balance
'''


@pytest.mark.slow
def test_a_replay_that_computes_another_output_than_the_one_published_says_so_and_publishes_none_of_it(
    broker, namespace, tmp_path, fault_report
):
    (tmp_path / "rated.py").write_text(RATED)
    (tmp_path / "rate.txt").write_text("1")
    live = tmp_path / "live"
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace)
    engine = _ordo(
        tmp_path, "run", *kafka, "--data-dir", str(live), "--app", "rated:app", "--runtime", "local", "--quiet",
        "--max-delay-ms", "5",
    )  # fmt: skip
    with Client(broker, namespace) as client:
        client.wait_for_topics()
        ids = [client.submit("deposit", {"account": n % 3, "amount": 1}, request_id=f"d-{n}") for n in range(9)]
        assert len(client.wait(ids, timeout=120)) == 9
    assert stop(engine) == 0
    topics = [f"{namespace}.results", f"{namespace}.changes"]
    before = {topic: _contents(broker, topic) for topic in topics}

    (tmp_path / "rate.txt").write_text("2")
    command = ("recover", *kafka, "--data-dir", str(live), "--app", "rated:app", "--runtime", "local")
    code, _, err = _finish(_ordo(tmp_path, *command, "--idle", "0", "--quiet", "--from-scratch"))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "computed another output" in lines[0] and f"{namespace}.results" in lines[0], err
    assert {topic: _contents(broker, topic) for topic in topics} == before, "a differing output was published"
    fault_report(f"9 deposits at rate 1, replayed at rate 2 from the engine's own directory: refused: {lines[0]}")
