"""`ordo bench voter`: S-Store's leaderboard benchmark end to end — votes/s from the first
vote sent to the last outcome (client, sequencer, engine, Kafka), beside S-Store's published
2,200 input batches/s and beside what a user would build instead: a Kafka consumer that runs
each vote's dataflow as three SERIALIZABLE PostgreSQL transactions (validate, leaderboards,
removal), each committed on its own, over the same procedures' RUN functions.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from typing import Any

from ordo.benchmarks.machine import finish_report, machine

# S-Store (VLDB'15), leaderboard maintenance on one core, input batches/s.
S_STORE_VOTES = 2_200
PUBLISHED = {
    "S-Store": 2_200,
    "H-Store async (no ordering)": 5_300,
    "H-Store sync": 210,
    "Esper+VoltDB": 570,
    "Storm+VoltDB": 600,
}


def run_voter(
    scheduler: str,
    partitions: int,
    votes: int,
    seed: int,
    max_txns: int,
    json_path: str | None = None,
    baseline: bool = False,
    knobs: dict | None = None,
    say=lambda text="": print(text, flush=True),
) -> dict[str, Any]:
    from ordo.benchmarks.dependent import Pipeline
    from ordo.benchmarks.runners import shutdown_ray
    from ordo.procedures.workloads import voter
    from ordo.broker.local import local_broker

    requests = list(voter.generate(votes, seed, **(knobs or {})))
    report: dict[str, Any] = {
        "workload": "voter",
        "scheduler": scheduler,
        "partitions": partitions,
        "votes": votes,
        "batch_size": max_txns,
        "machine": machine(),
        "published": PUBLISHED,
    }
    say(f"ordo bench voter ({scheduler}, {partitions} partition(s)): {votes:,} votes, batches of {max_txns}")
    directory = tempfile.mkdtemp(prefix="ordo-voter-")
    try:
        with local_broker() as broker:
            with Pipeline(broker.bootstrap_servers, "voter", scheduler, partitions, max_txns, directory) as pipeline:
                outcomes, elapsed = pipeline.run(requests, timeout=1800)
                namespace = pipeline.namespace
            rate = round(len(requests) / elapsed)
            # The ratio comes from the rounded rate so the report and the line printed agree.
            report["end_to_end"] = {
                "votes_per_s": rate,
                "seconds": round(elapsed, 2),
                "ratio_to_s_store": round(rate / S_STORE_VOTES, 2),
                "outcomes": dict(Counter(o.get("error") or o["status"] for o in outcomes.values())),
            }
            report["leaderboards"] = leaderboards(directory)
            say(
                f"  end to end: {rate:,.0f} votes/s ({len(requests):,} in {elapsed:.1f} s), "
                f"{report['end_to_end']['ratio_to_s_store']:.2f} x S-Store's {S_STORE_VOTES:,} batches/s"
            )
            say(f"  outcomes:   {report['end_to_end']['outcomes']}")
            say(f"  boards:     {format_boards(report['leaderboards'])}")
            if baseline:
                report["baseline"] = _baseline(broker.bootstrap_servers, namespace, len(requests))
                say(format_baseline(report["baseline"], rate))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        shutdown_ray()
    return finish_report(report, json_path)


def leaderboards(data_dir: str) -> dict[str, Any]:
    """The three leaderboards and the removed contestants, as `ordo dump` shows them."""
    from ordo.state import records

    boards = {r["key"]: r["value"] for r in records(data_dir, "voter_board")}
    removed = sorted(r["key"] for r in records(data_dir, "voter_contestant") if r["value"] == "removed")
    counts = {r["key"]: r["value"] for r in records(data_dir, "voter_count")}
    return {
        "top3": boards.get("top3"),
        "bottom3": boards.get("bottom3"),
        "trending3": boards.get("trending3"),
        "removed": removed,
        "votes": counts,
    }


def format_boards(boards: dict[str, Any]) -> str:
    def named(ids):
        return ", ".join(f"#{c} ({boards['votes'].get(c, 0)})" for c in ids or [])

    return (
        f"top3 {named(boards['top3'])} | bottom3 {named(boards['bottom3'])} | "
        f"trending3 {', '.join(f'#{c}' for c in boards['trending3'] or [])} | removed {boards['removed']}"
    )


def _baseline(bootstrap: str, namespace: str, count: int) -> dict[str, Any]:
    from ordo.benchmarks.baseline import BaselineUnavailable, PostgresServer

    try:
        server = PostgresServer(install=True).start()
    except BaselineUnavailable as exc:
        return {"error": str(exc)}
    try:
        return run_voter_baseline(bootstrap, namespace, count, server)
    finally:
        server.stop()


def format_baseline(result: dict[str, Any], ordo_rate: float) -> str:
    if "error" in result:
        return f"  PostgreSQL baseline unavailable: {result['error']}"
    return (
        f"  PostgreSQL baseline (three SERIALIZABLE transactions per vote): {result['votes_per_s']:,} votes/s, "
        f"{result['retries']} retries; Ordo / baseline = {ordo_rate / max(1, result['votes_per_s']):.1f}"
    )


def run_voter_baseline(bootstrap: str, namespace: str, count: int, server) -> dict[str, Any]:
    """Consume `<namespace>.requests` from the start; each vote is the dataflow's three
    procedures, each its own SERIALIZABLE transaction committed before the next begins."""
    from ordo.benchmarks.tpcc_baseline import kv_baseline_requests
    from ordo.procedures.registry import default_registry

    registry = default_registry()
    flow = registry.procedures["voter_vote"].run.__self__  # the composed dataflow (procedures/streams.py)
    conn = server.connect()
    counts: Counter = Counter()
    retries = 0
    try:
        started = None
        for seen, body in kv_baseline_requests(conn, bootstrap, namespace, count):
            if started is None:  # the table is set up and the first vote is here
                started = time.perf_counter()
            status, tries = _vote(conn, registry, flow, body, seen)
            counts[status] += 1
            retries += tries
        seconds = time.perf_counter() - started
    finally:
        conn.close()
    return {
        "votes": count,
        "votes_per_s": round(count / seconds),
        "seconds": round(seconds, 2),
        "retries": retries,
        "statuses": dict(counts),
        "server": server.version,
    }


def _vote(conn, registry, flow, body: dict, index: int) -> tuple[str, int]:
    from ordo.procedures.args import ArgumentError, check_args

    vote = registry.procedures["voter_vote"]
    try:
        check_args(vote.args, body.get("args"))
    except ArgumentError:
        return "rejected", 0
    emitted: dict[str, list] = {}
    status, retries = _step(conn, registry, flow, emitted, "voter_vote", body["args"], index)
    for name, stream in (("voter_leaderboard", "voter_validated"), ("voter_remove", "voter_ranked")):
        if status != "committed" or not emitted.get(stream):
            break
        _, tries = _step(conn, registry, flow, emitted, name, emitted.pop(stream), index)
        retries += tries
    return status, retries


def _step(conn, registry, flow, emitted: dict, name: str, args, index: int) -> tuple[str, int]:
    """One procedure of the dataflow as one SERIALIZABLE transaction: (status, retries)."""
    from ordo.benchmarks.tpcc_baseline import _Context, serializable
    from ordo.procedures.streams import StreamContext

    procedure = next(p for p in (flow.input, *flow.steps) if p.name == name)
    defaults = {t.name: t.default for t in registry.tables.values()}
    mine: dict[str, list] = {}

    def transaction(cur) -> None:
        mine.clear()  # what an attempt that rolled back emitted is gone with it
        ctx = StreamContext(_Context(cur, defaults, int(time.time() * 1000), index), flow, mine)
        ctx._current = name
        procedure.run(ctx, args)
        ctx._ctx.flush()

    status, retries = serializable(conn, transaction, f"vote {index}: {name}")
    if status == "committed":
        emitted.update(mine)
    return status, retries
