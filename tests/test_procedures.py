import pytest

from ordo.procedures.registry import RequestError, default_registry
from ordo.procedures.workloads import micro, sl
from ordo.scheduler.execution import ABORTED, COMMITTED, execute, txn_seed
from ordo.storage.keys import encode_key
from ordo.storage.overlay import ABSENT

registry = default_registry()
DEFAULTS = {t.name: t.default for t in registry.tables.values()}


def run(proc, args, state=None, now=0, seed=0):
    procedure, reads, writes = registry.analyze(proc, args)
    state = state or {}
    snapshot = {encode_key(t, k): state.get((t, k), ABSENT) for t, k in reads}
    write_set = {encode_key(t, k) for t, k in writes}
    return execute(procedure, args, snapshot, write_set, DEFAULTS, now, seed)


@pytest.mark.parametrize(
    "proc, args, message",
    [
        ("nope", {}, "unknown procedure 'nope'"),
        (7, {}, "'proc' must be a string"),
        ("sl_deposit", [], "'args' must be an object"),
        ("sl_deposit", {"account": 1}, "missing argument(s): account_amount, asset, asset_amount"),
        (
            "sl_deposit",
            {"account": "1", "asset": 1, "account_amount": 1, "asset_amount": 1},
            "argument 'account': expected integer, got string",
        ),
        (
            "sl_deposit",
            {"account": True, "asset": 1, "account_amount": 1, "asset_amount": 1},
            "argument 'account': expected integer, got boolean",
        ),
        (
            "sl_deposit",
            {"account": 1, "asset": 1, "account_amount": -5, "asset_amount": 1},
            "argument 'account_amount': -5 outside",
        ),
        (
            "sl_deposit",
            {"account": 1, "asset": 1, "account_amount": 1, "asset_amount": 1, "x": 0},
            "unknown argument(s): x",
        ),
        ("micro_rmw", {"keys": []}, "expected 1..64 items, got 0"),
        ("micro_rmw", {"keys": [1, 2.5]}, "argument 'keys[1]': expected integer, got number"),
    ],
)
def test_bad_requests_are_refused_with_a_clear_reason(proc, args, message):
    with pytest.raises(RequestError) as err:
        registry.analyze(proc, args)
    assert message in str(err.value)


def test_analyze_sets_keep_order_and_drop_repeats():
    _, reads, writes = registry.analyze("micro_rmw", {"keys": [5, 3, 5]})
    assert reads == writes == (("micro", 5), ("micro", 3))


def test_micro_increments_each_key_and_repeats_twice():
    status, _, _, writes = run("micro_rmw", {"keys": [1, 2, 1]}, {("micro", 1): 10})
    assert status == COMMITTED
    assert {w[1]: w[2] for w in writes.values()} == {1: 12, 2: 1}


def test_sl_transfer_moves_funds_or_aborts():
    args = {"src_account": 1, "dst_account": 2, "src_asset": 3, "dst_asset": 4, "account_amount": 10, "asset_amount": 5}
    rich = {("account", 1): 10, ("asset", 3): 5}
    status, _, _, writes = run("sl_transfer", args, rich)
    assert status == COMMITTED
    assert {(w[0], w[1]): w[2] for w in writes.values()} == {
        ("account", 1): 0,
        ("account", 2): 10,
        ("asset", 3): 0,
        ("asset", 4): 5,
    }
    status, _, error, writes = run("sl_transfer", args, {("account", 1): 9, ("asset", 3): 5})
    assert (status, error, writes) == (ABORTED, "insufficient funds", {})


def test_sl_transfer_to_itself_keeps_the_balance():
    args = {"src_account": 1, "dst_account": 1, "src_asset": 3, "dst_asset": 3, "account_amount": 4, "asset_amount": 1}
    _, _, _, writes = run("sl_transfer", args, {("account", 1): 10, ("asset", 3): 1})
    assert {(w[0], w[1]): w[2] for w in writes.values()} == {("account", 1): 10, ("asset", 3): 1}


def _custom(run_fn, analyze=lambda a: ([("t", 1)], [("t", 1)])):
    from ordo.procedures.contract import Procedure, Table
    from ordo.procedures.registry import Registry

    reg = Registry()
    reg.add_table(Table("t"))
    reg.add_procedure(Procedure("p", {}, analyze, run_fn))
    procedure, reads, writes = reg.analyze("p", {})
    snapshot = {encode_key(t, k): ABSENT for t, k in reads}
    return execute(procedure, {}, snapshot, {encode_key(t, k) for t, k in writes}, {"t": 0}, 1234, txn_seed(3, 4))


def test_undeclared_read_and_write_abort_the_transaction():
    status, _, error, _ = _custom(lambda ctx, a: ctx.read("t", 2))
    assert status == ABORTED and "undeclared access: read of t[2]" in error
    status, _, error, _ = _custom(lambda ctx, a: ctx.write("t", 9, 1))
    assert status == ABORTED and "undeclared access: write of t[9]" in error


def test_a_raising_procedure_aborts_with_its_error():
    def boom(ctx, a):
        raise ZeroDivisionError("division by zero")

    status, _, error, _ = _custom(boom)
    assert (status, error) == (ABORTED, "p raised ZeroDivisionError: division by zero")


def test_unserialisable_results_and_values_abort():
    status, _, error, _ = _custom(lambda ctx, a: object())
    assert status == ABORTED and "not JSON serializable" in error
    status, _, error, _ = _custom(lambda ctx, a: ctx.write("t", 1, {1, 2}))
    assert status == ABORTED


def test_now_and_random_come_from_the_batch():
    first = _custom(lambda ctx, a: [ctx.now, ctx.random.random()])
    second = _custom(lambda ctx, a: [ctx.now, ctx.random.random()])
    assert first == second and first[1][0] == 1234


def test_reads_are_copies_so_stored_values_stay_immutable():
    def mutate(ctx, a):
        ctx.read("t", 1)["x"] = 99
        return ctx.read("t", 1)

    from ordo.procedures.contract import Procedure

    procedure = Procedure("p", {}, lambda a: ([("t", 1)], []), mutate)
    stored = {"x": 1}
    status, result, _, _ = execute(procedure, {}, {encode_key("t", 1): stored}, set(), {}, 0, 0)
    assert status == COMMITTED and result == {"x": 1} and stored == {"x": 1}


def test_generators_are_seeded_and_target_partitions():
    assert list(sl.generate(50, seed=3)) == list(sl.generate(50, seed=3))
    assert list(sl.generate(50, seed=3)) != list(sl.generate(50, seed=4))
    for request in micro.generate(200, seed=1, partitions=4, mp=0.0):
        assert len({k % 4 for k in request["args"]["keys"]}) == 1
    spans = [len({k % 4 for k in r["args"]["keys"]}) for r in micro.generate(200, seed=1, partitions=4, mp=1.0)]
    assert set(spans) == {2}
    for request in list(micro.generate(100, seed=2)) + list(sl.generate(100, seed=2)):
        registry.analyze(request["proc"], request["args"])


def test_oversized_results_and_errors_are_bounded():
    status, _, error, _ = _custom(lambda ctx, a: "x" * 100_000)
    assert status == ABORTED and error.startswith("result too large")

    def shout(ctx, a):
        ctx.abort("no" * 5000)

    status, _, error, _ = _custom(shout)
    assert status == ABORTED and len(error) <= 1001
