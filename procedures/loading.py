"""Which procedures an engine and a sequencer run: a procedure set is named by specs, each
travelling as a string to every process that needs it (the sequencer child, Ray workers).

A spec is
- `module`: a module with `PROCEDURES` (and `TABLES`), as the built-in workload modules;
- `module:attribute`: an object with `PROCEDURES` and `TABLES`, such as an `ordo.App`.

No spec at all means every built-in workload (the demo's and the benchmarks' set). Once a
spec names user code, the built-in workloads come only where a spec names them too
(`workload_spec`): a user's table `account` must not meet the `sl` workload's.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from typing import Any, Iterable

from ordo.procedures.contract import Procedure, Table
from ordo.procedures.registry import Registry, default_registry, did_you_mean

WORKLOADS_PACKAGE = "ordo.procedures.workloads"


def workload_spec(name: str) -> str:
    """The spec of a built-in workload, checked against the known ones."""
    from ordo.procedures.workloads import ALL_WORKLOADS

    if name not in ALL_WORKLOADS:
        raise ValueError(f"unknown workload '{name}' (choose from {', '.join(ALL_WORKLOADS)})")
    return f"{WORKLOADS_PACKAGE}.{name}"


def workload_specs(text: str) -> list[str]:
    """`sl,micro` or `all`: the specs of those built-in workloads."""
    from ordo.procedures.workloads import ALL_WORKLOADS

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("--workloads needs names, e.g. sl,micro (or all)")
    if names == ["all"]:
        names = list(ALL_WORKLOADS)
    return [workload_spec(n) for n in names]


def load_registry(specs: Iterable[str] = ()) -> Registry:
    specs = tuple(specs)
    if not specs:
        return default_registry()
    kept = {spec.rpartition(KEPT_AT)[2] for spec in specs if KEPT_AT in spec}
    if kept:
        if any(KEPT_AT not in spec for spec in specs) or len(kept) > 1:
            raise ValueError(f"a procedure set comes from one folder of kept code or none: {', '.join(specs)}")
        return load_isolated(kept.pop(), tuple(spec.rpartition(KEPT_AT)[0] for spec in specs))
    registry = Registry()
    for spec in dict.fromkeys(specs):
        loaded = load_spec(spec)
        try:
            registry.add_workload(*loaded)
        except ValueError as exc:
            raise ValueError(f"{spec}: {exc}") from None
    return registry


# `module:app@folder`: the app as the code in `folder` defines it, imported apart from the
# process's own modules of the same names (code a log keeps, procedures/kept.py).
KEPT_AT = "@"


@contextmanager
def fresh_bytecode():
    """Imports compile source anew: no `.pyc` written before is trusted for it."""
    before, folder = sys.pycache_prefix, tempfile.mkdtemp(prefix="ordo-bytecode-")
    sys.pycache_prefix = folder
    try:
        yield
    finally:
        sys.pycache_prefix = before
        shutil.rmtree(folder, ignore_errors=True)


def modules_in(folder: str) -> set[str]:
    """The modules (and packages) the files under `folder` define."""
    found = set()
    for root, _, files in os.walk(folder):
        package = os.path.relpath(root, folder).replace(os.sep, ".")
        for name in files:
            stem = name.split(".")[0]
            if not stem.isidentifier() or not name.endswith((".py", ".pyc", ".so", ".pyd")):
                continue
            module = package if stem == "__init__" else stem if package == "." else f"{package}.{stem}"
            if module != ".":
                found.add(module)
    return found


def load_isolated(folder: str, specs: tuple[str, ...]) -> Registry:
    """The procedure set of `specs` as the code in `folder` defines it, imported apart: the
    process's own modules of those names are put back afterwards, and the registry's
    description is worked out while the folder's modules are in place (procedures/
    fingerprint.py: once per registry), so it is the folder's code that it names."""
    from ordo.procedures.fingerprint import describe, identities

    names = modules_in(folder)
    covered = lambda name: name in names or any(name.startswith(f"{n}.") for n in names)  # noqa: E731
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if covered(name)}
    sys.path.insert(0, folder)
    importlib.invalidate_caches()
    try:
        with fresh_bytecode():
            registry = load_registry(specs)
            identities(registry)
            describe(registry, code=False)
        return registry
    finally:
        for name in [name for name in sys.modules if covered(name)]:
            del sys.modules[name]
        sys.path.remove(folder)
        sys.modules.update(saved)


