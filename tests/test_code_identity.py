"""A procedure's identity is the code it reaches (procedures/reach.py): its own functions,
the statements of their module they name, and every module of the project they import,
directly or not, without the user naming any; comments, docstrings and formatting change
nothing; compiled code counts by its bytes; and a refusal names exactly the procedures whose
code changed."""

from __future__ import annotations

import os
import py_compile
import sys

import pytest

from ordo.client import Client
from ordo.procedures.fingerprint import changes, describe, set_id
from ordo.procedures.loading import load_registry
from tests.helpers import ROOT, stop

SHOP = '''"""A shop."""
import ordo
from ordo import Int

import pricing

app = ordo.App("shop")
app.table("account", default=0)

FEE = {fee}


def _balance(ctx, account):
    return ctx.read("account", account)


@app.procedure(args={{"account": Int(0), "amount": Int(1)}}, keys=[("account", "account")])
class top_up:
    def run(ctx, args):
        ctx.write("account", args["account"], _balance(ctx, args["account"]) + pricing.credited(args["amount"]))


@app.procedure(args={{"account": Int(0), "amount": Int(1)}}, keys=[("account", "account")])
class withdraw:
    def run(ctx, args):
        ctx.write("account", args["account"], _balance(ctx, args["account"]) - args["amount"] - FEE)


@app.procedure(args={{"account": Int(0)}}, keys=[("account", "account")])
class close:
    def run(ctx, args):
        ctx.write("account", args["account"], 0)
'''

PRICING = """from rates import RATE


def credited(amount):
    return amount * RATE
"""

MODULES = ("shop", "pricing", "rates")


def _write(folder, name: str, text: str) -> None:
    with open(os.path.join(folder, f"{name}.py"), "w") as f:
        f.write(text)


def _project(folder, fee: int = 1, rate: int = 2, shop: str = SHOP, pricing: str = PRICING) -> None:
    _write(folder, "shop", shop.format(fee=fee))
    _write(folder, "pricing", pricing)
    _write(folder, "rates", f"RATE = {rate}\n")


def _described(folder) -> dict:
    """As a freshly started process describes the project in `folder`."""
    for name in MODULES:
        sys.modules.pop(name, None)
    sys.path.insert(0, str(folder))
    try:
        return describe(load_registry(["shop:app"]))
    finally:
        sys.path.remove(str(folder))
        for name in MODULES:
            sys.modules.pop(name, None)


def _changed(before: dict, after: dict) -> list[str]:
    return changes(before, after)


def test_an_imported_helper_module_of_the_project_is_covered_without_being_named(tmp_path):
    _project(tmp_path, rate=2)
    before = _described(tmp_path)
    _project(tmp_path, rate=3)  # rates.py: imported by pricing.py, named nowhere
    after = _described(tmp_path)
    assert _changed(before, after) == ["procedure 'top_up' changed"]
    assert set_id(before) != set_id(after)


def test_a_refusal_names_exactly_the_procedures_whose_code_changed(tmp_path):
    _project(tmp_path, fee=1)
    before = _described(tmp_path)
    _project(tmp_path, fee=2)  # FEE is read by withdraw alone
    assert _changed(before, _described(tmp_path)) == ["procedure 'withdraw' changed"]
    edited = SHOP.replace('+ pricing.credited(args["amount"])', '+ 2 * pricing.credited(args["amount"])')
    _project(tmp_path, fee=1, shop=edited)
    assert _changed(before, _described(tmp_path)) == ["procedure 'top_up' changed"]
    shared = SHOP.replace('return ctx.read("account", account)', 'return ctx.read("account", account) or 0')
    _project(tmp_path, fee=1, shop=shared)  # a helper both read through
    assert _changed(before, _described(tmp_path)) == ["procedure 'top_up' changed", "procedure 'withdraw' changed"]


