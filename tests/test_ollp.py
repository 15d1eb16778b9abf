"""Dependent transactions (Calvin's OLLP) on the alias workload: every scheduler and
partition count decides the same outcomes, state, change data and restart requests, and
the decided requests replayed one by one in (batch, txn) order give the same statuses and
state as a plain model of alias."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordo.procedures.ollp import LATE_MS, MAX_LATE_RESTARTS, MAX_RESTARTS, OLLP_FIELD
from ordo.procedures.registry import default_registry
from ordo.procedures.workloads import alias
from tests.dependent_logs import assert_equals_serial_interpretation, assert_same_run, run_dependent

REGISTRY = default_registry()
CONFIGS = [
    ("serial", 1),
    ("locking", 2),
    ("vll", 3),
    ("opchain", 2),
    ("serial", 3),
    ("locking", 1),
    ("vll", 2),
    ("opchain", 1),
]

names = st.sampled_from(["a", "b", "c", "d", "zz"])
accounts = st.integers(0, 7)
op = st.one_of(
    st.builds(lambda a, n: ("alias_bind", {"alias": a, "account": n}), names, accounts),
    st.builds(lambda a, m: ("alias_deposit", {"alias": a, "amount": m}), names, st.integers(0, 30)),
    st.builds(lambda s, d, m: ("alias_transfer", {"src": s, "dst": d, "amount": m}), names, names, st.integers(0, 40)),
)
logs = st.lists(st.lists(op, min_size=1, max_size=12), min_size=1, max_size=4)


def requests(drawn):
    out, n = [], 0
    for batch in drawn:
        out.append([])
        for proc, args in batch:
            out[-1].append({"id": f"r{n}", "proc": proc, "args": args})
            n += 1
    return out


def model(positioned, log_requests):
    """Replay the decided requests one by one in (batch, txn) order over plain dicts."""
    bindings, balances, statuses = {}, {}, {}
    by_id = {r["id"]: r for batch in log_requests for r in batch}
    for _, _, record in positioned:
        request = by_id[record["id"]]
        args = request["args"]
        if record["status"] == "rejected":
            statuses[record["id"]] = "rejected"
            continue
        if request["proc"] == "alias_bind":
            bindings[args["alias"]] = args["account"]
            status = "committed"
        elif request["proc"] == "alias_deposit":
            account = bindings.get(args["alias"])
            if account is None:
                status = "aborted"
            else:
                balances[account] = balances.get(account, 0) + args["amount"]
                status = "committed"
        else:
            src, dst = bindings.get(args["src"]), bindings.get(args["dst"])
            if src is None or dst is None or balances.get(src, 0) < args["amount"]:
                status = "aborted"
            else:
                balances[src] = balances.get(src, 0) - args["amount"]
                balances[dst] = balances.get(dst, 0) + args["amount"]
                status = "committed"
        statuses[record["id"]] = status
    state = {("alias", a): n for a, n in bindings.items()}
    state.update({("alias_account", n): v for n, v in balances.items()})
    return statuses, state


def check_against_model(run, log_requests):
    ids = [r["id"] for batch in log_requests for r in batch]
    decided = [record["id"] for _, _, record in run["positioned"]]
    assert sorted(decided) == sorted(ids)  # one outcome per request
    statuses, state = model(run["positioned"], log_requests)
    assert {r["id"]: r["status"] for _, _, r in run["positioned"]} == statuses
    assert run["state"] == state


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs)
def test_every_scheduler_and_partition_count_decides_alike(drawn):
    log_requests = requests(drawn)
    first = None
    for scheduler, partitions in CONFIGS:
        run = run_dependent(log_requests, scheduler, partitions, REGISTRY)
        if first is None:
            first = run
            check_against_model(run, log_requests)
            assert_equals_serial_interpretation(run, REGISTRY)
            continue
        assert_same_run(run, first, (scheduler, partitions))


def test_a_rebinding_before_the_turn_restarts_and_the_bound_ends_in_a_rejection():
    binds = [{"id": f"b{i}", "proc": "alias_bind", "args": {"alias": f"a{i}", "account": i}} for i in range(3)]
    money = [{"id": "d0", "proc": "alias_deposit", "args": {"alias": "a0", "amount": 100}}]
    # The transfer's reconnaissance sees a0 -> 0; the rebind in the next batch changes it.
    transfer = [
        {"id": "t", "proc": "alias_transfer", "args": {"src": "a0", "dst": "a1", "amount": 5}},
        {"id": "rb", "proc": "alias_bind", "args": {"alias": "a0", "account": 2}},
    ]
    unknown = [{"id": "u", "proc": "alias_deposit", "args": {"alias": "nobody", "amount": 1}}]
    run = run_dependent([binds, money, transfer, unknown], "locking", 2, REGISTRY)
    records = {r["id"]: r for _, _, r in run["positioned"]}
    assert records["t"]["status"] == "aborted" and records["t"]["error"] == "insufficient funds"
    assert records["t"]["restarts"] == 1
    assert records["u"]["status"] == "aborted" and records["u"]["error"] == "unknown alias"
    steps = [json.loads(m) for m in run["restarts"] if json.loads(m)["id"] == "t"]
    assert [s["args"][OLLP_FIELD]["restarts"] for s in steps] == [0, 1]
    assert steps[0]["args"][OLLP_FIELD]["assumed"] == [0, 1]  # a0, a1 as read at the first turn
    assert steps[1]["args"][OLLP_FIELD]["assumed"] == [2, 1]

    # A rebind before every turn: the restart bound ends in a clear rejection.
    chase = [[{"id": "x", "proc": "alias_deposit", "args": {"alias": "a0", "amount": 1}}]]
    for k in range(MAX_RESTARTS + 3):
        chase.append([{"id": f"rb{k}", "proc": "alias_bind", "args": {"alias": "a0", "account": 10 + k}}])
    for scheduler in ("serial", "locking", "vll", "opchain"):
        run = run_dependent(chase, scheduler, 2, REGISTRY, restarts_first=False)
        records = {r["id"]: r for _, _, r in run["positioned"]}
        assert records["x"]["status"] == "rejected"
        assert f"limit {MAX_RESTARTS} restarts" in records["x"]["error"]
        assert len([m for m in run["restarts"] if json.loads(m)["id"] == "x"]) == MAX_RESTARTS + 1


def test_restarts_after_a_long_wait_do_not_count_toward_the_limit_but_are_bounded():
    """A turn that came more than LATE_MS of log time after the turn that read the
    assumptions waited behind a backlog: losing that race is not counted, so the chase
    that ends in a rejection when batches follow each other promptly ends in a commit
    when each wait is long; and the uncounted restarts have a bound of their own."""
    binds = [{"id": "b0", "proc": "alias_bind", "args": {"alias": "a0", "account": 0}}]

    def chase(rebinds: int) -> list[list[dict]]:
        batches = [binds, [{"id": "x", "proc": "alias_deposit", "args": {"alias": "a0", "amount": 1}}]]
        for k in range(rebinds):
            batches.append([{"id": f"rb{k}", "proc": "alias_bind", "args": {"alias": "a0", "account": 10 + k}}])
        return batches

    for scheduler in ("serial", "locking", "vll", "opchain"):
        run = run_dependent(
            chase(MAX_RESTARTS + 3), scheduler, 2, REGISTRY, restarts_first=False, ms_per_batch=LATE_MS + 1
        )
        x = {r["id"]: r for _, _, r in run["positioned"]}["x"]
        assert (x["status"], x["restarts"]) == ("committed", MAX_RESTARTS + 3), (scheduler, x)
        assert run["state"][("alias_account", 10 + MAX_RESTARTS + 2)] == 1

        run = run_dependent(
            chase(MAX_RESTARTS + MAX_LATE_RESTARTS + 3),
            scheduler,
            1,
            REGISTRY,
            restarts_first=False,
            ms_per_batch=LATE_MS + 1,
        )
        x = {r["id"]: r for _, _, r in run["positioned"]}["x"]
        assert x["status"] == "rejected" and x["restarts"] == MAX_RESTARTS + MAX_LATE_RESTARTS, (scheduler, x)
        assert f"not counting {MAX_LATE_RESTARTS} after a wait of over {LATE_MS} ms" in x["error"]


def test_assumptions_a_client_gives_are_checked_and_bad_ones_rejected():
    from ordo.procedures.registry import RequestError
    import pytest

    with pytest.raises(RequestError, match="one value per reconnaissance key"):
        REGISTRY.analyze("alias_deposit", {"alias": "a", "amount": 1, OLLP_FIELD: {"restarts": 0, "assumed": []}})
    with pytest.raises(RequestError, match="restarts"):
        REGISTRY.analyze(
            "alias_deposit",
            {"alias": "a", "amount": 1, OLLP_FIELD: {"restarts": MAX_RESTARTS + MAX_LATE_RESTARTS + 1, "assumed": [3]}},
        )
    with pytest.raises(RequestError, match="late"):
        REGISTRY.analyze(
            "alias_deposit",
            {"alias": "a", "amount": 1, OLLP_FIELD: {"restarts": 1, "assumed": [3], "late": 2, "at": 5}},
        )
    _, reads, writes = REGISTRY.analyze(
        "alias_deposit", {"alias": "a", "amount": 1, OLLP_FIELD: {"restarts": 0, "assumed": [3]}}
    )
    assert reads == (("alias", "a"), ("alias_account", 3)) and writes == (("alias_account", 3),)
    _, reads, writes = REGISTRY.analyze("alias_deposit", {"alias": "a", "amount": 1})
    assert reads == (("alias", "a"),) and writes == ()


def test_generator_binds_first_then_mixes():
    made = list(alias.generate(300, seed=4, aliases=20))
    assert [r["proc"] for r in made[:20]] == ["alias_bind"] * 20
    assert {r["proc"] for r in made[20:]} == {"alias_bind", "alias_deposit", "alias_transfer"}
    assert made == list(alias.generate(300, seed=4, aliases=20))