def load_spec(spec: str) -> tuple[list[Table], list[Procedure], list, list, list]:
    """The tables, procedures, streaming declarations (STREAMS, procedures/streams.py),
    further code (CODE: modules whose source is part of the procedures' code, see
    procedures/fingerprint.py) and source topics (SOURCES, sequencer/sources.py) a spec
    names; a clear ValueError for anything else."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a procedure set is named by 'module' or 'module:app', got {spec!r}")
    module_name, _, attribute = spec.partition(":")
    module = import_user_module(module_name)
    if attribute:
        if not hasattr(module, attribute):
            raise ValueError(
                f"module '{module_name}' has no attribute '{attribute}'"
                f"{did_you_mean(attribute, [n for n in vars(module) if not n.startswith('_')])}"
            )
        holder: Any = getattr(module, attribute)
        what = f"'{spec}'"
    else:
        holder = module
        what = f"module '{module_name}'"
    if not hasattr(holder, "PROCEDURES"):
        hint = ""
        if not attribute:
            apps = [n for n, v in vars(module).items() if hasattr(type(v), "procedure") and hasattr(v, "PROCEDURES")]
            hint = (
                f" (it defines an app: use --app {module_name}:{apps[0]})"
                if apps
                else did_you_mean("PROCEDURES", [n for n in vars(module) if n.isupper()])
            )
        raise ValueError(f"{what} defines no PROCEDURES{hint}")
    procedures = list(holder.PROCEDURES)
    tables = list(getattr(holder, "TABLES", ()))
    if not procedures:
        raise ValueError(f"{what} registers no procedures")
    for item in procedures:
        if not isinstance(item, Procedure):
            raise ValueError(f"{what}: PROCEDURES holds {item!r}, not a Procedure")
    for item in tables:
        if not isinstance(item, Table):
            raise ValueError(f"{what}: TABLES holds {item!r}, not a Table")
    code = list(getattr(holder, "CODE", ()))
    for item in code:
        if not (isinstance(item, str) or hasattr(item, "__name__") and type(item).__name__ == "module"):
            raise ValueError(f"{what}: CODE holds {item!r}, not a module or a module's name")
    from ordo.procedures.sources import Source

    sources = list(getattr(holder, "SOURCES", ()))
    for item in sources:
        if not isinstance(item, Source):
            raise ValueError(f"{what}: SOURCES holds {item!r}, not an ordo.Source")
    return tables, procedures, list(getattr(holder, "STREAMS", ())), code, sources


def import_user_module(name: str):
    """Import a module by its import path, the current directory first on the path (as
    `python -m` does), so `--app bank:app` finds ./bank.py."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise ValueError(
                f"cannot import '{name}': no module named '{exc.name}' (the path is relative "
                f"to the current directory, {here})"
            ) from None
        raise ValueError(f"cannot import '{name}': {exc}") from None
    except Exception as exc:
        raise ValueError(f"cannot import '{name}': {type(exc).__name__}: {exc}") from None


def procedure_options(g, all_by_default: bool = True) -> None:
    """--app, --procedures, --workloads: the procedure set (procedure_specs). `all_by_default`:
    naming none of them means every built-in workload (`ordo spark produce` has no set then)."""
    g.add_argument(
        "--app",
        action="append",
        default=[],
        metavar="MODULE:APP",
        help="an ordo.App to run, by import path relative to the current directory, e.g. bank:app (repeatable)",
    )
    g.add_argument(
        "--procedures",
        action="append",
        default=[],
        metavar="MODULE",
        help="import path of a module with TABLES and PROCEDURES to register (repeatable)",
    )
    g.add_argument(
        "--workloads",
        metavar="LIST",
        help="built-in workloads to register beside --app/--procedures, e.g. sl,micro or all"
        + (" (without --app and --procedures: all of them)" if all_by_default else ""),
    )


def procedure_specs(args) -> tuple[str, ...]:
    """The procedure set named on the command line, checked here so that a mistake is one
    line before anything starts; the current directory goes on PYTHONPATH for the
    sequencer child and Ray workers, which import the same specs."""
    import os

    for app in args.app:
        if ":" not in app:
            raise ValueError(
                f"--app takes MODULE:APP, e.g. bank:app (got {app!r}; a module with PROCEDURES goes to --procedures)"
            )
    specs = [*args.procedures, *args.app]
    if args.workloads:
        specs += workload_specs(args.workloads)
    if args.app or args.procedures:
        here = os.getcwd()
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if here not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, paths)])
    from ordo.procedures.fingerprint import describe

    registry = load_registry(specs)
    describe(registry)  # the set every process must describe alike
    return tuple(specs)
