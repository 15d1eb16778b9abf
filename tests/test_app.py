"""The app API: tables and procedures declared with decorators, found by `ordo run --app
module:app` relative to the current directory, run without the built-in workloads unless
asked for; every misspelled or empty registration is one clear error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import ordo
from ordo.app import App
from ordo.testing import TestEngine
from ordo.procedures.args import Int, List
from ordo.procedures.contract import Table
from ordo.procedures.loading import load_registry, workload_spec
from ordo.procedures.registry import RequestError
from ordo.scheduler.reference import SerialInterpreter
from ordo.log.records import Batch
from tests.helpers import ROOT, read_results, stop

BANK = textwrap.dedent("""
    import ordo
    from ordo.procedures.args import Int

    app = ordo.App("bank")
    app.table("account", default=100)

    @app.procedure(args={"account": Int(0), "amount": Int(1)})
    class deposit:
        def analyze(args):
            key = ("account", args["account"])
            return [key], [key]

        def run(ctx, args):
            balance = ctx.read("account", args["account"]) + args["amount"]
            ctx.write("account", args["account"], balance)
            return balance

    def _withdraw_keys(args):
        key = ("account", args["account"])
        return [key], [key]

    @app.procedure(args={"account": Int(0), "amount": Int(1)}, analyze=_withdraw_keys)
    def withdraw(ctx, args):
        balance = ctx.read("account", args["account"])
        if balance < args["amount"]:
            ctx.abort("insufficient funds")
        ctx.write("account", args["account"], balance - args["amount"])
        return balance - args["amount"]
