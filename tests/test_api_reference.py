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


def test_the_client_guide_s_calls_work_after_a_bare_import_ordo():
    """docs/client.md writes `ordo.client.new_request(…)`: the submodule loads on first use,
    as the public names do, in a process that has made no Client."""
    done = subprocess.run(
        [sys.executable, "-c", "import ordo; print(ordo.client.new_request('deposit', {'account': 1})['proc'])"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "deposit", done.stderr
    assert not hasattr(ordo, "no_such_module") and not hasattr(ordo, "_PRIVATE")


def test_the_client_guide_says_what_a_submission_s_failed_holds():
    import typing

    from ordo.client import Submission

    assert typing.get_origin(typing.get_type_hints(Submission)["failed"]) is dict
    with open(os.path.join(ROOT, "docs", "client.md")) as f:
        guide = " ".join(f.read().split())
    assert "`failed` is a dict of those only, `{i: why}`" in guide


def test_dir_lists_no_helper_of_the_package():
    names = set(dir(ordo))
    assert "TYPE_CHECKING" not in names and "_PUBLIC" not in names
    import types

    extra = {n for n in names - set(ordo.__all__) if not n.startswith("__")}
    assert all(isinstance(getattr(ordo, n), types.ModuleType) for n in extra), extra  # loaded submodules only


def test_the_guides_links_to_files_and_sections_lead_somewhere():
    """Every relative link of README.md and docs/*.md names a file there, and a `#section` of
    a Markdown file one of its headings; the client guide sends readers of the wire format to
    where it is written."""
    import glob
    import re

    def anchors(path: str) -> set[str]:
        text = re.sub(r"^```.*?^```", "", open(path).read(), flags=re.MULTILINE | re.DOTALL)
        return {
            re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)
        }

    broken = []
    for page in [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        text = open(page).read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, section = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(full):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target}")
            elif section and full.endswith(".md") and section not in anchors(full):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target}")
    assert not broken, broken
    client = open(os.path.join(ROOT, "docs", "client.md")).read()
    wire = re.search(r"the wire format is in (.*?)\), this one", client, re.DOTALL)
    assert wire and "wire-format.schema.json" in wire.group(1) and "README.md#wire-format" in wire.group(1)