def test_comments_docstrings_and_formatting_change_no_identity(tmp_path):
    _project(tmp_path)
    before = _described(tmp_path)
    reworded = (
        SHOP.replace('"""A shop."""', '"""A shop, documented at length."""\n# a comment')
        .replace("    def run(ctx, args):\n", '    def run(ctx, args):\n        """What it does."""\n\n', 1)
        .replace("FEE = {fee}", "FEE = (\n    {fee}  # per withdrawal\n)")
    )
    _project(tmp_path, shop=reworded, pricing="# prices\n" + PRICING.replace("amount * RATE", "amount*RATE  # rate"))
    assert _described(tmp_path) == before


def test_a_module_shipped_compiled_only_is_covered_by_its_code(tmp_path):
    def compiled_pricing(rate_expression: str) -> dict:
        _project(tmp_path, pricing=PRICING.replace("amount * RATE", rate_expression))
        source = os.path.join(tmp_path, "pricing.py")
        py_compile.compile(source, cfile=os.path.join(tmp_path, "pricing.pyc"), doraise=True)
        os.remove(source)  # only pricing.pyc ships
        return _described(tmp_path)

    one = compiled_pricing("amount * RATE")
    again = compiled_pricing("amount * RATE")  # the same code compiled again, at another time
    other = compiled_pricing("amount * RATE + 1")
    assert one == again
    assert _changed(one, other) == ["procedure 'top_up' changed"]


def test_installed_libraries_and_ordo_itself_are_not_the_project(tmp_path):
    from ordo.procedures.reach import is_project_module

    _project(tmp_path)
    _described(tmp_path)
    assert not is_project_module("msgpack") and not is_project_module("json") and not is_project_module("ordo.client")
    assert is_project_module("ordo.procedures.workloads.micro") and is_project_module("tests.every_kind_procedures")


@pytest.mark.slow
def test_ordo_run_refuses_a_restart_after_an_edit_of_a_module_no_one_named(broker, namespace, tmp_path):
    _project(tmp_path, rate=2)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    run = [sys.executable, "-m", "ordo.cli", "run", "--bootstrap-servers", broker, "--namespace", namespace] + [
        "--data-dir",
        str(tmp_path / "data"),
        "--app",
        "shop:app",
        "--runtime",
        "local",
        "--quiet",
    ]
    import subprocess

    engine = subprocess.Popen(run, cwd=tmp_path, env=env, text=True, stderr=subprocess.PIPE)
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics(timeout=120)
            request = client.submit("top_up", {"account": 1, "amount": 5})
            assert client.wait([request], timeout=120)[request]["result"] is None
    finally:
        assert stop(engine, timeout=60) == 0
    _project(tmp_path, rate=3)
    refused = subprocess.run(run, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=180)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(lines) == 1, refused.stderr
    assert "procedure 'top_up' changed" in lines[0] and "withdraw" not in lines[0] and "close" not in lines[0]
    assert "ordo upgrade" in lines[0]


def test_a_log_named_in_the_earlier_form_keeps_it_while_the_code_is_the_same(tmp_path):
    """A log whose set an earlier release described by whole module sources: the same code
    matches it, is described in its form (so a sequencer goes on stamping its identity),
    and an engine runs its batches."""
    from ordo.log.versions import Current
    from ordo.procedures.fingerprint import describe_as, identities

    _project(tmp_path)
    for name in MODULES:
        sys.modules.pop(name, None)
    sys.path.insert(0, str(tmp_path))
    try:
        registry = load_registry(["shop:app"])
        earlier = describe(registry, form=2)
        current = Current(1, set_id(earlier), 0, earlier, 1, "L")
        assert current.matches(registry) and current.changes(registry) == []
        assert describe_as(registry, earlier) == earlier
        assert set_id(earlier) in identities(registry) and set_id(describe(registry)) in identities(registry)
        assert describe(registry)["format"] == 3 and set_id(describe(registry)) != set_id(earlier)
    finally:
        sys.path.remove(str(tmp_path))
        for name in MODULES:
            sys.modules.pop(name, None)