""")


def bank_app() -> App:
    namespace: dict = {}
    exec(compile(BANK, "bank.py", "exec"), namespace)
    return namespace["app"]


def run_log(registry, entries):
    batch = Batch(1, 0, 0, {}, [[f"r{i}", proc, args] for i, (proc, args) in enumerate(entries)])
    return SerialInterpreter(registry).apply([batch])


def test_an_app_declares_tables_and_both_procedure_forms():
    app = bank_app()
    assert isinstance(app, ordo.App)
    assert [t.name for t in app.TABLES] == ["account"]
    assert sorted(p.name for p in app.PROCEDURES) == ["deposit", "withdraw"]
    interpreter = run_log(
        app.registry(),
        [
            ("deposit", {"account": 1, "amount": 5}),
            ("withdraw", {"account": 1, "amount": 200}),
            ("withdraw", {"account": 1, "amount": 5}),
        ],
    )
    assert [(o["status"], o["result"]) for o in interpreter.outcomes] == [
        ("committed", 105),
        ("aborted", None),
        ("committed", 100),
    ]
    assert interpreter.outcomes[1]["error"] == "insufficient funds"


def test_an_app_registry_has_no_built_in_workloads_unless_named():
    registry = bank_app().registry()
    with pytest.raises(RequestError, match="unknown procedure 'sl_deposit'"):
        registry.analyze("sl_deposit", {})
    # A user's 'account' (default 100) meets sl's 'account' (default 0) only when asked for.
    with pytest.raises(ValueError, match="'account' registered twice with different settings"):
        bank_app().registry("sl")
    assert "micro_rmw" in bank_app().registry("micro").procedures


@pytest.mark.parametrize(
    "declare, message",
    [
        (lambda app: app.procedure(lambda ctx, args: None), "not a bare @app.procedure"),
        (lambda app: app.procedure()(lambda ctx, args: None), "needs args="),
        (lambda app: app.procedure(args={"n": int})(lambda ctx, args: None), r"args\['n'\] must be Int\(\)"),
        (lambda app: app.procedure(args={})(lambda ctx, args: None), "needs analyze="),
        (
            lambda app: app.procedure(args={})(type("p", (), {"analyse": lambda a: ([], []), "run": lambda c, a: 1})),
            "'analyse' is not a part of a procedure; did you mean 'analyze'",
        ),
        (lambda app: app.procedure(args={})(type("p", (), {"analyze": lambda a: ([], [])})), "the class needs run"),
        (
            lambda app: app.procedure(args={})(type("p", (), {"analyze": 1, "run": lambda c, a: 1})),
            "analyze must be a function",
        ),
        (lambda app: app.procedure(args={}, name="")(42), "cannot name the procedure"),
        (lambda app: app.table(""), "a table needs a name"),
        (lambda app: app.table("t", partitioner="range"), "partitioner must be 'hash' or 'modulo'"),
        (
            lambda app: app.table(type("t", (), {"defualt": 0})),
            "'defualt' is not a table setting; did you mean 'default'",
        ),
        (lambda app: app.table("t", range_by=1), "range_by needs partition_by"),
        (
            lambda app: app.procedure(args={"a": Int()}, keys=[("t", "b")])(lambda ctx, args: None),
            "keys= names argument 'b', which is not in args",
        ),
        (
            lambda app: app.procedure(args={"a": Int()}, reads=["t"])(lambda ctx, args: None),
            r"reads= holds 't'; each key is \(table, argument name\)",
        ),
        (
            lambda app: app.procedure(args={"a": Int()}, keys=[("t", "a")], analyze=lambda a: ([], []))(
                lambda ctx, args: None
            ),
            "either as argument paths",
        ),
        (lambda app: [app.stream("s"), app.window("s", owner="p", rows=2, slide=1)], "'s' declared twice"),
        (lambda app: app.window("w", owner="p", rows=2), "need integers 1 <= slide <= size"),
        (lambda app: app.window("w", owner="p", rows=2, slide=1, range_ms=5), "give either rows and slide"),
    ],
)
def test_misused_declarations_fail_at_import_with_the_reason(declare, message):
    with pytest.raises((TypeError, ValueError), match=message):
        declare(App("bank"))


def test_keys_given_as_argument_paths_derive_analyze():
    app = App("shop")
    app.table("stock")

    @app.table(partition_by=0, range_by=1)
    class order_line:
        default = None

    @app.procedure(
        args={"w": Int(0), "item": Int(0), "others": List(Int(0)), "note": Int()},
        keys=[("stock", ("w", "item"))],
        reads=[("stock", "others")],
        writes=[("order_line", ("w", "note"))],
    )
    def order(ctx, args):
        return None

    assert order_line == Table("order_line", None, "hash", 0, 1) and app.TABLES[1] is order_line
    reads, writes = order.analyze({"w": 1, "item": 2, "others": [5, 6], "note": 9})
    assert reads == [("stock", (1, 2)), ("stock", 5), ("stock", 6)]
    assert writes == [("stock", (1, 2)), ("order_line", (1, 9))]


def test_an_app_declares_streams_windows_and_nested_transactions_and_the_registry_checks_them():
    app = App("flow")
    app.table("t")
    app.procedure("src", args={"v": Int()}, writes=[("t", "v")])(lambda ctx, args: ctx.emit("s", [args["v"]]))
    app.procedure("dst", args={}, analyze=lambda args: ([("t", args["v"])], [("t", args["v"])]))(
        lambda ctx, batch: ctx.write("t", batch[0][0], ctx.read("t", batch[0][0]) + 1)
    )
    app.stream("s", producers=["src"], consumers=["dst"])
    app.stream("typo", producers=["src"], consumers=["dts"])
    with pytest.raises(ValueError, match="app 'flow': stream 'typo' names unknown procedure 'dts'"):
        app.registry()
    del app._flows["typo"]
    with TestEngine(app, "locking", 2) as engine:
        outcome = engine.call("src", {"v": 4})
        assert outcome["steps"] == [{"proc": "dst", "status": "committed", "error": None}]
        assert engine.read("t", 4) == 1


def test_a_procedure_or_table_declared_twice_differently_is_an_error():
    app = App("bank")
    app.table("t")
    app.table("t")  # the same settings again: harmless
    with pytest.raises(ValueError, match="table 't' declared twice"):
        app.table("t", default=1)
    app.procedure(args={}, analyze=lambda a: ([], []))(lambda ctx, args: None)
    with pytest.raises(ValueError, match="procedure '<lambda>' declared twice"):
        app.procedure(args={}, analyze=lambda a: ([], []))(lambda ctx, args: None)


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A directory holding user modules, as the current directory."""
    (tmp_path / "bank.py").write_text(BANK)
    (tmp_path / "empty_app.py").write_text("import ordo\napp = ordo.App('empty')\n")
    (tmp_path / "no_procs.py").write_text(
        "from ordo.procedures.contract import Table\nTABLES = [Table('t')]\nPROCEDURE = []\n"
    )
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in ("bank", "empty_app", "no_procs"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    "specs, message",
    [
        (["bank:ap"], "module 'bank' has no attribute 'ap' (did you mean 'app'?)"),
        (["bnak:app"], "cannot import 'bnak': no module named 'bnak' (the path is relative to the current directory"),
        (["bank"], "module 'bank' defines no PROCEDURES (it defines an app: use --app bank:app)"),
        (["empty_app:app"], "'empty_app:app' registers no procedures"),
        (["no_procs"], "module 'no_procs' defines no PROCEDURES (did you mean 'PROCEDURE'?)"),
        (["bank:app", workload_spec("sl")], "'account' registered twice with different settings"),
    ],
)
def test_a_misspelled_or_empty_registration_is_one_clear_error(user_dir, specs, message):
    with pytest.raises(ValueError) as caught:
        load_registry(specs)
    assert message in str(caught.value)


