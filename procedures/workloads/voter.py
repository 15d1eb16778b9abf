"""voter: S-Store's leaderboard maintenance, a dataflow of three procedures (BENCHMARKS.md).

voter_vote validates a vote and emits it to `voter_validated`; voter_leaderboard counts
it, keeps the window ROWS 100 SLIDE 10 and the leaderboards, and emits n to
`voter_ranked`; voter_remove takes out the weakest contestant every 1000 validated votes.
The whole dataflow of a vote is one slot in the log order (procedures/streams.py).

Besides the tables of the contract, `voter_state` keeps what each vote needs in three keys
(the validated-vote counter "n", the removed ids "removed", and per-id counts "counts"), so a
vote reads five keys rather than every contestant's.
"""

from __future__ import annotations

import random
from typing import Iterator

from ordo.procedures.args import Int
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.streams import Stream, Window
from ordo.procedures.workloads.sampling import request

CONTESTANTS = 25
REMOVE_EVERY = 1000
PHONE_MIN, PHONE_MAX = 2_000_000_000, 9_999_999_999
TREND = "voter_trend"
IDS = range(1, CONTESTANTS + 1)

TABLES = [
    Table("voter_count", default=0),
    Table("voter_phone", default=0),
    Table("voter_contestant", default="running"),
    Table("voter_board", default=None),
    Table("voter_state", default=None),
]

_STATE = [("voter_state", "n"), ("voter_state", "removed"), ("voter_state", "counts")]
_BOARDS = [("voter_board", "top3"), ("voter_board", "bottom3"), ("voter_board", "trending3")]


def _removed(ctx) -> list[int]:
    return ctx.read("voter_state", "removed") or []


def _counts(ctx) -> list[int]:
    return ctx.read("voter_state", "counts") or [0] * (CONTESTANTS + 1)


# --- step 1: validate ---


def _vote_keys(args):
    keys = [("voter_phone", args["phone"]), *_STATE[:2]]
    return keys, keys


def _vote(ctx, args):
    phone, contestant = args["phone"], args["contestant"]
    if not 1 <= contestant <= CONTESTANTS:
        ctx.abort("unknown contestant")
    removed = _removed(ctx)
    if contestant in removed:
        ctx.abort("contestant removed")
    previous = ctx.read("voter_phone", phone)
    if previous and previous not in removed:
        ctx.abort("phone already voted")
    ctx.write("voter_phone", phone, contestant)
    n = (ctx.read("voter_state", "n") or 0) + 1
    ctx.write("voter_state", "n", n)
    ctx.emit("voter_validated", [contestant, n])
    return n


# --- step 2: count, window, leaderboards ---


def _boards_keys(args):
    reads = [*_STATE[1:], ("voter_board", "trending3")]
    writes = [("voter_state", "counts"), *_BOARDS]
    if 1 <= args["contestant"] <= CONTESTANTS:
        writes.append(("voter_count", args["contestant"]))
    return reads, writes


def _ranking(counts: list[int], removed: list[int]) -> list[int]:
    return sorted((c for c in IDS if c not in removed), key=lambda c: (-counts[c], c))


def _write_top_bottom(ctx, counts, removed) -> None:
    ranked = _ranking(counts, removed)
    ctx.write("voter_board", "top3", ranked[:3])
    ctx.write("voter_board", "bottom3", sorted(ranked, key=lambda c: (counts[c], -c))[:3])


def _write_trending(ctx, rows, removed) -> None:
    in_window = [0] * (CONTESTANTS + 1)
    for contestant in rows:
        in_window[contestant] += 1
    trending = sorted((c for c in IDS if in_window[c] and c not in removed), key=lambda c: (-in_window[c], c))
    ctx.write("voter_board", "trending3", trending[:3])


def _on_slide(ctx, rows):
    _write_trending(ctx, rows, _removed(ctx))


def _leaderboard(ctx, batch):
    counts, removed = _counts(ctx), _removed(ctx)
    for contestant, n in batch:
        counts[contestant] += 1
        ctx.write("voter_count", contestant, counts[contestant])
        ctx.window_insert(TREND, contestant)
        ctx.emit("voter_ranked", n)
    ctx.write("voter_state", "counts", counts)
    _write_top_bottom(ctx, counts, removed)


# --- step 3: remove the weakest every 1000 validated votes ---

# Which contestant goes depends on the counts, so every one is declared.
_REMOVE_READS = tuple(_STATE[1:])
_REMOVE_WRITES = (*_STATE[1:], *_BOARDS, *(("voter_contestant", c) for c in IDS), *(("voter_count", c) for c in IDS))


def _remove_keys(args):
    return _REMOVE_READS, _REMOVE_WRITES


def _remove(ctx, batch):
    for n in batch:
        removed = _removed(ctx)
        if n % REMOVE_EVERY or CONTESTANTS - len(removed) <= 1:
            continue
        counts = _counts(ctx)
        weakest = min((c for c in IDS if c not in removed), key=lambda c: (counts[c], -c))
        removed = sorted(removed + [weakest])
        ctx.write("voter_state", "removed", removed)
        ctx.write("voter_contestant", weakest, "removed")
        ctx.delete("voter_count", weakest)
        counts[weakest] = 0
        ctx.write("voter_state", "counts", counts)
        _write_top_bottom(ctx, counts, removed)
        _write_trending(ctx, ctx.window(TREND), removed)


_VOTE_ARGS = {"phone": Int(PHONE_MIN, PHONE_MAX), "contestant": Int()}

voter_vote = Procedure("voter_vote", _VOTE_ARGS, _vote_keys, _vote)
voter_leaderboard = Procedure("voter_leaderboard", {}, _boards_keys, _leaderboard)
voter_remove = Procedure("voter_remove", {}, _remove_keys, _remove)

PROCEDURES = [voter_vote, voter_leaderboard, voter_remove]
STREAMS = [
    Stream("voter_validated", producers=["voter_vote"], consumers=["voter_leaderboard"]),
    Stream("voter_ranked", producers=["voter_leaderboard"], consumers=["voter_remove"]),
    Window(TREND, owner="voter_leaderboard", rows=100, slide=10, on_slide=_on_slide),
]

KNOBS = {
    "phones": (int, 200_000, "distinct phone numbers the votes come from"),
    "invalid": (float, 0.01, "share of votes for a contestant outside 1..25"),
}


def generate(count: int, seed: int = 0, phones: int = 200_000, invalid: float = 0.01) -> Iterator[dict]:
    """Votes as S-Store's client makes them: a phone picked at random (so some vote twice),
    a contestant skewed toward a few favourites, now and then an invalid one."""
    if phones < 1:
        raise ValueError("need phones >= 1")
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** 0.5 for rank in range(CONTESTANTS)]
    order = list(IDS)
    rng.shuffle(order)
    for i in range(count):
        phone = PHONE_MIN + rng.randrange(phones)
        if rng.random() < invalid:
            contestant = CONTESTANTS + 1 + rng.randrange(5)
        else:
            contestant = rng.choices(order, weights)[0]
        yield request("voter", seed, i, "voter_vote", {"phone": phone, "contestant": contestant})
