"""The public API is discoverable: `dir(ordo)` lists it, the package says it is typed, and
docs/api.md is generated from its docstrings by tools/api_reference.py, every public name
documented and the file up to date."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import ordo
from tests.helpers import ROOT


def test_dir_lists_every_public_name_and_each_resolves():
    names = dir(ordo)
    for name in ordo.__all__:
        assert name in names
        assert getattr(ordo, name) is not None
    assert {"App", "Client", "AsyncClient", "TestEngine", "Int", "Str", "List", "OrdoError", "OutcomeTimeout"} <= set(
        names
    )


def test_the_package_is_typed():
    assert os.path.isfile(os.path.join(os.path.dirname(ordo.__file__), "py.typed"))
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert 'ordo = ["py.typed"]' in f.read()  # shipped in the wheel too


def test_the_api_reference_is_complete_and_up_to_date():
    done = subprocess.run(
        [sys.executable, os.path.join("tools", "api_reference.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_the_client_guide_gives_new_requests_real_signature():
    from ordo.client import new_request

    parameters = ", ".join(
        str(p).split(":")[0] + ("=None" if p.default is None else "")
        for p in inspect.signature(new_request).parameters.values()
    )
    with open(os.path.join(ROOT, "docs", "client.md")) as f:
        assert f"new_request({parameters})" in f.read()
