"""An app's code read again in a running process: how an engine and a sequencer follow an
upgrade in place (docs/operations.md, 'Upgrading procedures').

A process that meets a procedure set other than its own (a batch stamped with it, or an
upgrade record) asks `registry_for` for it: a set it ran before is at hand; otherwise it reads
its app from disk again, as a restart would, and runs that code when its identity is the one
the log names. The project's modules are imported afresh, their bytecode compiled again from
source (a `.pyc` beside an edited source of the same size and second could otherwise stand
for it), and a set read once is kept by identity, so v1 → v2 → v1 reads v1 only once.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Callable

from ordo.procedures.fingerprint import identities
from ordo.procedures.loading import fresh_bytecode, load_registry
from ordo.procedures.reach import Reach, is_project_module
from ordo.procedures.registry import Registry

_lock = threading.Lock()
_known: dict[tuple[str, ...], dict[int, Registry]] = {}  # specs -> identity -> the set read


def app_modules(specs: tuple[str, ...], registry: Registry | None = None) -> set[str]:
    """The project's modules an app loads: each spec's module, the modules its procedures'
    functions live in and those named in `code=`, and every module of the project they
    import, directly or not, with their packages. Ordo's own modules never."""
    reach = Reach()
    names = [spec.partition(":")[0] for spec in specs]
    if registry is not None:
        for roots in registry.roots.values():
            names.extend(getattr(getattr(item, "__func__", item), "__module__", None) or "" for item in roots)
        names.extend(name for named in registry.named_code.values() for name in named)
    for name in names:
        if name and not name.startswith("ordo.") and name != "ordo":
            reach.add_module(name, named=True)
    found = {name for name in reach.whole if not name.startswith("ordo.")}
    for name in list(found):
        parts = name.split(".")
        found.update(
            parent for parent in (".".join(parts[:i]) for i in range(1, len(parts))) if is_project_module(parent)
        )
    return found


def reread(specs: tuple[str, ...], registry: Registry | None = None) -> Registry:
    """The app of `specs` as its files on disk define it now. What the process had loaded of
    it stays in use by whoever holds it (functions keep their modules); on an error the
    modules are put back as they were."""
    names = app_modules(specs, registry)
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    importlib.invalidate_caches()
    try:
        with fresh_bytecode():
            return load_registry(specs)
    except BaseException:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)
        raise


def registry_for(
    identity: int, specs: tuple[str, ...], current: Registry, kept: Callable[[], bytes | None] | None = None
) -> tuple[Registry | None, str]:
    """The set whose identity is `identity` for the app of `specs`: one this process ran
    before, its files on disk read again, or, with `kept` (the code the log keeps of that
    set, procedures/kept.py), that code where it is this same app's: its files may hold the
    next version already, not yet upgraded to. (None, why) when none is it."""
    specs = tuple(specs)
    with _lock:
        known = _known.setdefault(specs, {})
        for form in identities(current):
            known.setdefault(form, current)
        if identity in known:
            return known[identity], "in use before"
        if not specs:
            return None, "this engine was given its procedures, not an app to read again"
        if all(spec.startswith("ordo.") for spec in specs):
            return None, "the built-in workloads change only with Ordo"
        try:
            fresh = reread(specs, current)
        except Exception as exc:
            return None, f"reading {', '.join(specs)} again failed: {exc}"
        for form in identities(fresh):
            known.setdefault(form, fresh)
        if identity in known:
            return known[identity], "read again from disk"
        from_log = _kept_registry(identity, specs, kept) if kept is not None else None
        if from_log is not None:
            known[identity] = from_log
            return from_log, "as the log keeps it"
        return None, f"the code of {', '.join(specs)} on disk is another set"


def _kept_registry(identity: int, specs: tuple[str, ...], kept: Callable[[], bytes | None]) -> Registry | None:
    from ordo.procedures.kept import registry_from

    try:
        packed = kept()
    except Exception:
        return None
    return registry_from(packed, identity, specs) if packed else None
