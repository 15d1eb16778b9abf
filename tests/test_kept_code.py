"""The code a log keeps of each procedure set (procedures/kept.py): packed from the files the
app loads, loaded back apart from the process's own modules of the same names, and the
same set by identity (docs/operations.md, 'Upgrading procedures')."""

from __future__ import annotations

import py_compile
import sys

import pytest

from ordo.procedures.fingerprint import identities
from ordo.procedures.kept import materialize, pack, unpack
from ordo.procedures.loading import load_registry

SHOP = """import ordo
from ordo import Int
from kit.pricing import credited

app = ordo.App("shop")
app.table("wallet", default=0)


@app.procedure(args={"user": Int(0), "amount": Int(1)}, keys=[("wallet", "user")])
class top_up:
    def run(ctx, args):
        balance = ctx.read("wallet", args["user"]) + credited(args["amount"])
        ctx.write("wallet", args["user"], balance)
        return balance
"""

MODULES = ("shop", "kit", "kit.pricing", "rates")


def _project(folder, factor: int) -> None:
    (folder / "kit").mkdir(exist_ok=True)
    (folder / "kit" / "__init__.py").write_text("")
    (folder / "kit" / "pricing.py").write_text(
        "import rates\n\n\ndef credited(amount):\n    return amount * rates.RATE\n"
    )
    (folder / "shop.py").write_text(SHOP)
    source = folder / "rates_src.py"
    source.write_text(f"RATE = {factor}\n")
    py_compile.compile(str(source), cfile=str(folder / "rates.pyc"))  # shipped compiled only
    source.unlink()


def _fresh(folder):
    for name in MODULES:
        sys.modules.pop(name, None)
    sys.path.insert(0, str(folder))


def _forget(folder):
    sys.path.remove(str(folder))
    for name in MODULES:
        sys.modules.pop(name, None)


def test_kept_code_loads_back_as_the_same_set_beside_the_process_s_own_modules(tmp_path):
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    _project(v1, 1)
    _project(v2, 2)
    _fresh(v1)
    try:
        first = load_registry(["shop:app"])
        packed = pack(first, ("shop:app",))
        assert packed is not None
        specs, files = unpack(packed)
        assert specs == ("shop:app",)
        assert set(files) == {"shop.py", "kit/__init__.py", "kit/pricing.py", "rates.pyc"}
        kept_identities = identities(first)
    finally:
        _forget(v1)
    _fresh(v2)  # the process now runs v2; v1's code comes from the log only
    try:
        second = load_registry(["shop:app"])
        own = sys.modules["shop"]
        kept = load_registry(materialize(packed, str(tmp_path / "kept")))
        assert identities(kept) == kept_identities != identities(second)
        assert sys.modules["shop"] is own  # the process's own modules stay as they were
        run = kept.procedures["top_up"].run
        assert run.__globals__["credited"](5) == 5  # v1's rate, from v1's compiled module
        assert second.procedures["top_up"].run.__globals__["credited"](5) == 10
    finally:
        _forget(v2)


def test_kept_code_naming_a_file_outside_its_folder_is_refused(tmp_path):
    import zlib

    import msgpack

    packed = zlib.compress(msgpack.packb([1, ["x:app"], {"../escape.py": b"A = 1\n"}]))
    with pytest.raises(ValueError, match="outside its folder"):
        materialize(packed, str(tmp_path))
    assert not (tmp_path.parent / "escape.py").exists()


def test_no_code_is_kept_when_keeping_is_off_or_the_set_is_ordo_s_own(tmp_path, monkeypatch):
    _project(tmp_path, 1)
    _fresh(tmp_path)
    try:
        registry = load_registry(["shop:app"])
        monkeypatch.setenv("ORDO_KEEP_CODE", "0")
        assert pack(registry, ("shop:app",)) is None
        monkeypatch.delenv("ORDO_KEEP_CODE")
        assert pack(registry, ("shop:app",)) is not None
    finally:
        _forget(tmp_path)
    workloads = ("ordo.procedures.workloads.sl",)
    assert pack(load_registry(workloads), workloads) is None  # comes with Ordo