def test_specs_load_only_what_they_name(user_dir):
    assert set(load_registry(["bank:app"]).procedures) == {"deposit", "withdraw"}
    assert set(load_registry([workload_spec("micro")]).procedures) == {"micro_rmw"}
    assert "sl_transfer" in load_registry([]).procedures  # nothing named: the built-in workloads


def cli(*args: str, cwd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-m", "ordo.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("command", ["run", "execute", "recover", "sequence"])
def test_every_command_refuses_a_bad_app_in_one_line(user_dir, command):
    extra = [] if command == "sequence" else ["--data-dir", str(user_dir / "d")]
    done = cli(command, "--bootstrap-servers", "127.0.0.1:1", *extra, "--app", "empty_app:app", cwd=str(user_dir))
    assert done.returncode == 2
    assert done.stderr.strip() == f"ordo {command}: 'empty_app:app' registers no procedures"
    done = cli(command, "--bootstrap-servers", "127.0.0.1:1", *extra, "--app", "bank", cwd=str(user_dir))
    assert done.returncode == 2 and "--app takes MODULE:APP" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [1, 2])
def test_ordo_run_app_serves_the_app_from_the_current_directory(broker, namespace, user_dir, partitions):
    from ordo.client import Client

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            str(user_dir / "data"),
            "--quiet",
            "--partitions",
            str(partitions),
            "--app",
            "bank:app",
        ],
        cwd=str(user_dir),
        env=env,
    )
    try:
        client = Client(broker, namespace)
        requests = [{"id": f"d{i}", "proc": "deposit", "args": {"account": i, "amount": 1}} for i in range(4)]
        requests.append(
            {
                "id": "sl",
                "proc": "sl_deposit",
                "args": {"account": 1, "asset": 1, "account_amount": 1, "asset_amount": 1},
            }
        )
        client.submit(requests)
        client.close()
        records = {r["id"]: r for r in read_results(broker, f"{namespace}.results", 5, timeout=120)}
    finally:
        assert stop(engine) == 0
    assert {records[f"d{i}"]["result"] for i in range(4)} == {101}
    assert records["sl"]["status"] == "rejected" and "unknown procedure 'sl_deposit'" in records["sl"]["error"]


def test_the_operation_form_is_declared_beside_run_and_agrees_with_it():
    from ordo.testing import check_deterministic
    from ordo.procedures.args import Int
    from ordo.procedures.operations import READ_MODIFY, Operations, adder

    app = App("counters")
    app.table("counter")

    @app.procedure(args={"key": Int(0), "by": Int(1)})
    class bump:
        def analyze(args):
            return [("counter", args["key"])], [("counter", args["key"])]

        def run(ctx, args):
            value = ctx.read("counter", args["key"]) + args["by"]
            ctx.write("counter", args["key"], value)
            return value

        def operations(args):
            return Operations([READ_MODIFY("counter", args["key"], adder(args["by"]))], result=lambda out: out[0])

    assert bump.operations is not None
    requests = [{"id": f"b{i}", "proc": "bump", "args": {"key": i % 3, "by": i + 1}} for i in range(40)]
    outcomes = check_deterministic(app, requests, batch_size=10)
    assert [o["result"] for o in outcomes[:4]] == [1, 2, 3, 5]

    @app.procedure(args={"key": Int(0), "by": Int(1)})
    class skewed:
        def analyze(args):
            return [("counter", args["key"])], [("counter", args["key"])]

        def run(ctx, args):
            ctx.write("counter", args["key"], ctx.read("counter", args["key"]) + args["by"])

        def operations(args):  # not what RUN does: the operation-chain scheduler disagrees
            return [READ_MODIFY("counter", args["key"], adder(args["by"] + 1))]

    with pytest.raises(AssertionError, match="not deterministic: .*opchain"):
        check_deterministic(app, [{"id": "s", "proc": "skewed", "args": {"key": 1, "by": 1}}])
