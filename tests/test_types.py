"""The public modules type-check with mypy (py.typed ships them to users' type checkers).

mypy finds modules by path, and the repository's component folders are mapped into the
`ordo` package by setuptools (pyproject.toml's package-dir), so the check runs on a tree of
links laid out as the installed package is."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib

import pytest

from tests.helpers import ROOT

PUBLIC_MODULES = [
    "ordo",
    "ordo.app",
    "ordo.client",
    "ordo.reading",
    "ordo.testing",
    "ordo.errors",
    "ordo.procedures.args",
    "ordo.sequencer.sources",
]


def package_tree(into: str) -> str:
    """`into`/ordo laid out as installed: ordo/'s files, and each mapped folder under its name."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        mapped = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    package = os.path.join(into, "ordo")
    os.makedirs(package)
    for name in os.listdir(os.path.join(ROOT, "ordo")):
        os.symlink(os.path.join(ROOT, "ordo", name), os.path.join(package, name))
    for dotted, folder in mapped.items():
        os.symlink(os.path.join(ROOT, folder), os.path.join(package, dotted.split(".", 1)[1]))
    return into


def test_the_public_modules_type_check(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install -e '.[test]'")
    tree = package_tree(str(tmp_path))
    modules = [arg for name in PUBLIC_MODULES for arg in ("-m", name)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            os.path.join(ROOT, "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            *modules,
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr


USER_MODULE = """
import ordo
from ordo import Int
from ordo.procedures.streams import StreamContext
from ordo.scheduler.execution import TxnContext

app = ordo.App("typed")
app.table("account", default=0)


@app.procedure(args={"account": Int(0), "amount": Int(1)}, keys=[("account", "account")])
def deposit(ctx: ordo.Context, args: dict) -> int:
    balance: int = ctx.read("account", args["account"]) + args["amount"]
    if balance > 10**9:
        ctx.abort("too much")
    ctx.write("account", args["account"], balance + ctx.random.randint(0, 0) + ctx.now * 0)
    ctx.emit("deposits", [args["account"]])
    slid: bool = ctx.window_insert("recent", [balance])
    rows: list = ctx.window("recent")
    return balance + len(rows) + slid


def the_contexts_ordo_makes(plain: TxnContext, dataflow: StreamContext) -> list[ordo.Context]:
    return [plain, dataflow]
"""


def test_procedures_annotated_with_ordo_context_type_check(tmp_path):
    """A user's RUN annotated `ctx: ordo.Context` type-checks, plain or in a dataflow, and
    both contexts the engine passes (scheduler/execution.py, procedures/streams.py) are one."""
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install -e '.[test]'")
    tree = package_tree(str(tmp_path / "tree"))

    def mypy(source: str) -> subprocess.CompletedProcess:
        with open(os.path.join(tree, "user_app.py"), "w") as f:
            f.write(source)
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml")]
            + ["--cache-dir", str(tmp_path / ".mypy_cache"), "user_app.py"],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=600,
        )

    done = mypy(USER_MODULE)
    assert done.returncode == 0, done.stdout + done.stderr
    wrong = mypy(USER_MODULE + "\n\ndef typo(ctx: ordo.Context) -> None:\n    ctx.wrte('account', 1, 2)\n")
    assert wrong.returncode == 1 and '"Context" has no attribute "wrte"' in wrong.stdout, wrong.stdout
