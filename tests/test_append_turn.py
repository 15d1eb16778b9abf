"""Append turns (sequencer/append_turn.py): one holder at a time per log, across threads and
processes; a dead holder's turn is free; a hung holder gives the waiter one clear line."""

import os
import subprocess
import sys
import threading
import time

import pytest

from ordo.sequencer.append_turn import AppendTurn, needs_turns, turn_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_only_the_local_broker_needs_turns():
    assert needs_turns("tansu_cluster")
    assert not needs_turns("MkU3OEVBNTcwNTJENDM2Qk")  # an Apache Kafka cluster id
    assert not needs_turns(None)


def test_the_turn_is_named_by_what_every_client_sees_alike():
    one = turn_path("tansu_cluster", ["127.0.0.1:9092"], "ns.log")
    assert one == turn_path("tansu_cluster", ["127.0.0.1:9092"], "ns.log")
    assert one != turn_path("tansu_cluster", ["127.0.0.1:9093"], "ns.log")
    assert one != turn_path("tansu_cluster", ["127.0.0.1:9092"], "other.log")


def test_one_holder_at_a_time(tmp_path):
    path = str(tmp_path / "turns" / "log.lock")
    holders, most, lock = [0], [0], threading.Lock()

    def append(turn: AppendTurn) -> None:
        for _ in range(200):
            with turn:
                with lock:
                    holders[0] += 1
                    most[0] = max(most[0], holders[0])
                time.sleep(0.0001)
                with lock:
                    holders[0] -= 1

    turns = [AppendTurn(path, "ns.log", wait_limit=30) for _ in range(3)]
    threads = [threading.Thread(target=append, args=(turn,)) for turn in turns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1
    with pytest.raises(ValueError), turns[0]:
        raise ValueError("an append that fails still gives its turn back")
    with turns[1]:
        pass
    for turn in turns:
        turn.close()


def test_a_dead_holder_frees_the_turn_and_a_hung_one_is_named(tmp_path):
    path = str(tmp_path / "log.lock")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from ordo.sequencer.append_turn import AppendTurn\n"
            "turn = AppendTurn(sys.argv[1], 'ns.log', 5).__enter__(); print('held', flush=True); time.sleep(60)",
            path,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = AppendTurn(path, "ns.log", wait_limit=0.3)
        with pytest.raises(TimeoutError) as hung:
            waiter.__enter__()
        message = str(hung.value)
        assert "\n" not in message and "ns.log" in message and "hung" in message
        holder.kill()
        holder.wait(10)
        with waiter:  # the operating system released the killed holder's turn
            pass
        waiter.close()
    finally:
        holder.kill()
        holder.stdout.close()
