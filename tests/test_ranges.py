"""Declared ranges (docs/keys.md) under every scheduler and partition count: appends under
a write range, scans of a read range and point updates that lock the range they lie in
decide the same outcomes, change data and state, equal to a plain model."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordo.procedures.contract import Prefix
from ordo.procedures.registry import Registry, RequestError
from tests import range_procedures
from tests.dependent_logs import run_dependent, serial_interpretation

REGISTRY = Registry()
REGISTRY.add_workload(range_procedures.TABLES, range_procedures.PROCEDURES)
CONFIGS = [(s, p) for s in ("serial", "locking", "vll", "opchain") for p in (1, 2, 3)]

g = st.integers(0, 3)
s_ = st.integers(0, 1)
op = st.one_of(
    st.builds(lambda g, s, v: ("r_append", {"g": g, "s": s, "v": v}), g, s_, st.integers(0, 100)),
    st.builds(lambda g, s: ("r_total", {"g": g, "s": s}), g, s_),
    st.builds(
        lambda g, g2, s, n, d: ("r_bump", {"g": g, "g2": g2, "s": s, "n": n, "d": d}),
        g,
        g,
        s_,
        st.integers(0, 3),
        st.integers(0, 5),
    ),
)
logs = st.lists(st.lists(op, min_size=1, max_size=15), min_size=1, max_size=3)


def model(log):
    lines, heads, totals, outcomes = {}, {}, {}, []
    for batch in log:
        for proc, a in batch:
            if proc == "r_append":
                n = heads.get((a["g"], a["s"]), 0)
                lines[(a["g"], a["s"], n)] = a["v"]
                heads[(a["g"], a["s"])] = n + 1
                outcomes.append(("committed", n))
            elif proc == "r_total":
                rows = [v for k, v in sorted(lines.items()) if k[:2] == (a["g"], a["s"])]
                totals[(a["g"], a["s"])] = sum(rows)
                outcomes.append(("committed", [sum(rows), len(rows)]))
            else:
                ka, kb = (a["g"], a["s"], a["n"]), (a["g2"], a["s"], a["n"])
                if ka not in lines or kb not in lines:
                    outcomes.append(("aborted", None))
                    continue
                lines[ka] -= a["d"]
                lines[kb] += a["d"]
                outcomes.append(("committed", None))
    state = {("rline", k): v for k, v in lines.items()}
    state.update({("rhead", k): v for k, v in heads.items()})
    state.update({("rtotal", k): v for k, v in totals.items()})
    return outcomes, state


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs)
def test_ranges_agree_with_the_model_under_every_scheduler_and_partition_count(log):
    batches = [
        [{"id": f"r{b}-{i}", "proc": p, "args": a} for i, (p, a) in enumerate(batch)] for b, batch in enumerate(log)
    ]
    outcomes, state = model(log)
    first = None
    for scheduler, partitions in CONFIGS:
        run = run_dependent(batches, scheduler, partitions, REGISTRY)
        assert [(r["status"], r["result"]) for r in run["outcomes"]] == outcomes, (scheduler, partitions)
        assert run["state"] == state, (scheduler, partitions)
        if first is None:
            first = run
            reference = serial_interpretation(run, REGISTRY)
            assert (run["outcomes"], run["changes"], run["digest"]) == (
                reference["outcomes"],
                reference["changes"],
                reference["digest"],
            )
        assert run["changes"] == first["changes"] and run["digest"] == first["digest"], (scheduler, partitions)


def test_point_keys_of_a_range_table_lock_their_range_and_bad_ranges_are_refused():
    _, reads, writes = REGISTRY.analyze("r_bump", {"g": 1, "g2": 2, "s": 0, "n": 3, "d": 1})
    assert Prefix("rline", (1, 0)) in writes and Prefix("rline", (2, 0)) in writes
    assert Prefix("rline", (1, 0)) not in reads
    _, reads, _ = REGISTRY.analyze("r_total", {"g": 1, "s": 0})
    assert reads == (Prefix("rline", (1, 0)),)
    with pytest.raises(RequestError, match="must keep to its partition"):
        REGISTRY.analyze("r_wide", {"g": 1, "s": 0})
    with pytest.raises(RequestError, match="ranges of 2 components"):
        REGISTRY.analyze("r_short", {"g": 1, "s": 0})
    run = run_dependent([[{"id": "x", "proc": "r_sneak", "args": {"g": 0, "s": 0}}]], "locking", 2, REGISTRY)
    [record] = run["outcomes"]
    assert record["status"] == "aborted" and "not in the write set" in record["error"]
