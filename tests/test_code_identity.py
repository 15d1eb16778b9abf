"""A procedure's identity is the code it reaches (procedures/reach.py): its own functions,
the statements of their module they name, and every module of the project they import,
directly or not, without the user naming any; comments, docstrings and formatting change
nothing; compiled code counts by its bytes; and a refusal names exactly the procedures whose
code changed."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
import tarfile
import io
import json

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


def test_an_imported_helper_module_of_the_project_is_covered_without_being_named(tmp_path):
    _project(tmp_path, rate=2)
    before = _described(tmp_path)
    _project(tmp_path, rate=3)  # rates.py: imported by pricing.py, named nowhere
    after = _described(tmp_path)
    assert changes(before, after) == ["procedure 'top_up' changed"]
    assert set_id(before) != set_id(after)


def test_a_refusal_names_exactly_the_procedures_whose_codechanges(tmp_path):
    _project(tmp_path, fee=1)
    before = _described(tmp_path)
    _project(tmp_path, fee=2)  # FEE is read by withdraw alone
    assert changes(before, _described(tmp_path)) == ["procedure 'withdraw' changed"]
    edited = SHOP.replace('+ pricing.credited(args["amount"])', '+ 2 * pricing.credited(args["amount"])')
    _project(tmp_path, fee=1, shop=edited)
    assert changes(before, _described(tmp_path)) == ["procedure 'top_up' changed"]
    shared = SHOP.replace('return ctx.read("account", account)', 'return ctx.read("account", account) or 0')
    _project(tmp_path, fee=1, shop=shared)  # a helper both read through
    assert changes(before, _described(tmp_path)) == ["procedure 'top_up' changed", "procedure 'withdraw' changed"]


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
    assert changes(one, other) == ["procedure 'top_up' changed"]


def test_installed_libraries_and_ordo_itself_are_not_the_project(tmp_path):
    from ordo.procedures.reach import is_project_module

    _project(tmp_path)
    _described(tmp_path)
    assert not is_project_module("msgpack") and not is_project_module("json") and not is_project_module("ordo.client")
    assert is_project_module("ordo.procedures.workloads.micro") and is_project_module("tests.every_kind_procedures")


@pytest.mark.slow
def test_ordo_run_refuses_a_restart_after_an_edit_of_a_module_no_one_named_and_names_it(broker, namespace, tmp_path):
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
    # and which file of the project: against the code the log keeps of the set it runs
    assert "; rates.py changed)" in lines[0] and "shop.py" not in lines[0] and "pricing.py" not in lines[0], lines[0]
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
        assert describe(registry)["format"] == 4 and set_id(describe(registry)) != set_id(earlier)
        # A set logged before environments were recorded is matched by the same code in its form.
        without_environment = describe(registry, form=3)
        assert "environment" not in without_environment and "environment" in describe(registry)
        assert Current(1, set_id(without_environment), 0, without_environment, 1, "L").matches(registry)
        assert set_id(without_environment) in identities(registry)
    finally:
        sys.path.remove(str(tmp_path))
        for name in MODULES:
            sys.modules.pop(name, None)


PREVIOUS_MAIN = "5c678df"  # the main before identities followed the code each procedure reaches
MAIN_BEFORE_ENVIRONMENTS = "b1f2f82"  # the main before sets recorded their environment (form 3)


def _previous_mains_description(tmp_path, commit: str = PREVIOUS_MAIN) -> dict:
    """The shop described by an earlier main's own code, taken from the repository's
    history and laid out as its install maps it (`ordo.<folder>` from each folder)."""
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"the repository's history lacks {commit}: {archive.stderr[:200]!r}")
    tree = tmp_path / "previous"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as files:
        files.extractall(tree, filter="data")
    installed = tmp_path / "installed"
    installed.mkdir()
    (tree / "ordo").rename(installed / "ordo")
    for folder in ("broker", "log", "sequencer", "scheduler", "storage", "recovery", "procedures", "spark_jobs"):
        (tree / folder).rename(installed / "ordo" / folder)
    code = (
        "import json; from ordo.procedures.fingerprint import describe; "
        "from ordo.procedures.loading import load_registry; print(json.dumps(describe(load_registry(['shop:app']))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(tmp_path / "app")])},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_set_the_previous_main_described_is_matched_by_the_same_code_and_refused_when_edited(tmp_path):
    from ordo.log.versions import Current
    from ordo.procedures.fingerprint import describe_as

    app = tmp_path / "app"
    app.mkdir()
    _project(app)
    logged = _previous_mains_description(tmp_path)
    assert logged["format"] == 2
    for name in MODULES:
        sys.modules.pop(name, None)
    sys.path.insert(0, str(app))
    try:
        registry = load_registry(["shop:app"])
        assert describe_as(registry, logged) == logged  # the previous main's digests, byte for byte
        current = Current(1, set_id(logged), 0, logged, 1, "L")
        assert current.matches(registry)
        _project(app, rate=3)
        for name in MODULES:
            sys.modules.pop(name, None)
        edited = load_registry(["shop:app"])
        # the earlier form covers only the modules named or declared in: an edit of rates.py
        # is not seen until an upgrade moves the log to the newest form
        assert current.matches(edited)
        _project(app, fee=2)
        for name in MODULES:
            sys.modules.pop(name, None)
        assert not current.matches(load_registry(["shop:app"]))
    finally:
        sys.path.remove(str(app))
        for name in MODULES:
            sys.modules.pop(name, None)


@pytest.mark.slow
def test_a_refusal_says_why_dataflow_procedures_no_one_edited_are_listed(broker, namespace, tmp_path):
    """examples/inventory.py with only `deliver` edited: `tally` (which deliver's stream
    triggers) and `ship` (which emits) are identified by the code of every dataflow
    procedure of the app, so they differ too; the refusal lists them as one, and says why."""
    source = open(os.path.join(ROOT, "examples", "inventory.py")).read()
    (tmp_path / "inventory.py").write_text(source)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    run = [sys.executable, "-m", "ordo.cli", "run", "--bootstrap-servers", broker, "--namespace", namespace] + [
        "--data-dir",
        str(tmp_path / "data"),
        "--app",
        "inventory:app",
        "--runtime",
        "local",
        "--quiet",
    ]
    engine = subprocess.Popen(run, cwd=tmp_path, env=env, text=True, stderr=subprocess.PIPE)
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics(timeout=120)
            request = client.submit("name_sku", {"sku": "bolt", "item": 7})
            assert client.wait([request], timeout=120)[request]["status"] == "committed"
    finally:
        assert stop(engine, timeout=60) == 0
    edited = source.replace(
        'ctx.emit("received", [line["warehouse"], line["qty"]])',
        'ctx.emit("received", [line["warehouse"], 1 * line["qty"]])',
    )
    assert edited != source
    (tmp_path / "inventory.py").write_text(edited)
    refused = subprocess.run(run, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=180)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(lines) == 1, refused.stderr
    assert (
        "(procedures 'deliver', 'ship' and 'tally' changed (procedures of the app's dataflows, identified by the "
        "code of all of them together: an edit to any one changes each)"
    ) in lines[0], lines[0]
    assert "name_sku" not in lines[0] and "restock_sku" not in lines[0]


def test_procedures_identified_by_their_code_together_are_one_change(tmp_path):
    from ordo.procedures.fingerprint import code_groups

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import inventory
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    registry = inventory.app.registry()
    assert code_groups(registry) == [{"deliver", "ship", "tally"}]
    before = {"procedures": {"deliver": "1", "ship": "2", "tally": "3", "name_sku": "4"}}
    after = {"procedures": {"deliver": "1'", "ship": "2'", "tally": "3", "name_sku": "4'"}}
    assert changes(before, after, code_groups(registry)) == [
        "procedures 'deliver' and 'ship' changed (procedures of the app's dataflows, identified by the code of "
        "all of them together: an edit to any one changes each)",
        "procedure 'name_sku' changed",
    ]
    only_its_arguments = {"procedures": {**before["procedures"], "tally": "3'"}}
    assert changes(before, only_its_arguments, code_groups(registry)) == ["procedure 'tally' changed"]


def test_a_set_the_main_before_environments_described_is_read_in_its_form_and_runs(tmp_path):
    """A log started by the main before form 4 names its set in form 3: the same code is
    described in that form byte for byte, so its sequencer goes on and its engines run it."""
    from ordo.log.versions import Current
    from ordo.procedures.fingerprint import describe_as, identities

    app = tmp_path / "app"
    app.mkdir()
    _project(app)
    logged = _previous_mains_description(tmp_path, MAIN_BEFORE_ENVIRONMENTS)
    assert logged["format"] == 3 and "environment" not in logged
    for name in MODULES:
        sys.modules.pop(name, None)
    sys.path.insert(0, str(app))
    try:
        registry = load_registry(["shop:app"])
        assert describe_as(registry, logged) == logged
        assert Current(1, set_id(logged), 0, logged, 1, "L").matches(registry)
        assert set_id(logged) in identities(registry)  # its batches run here
    finally:
        sys.path.remove(str(app))
        for name in MODULES:
            sys.modules.pop(name, None)
