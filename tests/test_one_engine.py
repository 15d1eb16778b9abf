"""One engine per namespace: a second `ordo run` on a namespace whose engine is live (another
data directory, by mistake) is refused at start in one line naming the live one; a sequencer
fenced by a newer one stops in one line and is not restarted into fencing it back."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from confluent_kafka import Consumer, TopicPartition

from ordo.client import Client
from ordo.sequencer.lane_owner import OWNER_ENV
from tests.helpers import ordo, stop

DEPOSIT = "sl_deposit"


def _deposit(client: Client, account: int) -> dict:
    return client.wait_one(
        client.submit(DEPOSIT, {"account": account, "asset": account, "account_amount": 5, "asset_amount": 5}),
        timeout=120,
    )


def _engine(bootstrap: str, namespace: str, data_dir: str, **kwargs) -> subprocess.Popen:
    return ordo(
        "run",
        "--bootstrap-servers",
        bootstrap,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--runtime",
        "local",
        "--quiet",
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_a_second_ordo_run_on_a_live_namespace_is_refused_in_one_line(broker, namespace, tmp_path, fault_report):
    first = _engine(broker, namespace, str(tmp_path / "first"))
    second = None
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics(timeout=60)
            assert _deposit(client, 1)["status"] == "committed"
            second = _engine(broker, namespace, str(tmp_path / "second"))
            _, said = second.communicate(timeout=120)
            assert second.returncode == 2, said
            last = _lines(said)[-1]
            assert "Traceback" not in said and "restarting" not in said, said
            assert last.startswith(f"ordo run: ordo run (pid {first.pid} ") and str(tmp_path / "first") in last, last
            assert f"is sequencing namespace {namespace}" in last, last
            # The first engine never noticed: it sequences and answers as before.
            answered = [_deposit(client, account)["status"] for account in range(2, 12)]
            assert answered == ["committed"] * 10
        assert first.poll() is None
    finally:
        if second is not None and second.poll() is None:
            stop(second)
        stop(first)
    said_first = first.stderr.read()
    assert "Traceback" not in said_first and "restarting" not in said_first, said_first
    fault_report(
        f"a second ordo run on the live namespace (another data directory): refused in "
        f"{len(_lines(said))} line(s) naming the first; the first answered 10 more requests, no restart"
    )


def _note(bootstrap: str, namespace: str) -> dict:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{namespace}.sequencer", "enable.auto.commit": False}
    )
    try:
        (position,) = consumer.committed([TopicPartition(f"{namespace}.requests", 0)], timeout=10)
        return json.loads(position.metadata)
    finally:
        consumer.close()


def test_a_fenced_sequencer_stops_its_engine_in_one_line_and_is_not_restarted(
    broker, namespace, tmp_path, monkeypatch, fault_report
):
    first = _engine(broker, namespace, str(tmp_path / "first"))
    intruder = None
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics(timeout=60)
            assert _deposit(client, 1)["status"] == "committed"
            # A start that passed the look at the same moment: it carries the live one's identity,
            # so nothing refuses it, and it fences the live sequencer.
            live = _note(broker, namespace)
            monkeypatch.setenv(OWNER_ENV, json.dumps({"id": live["id"], "who": "the intruder"}))
            intruder = ordo(
                "sequence", "--bootstrap-servers", broker, "--namespace", namespace, stderr=subprocess.PIPE, text=True
            )
            started = intruder.stderr.readline()
            assert "resumes at batch" in started, started
            client.submit(DEPOSIT, {"account": 2, "asset": 2, "account_amount": 5, "asset_amount": 5})
            _, said = first.communicate(timeout=120)
        assert first.returncode == 2, said
        assert "Traceback" not in said and "restarting" not in said, said
        last = _lines(said)[-1]
        assert last.startswith("ordo run: ") and f"started sequencing namespace {namespace}" in last, last
        assert "fenced this one, which stops" in last, last
        assert intruder.poll() is None, "the newer sequencer goes on"
    finally:
        if intruder is not None:
            stop(intruder)
        stop(first)
    fault_report(
        "a second sequencer started on the live lane (no look refused it): the fenced engine stopped "
        "in one line, its sequencer not restarted, the newer one went on"
    )


def test_an_engine_killed_does_not_hold_the_namespace(broker, namespace, tmp_path, fault_report):
    first = _engine(broker, namespace, str(tmp_path / "first"))
    after = None
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics(timeout=60)
            assert _deposit(client, 1)["status"] == "committed"
        first.send_signal(signal.SIGKILL)  # its sequencer dies with it; its note stops moving
        first.wait(30)
        started = time.monotonic()
        after = _engine(broker, namespace, str(tmp_path / "first"))
        with Client(broker, namespace) as client:
            assert _deposit(client, 2)["status"] == "committed"
        answered_in = time.monotonic() - started
        assert after.poll() is None
    finally:
        if after is not None:
            stop(after)
        if first.poll() is None:
            stop(first)
    said = after.stderr.read()
    assert "one engine per namespace" not in said and "Traceback" not in said, said
    # It says it serves only once its sequencer has resumed (and its lane is settled).
    resumed, serving = said.find("resumes at batch"), said.find("ordo serving")
    assert 0 <= resumed < serving, said
    fault_report(
        f"ordo run SIGKILLed, started again at once on its namespace: not refused, first outcome "
        f"{answered_in:.1f} s after the start"
    )


def test_of_two_ordo_runs_started_at_once_the_loser_stops_before_it_serves(broker, namespace, tmp_path, fault_report):
    """Both pass the look for a live sequencer at the same moment: the one whose lane the
    other's start record takes over stops in one line, without ever serving, executing or
    publishing anything; every request is answered once, by the other."""
    from tests.helpers import read_results

    engines = [_engine(broker, namespace, str(tmp_path / f"engine-{k}")) for k in range(2)]
    try:
        loser = None
        deadline = time.monotonic() + 180
        while loser is None and time.monotonic() < deadline:
            loser = next((e for e in engines if e.poll() is not None), None)
            time.sleep(0.2)
        assert loser is not None, "neither ordo run stopped: two engines serve one namespace"
        winner = engines[1 - engines.index(loser)]
        with Client(broker, namespace) as client:
            answered = [_deposit(client, account)["status"] for account in range(20)]
        assert answered == ["committed"] * 20
        assert winner.poll() is None, "the winner stopped"
        outcomes = read_results(broker, f"{namespace}.results", 20, timeout=60)
    finally:
        for engine in engines:
            stop(engine)
    said = loser.stderr.read()
    lines = _lines(said)
    assert loser.returncode == 2, said
    assert "Traceback" not in said and "ordo serving" not in said, said
    assert (
        lines[-1].startswith("ordo run: ")
        and "one engine per namespace" in lines[-1]
        or ("is sequencing namespace" in lines[-1])
    ), lines[-1]
    ids = [outcome["id"] for outcome in outcomes]
    assert len(ids) == len(set(ids)) == 20, f"outcomes published twice: {len(ids)} for {len(set(ids))} requests"
    fault_report(
        "two ordo runs started at once on one namespace: the loser stopped in one line without serving; "
        "20 requests each answered once by the other"
    )
