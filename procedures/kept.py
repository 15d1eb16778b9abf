"""An app's code as the log keeps it: every file of the project its procedure set loads
(procedures/reload.py's `app_modules`: the spec's modules and every project module they
import, directly or not), packed into the start and upgrade records that name the set, so a
replay from the log's beginning needs nothing the user kept (docs/operations.md, 'Upgrading
procedures').

The code travels signed like every log record: whoever holds the log secret can already
decide every batch, and so the state; the code adds nothing they could not do. `ordo recover
--no-kept-code` runs only code it was given. ORDO_KEEP_CODE=0 keeps the code out of the log.
"""

from __future__ import annotations

import ast
import hashlib
import os
import zlib

import msgpack

from ordo.procedures.reach import module_file
from ordo.procedures.registry import Registry

FORMAT = 1
LIMIT = 512 * 1024  # packed; an app's code larger than this is not kept (a record holds ~1 MB)
KEEP_ENV = "ORDO_KEEP_CODE"


def keeping() -> bool:
    return os.environ.get(KEEP_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _relative_path(name: str, path: str) -> str:
    """Where a module's file goes under a folder on sys.path so that `import name` finds it."""
    base = name.replace(".", "/")
    file_name = os.path.basename(path)
    if file_name.startswith("__init__."):
        return f"{base}/{file_name}"
    if path.endswith(".pyc"):
        return base + ".pyc"  # a module without source loads from beside where its source would be
    return base + file_name[len(file_name.split(".")[0]) :]


def pack(registry: Registry, specs: tuple[str, ...]) -> bytes | None:
    """The app's code, packed for a log record; None where there is none to keep (the
    built-in workloads come with Ordo), keeping is off, or it is larger than LIMIT."""
    from ordo.procedures.reload import app_modules

    if not specs or not keeping():
        return None
    files = {}
    for name in sorted(app_modules(tuple(specs), registry)):
        path = module_file(name)
        if path is None or not os.path.isfile(path):
            continue
        with open(path, "rb") as handle:
            files[_relative_path(name, path)] = handle.read()
    if not files:
        return None
    packed = zlib.compress(msgpack.packb([FORMAT, list(specs), files]), 9)
    return packed if len(packed) <= LIMIT else None


def unpack(packed: bytes) -> tuple[tuple[str, ...], dict[str, bytes]]:
    """(the specs, {relative path: bytes}) of packed code; ValueError if it is not that."""
    try:
        form, specs, files = msgpack.unpackb(zlib.decompress(packed), raw=False, strict_map_key=False)
    except Exception as exc:
        raise ValueError(f"unreadable kept code: {exc}") from None
    if form != FORMAT or not isinstance(files, dict):
        raise ValueError(f"kept code of format {form!r}, which this release does not read")
    for path in files:
        parts = str(path).split("/")
        if not parts or any(part in ("", ".", "..") or os.sep in part for part in parts):
            raise ValueError(f"kept code names a file outside its folder: {path!r}")
    return tuple(specs), files


def materialize(packed: bytes, root: str) -> tuple[str, ...]:
    """Write packed code under `root` (a folder of its own per code) and return its specs,
    each pointing there (`module:app@folder`, procedures/loading.py)."""
    from ordo.procedures.loading import KEPT_AT

    specs, files = unpack(packed)
    folder = os.path.join(root, hashlib.blake2b(packed, digest_size=8).hexdigest())
    for path, data in files.items():
        target = os.path.join(folder, *path.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as handle:
            handle.write(data)
    return tuple(f"{spec}{KEPT_AT}{folder}" for spec in specs)


def _same_code(kept: bytes, path: str) -> bool:
    """Whether a kept file and one on disk are the same code: source by its syntax tree
    without docstrings (comments and formatting change nothing, as for the identity),
    compiled code by its bytes."""
    from ordo.procedures.reach import PYC_HEADER, _strip_docstrings, normal_form

    with open(path, "rb") as handle:
        now = handle.read()
    if path.endswith(".py"):
        try:
            return normal_form(_strip_docstrings(ast.parse(kept))) == normal_form(_strip_docstrings(ast.parse(now)))
        except (SyntaxError, ValueError):
            return kept == now
    if path.endswith(".pyc"):
        return kept[PYC_HEADER:] == now[PYC_HEADER:]
    return kept == now


def changed_files(packed: bytes, registry: Registry, specs: tuple[str, ...]) -> list[str]:
    """Which of the project's files the app of `specs` loads now differ from the kept code:
    'kit/pricing.py changed', 'rates.py added', 'old.py removed'."""
    from ordo.procedures.reload import app_modules

    _, files = unpack(packed)
    now = {}
    for name in app_modules(tuple(specs), registry):
        path = module_file(name)
        if path is not None and os.path.isfile(path):
            now[_relative_path(name, path)] = path
    found = []
    for relative in sorted(set(files) | set(now)):
        if relative not in now:
            found.append(f"{relative} removed")
        elif relative not in files:
            found.append(f"{relative} added")
        elif not _same_code(files[relative], now[relative]):
            found.append(f"{relative} changed")
    return found


_loaded: dict[int, Registry] = {}  # identity -> the set loaded from the code the log keeps
_folder: list[str] = []


def registry_from(packed: bytes, identity: int, specs: tuple[str, ...] | None = None) -> Registry | None:
    """The set `identity` as `packed` code defines it, loaded once a process (into a folder
    of the process's own, removed when it exits); None if that code is not that set here,
    or, given `specs`, not the code of that same app (an upgrade of this app that its files
    on disk have moved past already, not one to another app)."""
    import atexit
    import shutil
    import tempfile

    from ordo.procedures.fingerprint import identities
    from ordo.procedures.loading import load_registry

    if specs is not None:
        try:
            if unpack(packed)[0] != tuple(specs):
                return None
        except ValueError:
            return None
    if identity in _loaded:
        return _loaded[identity]
    if not _folder:
        _folder.append(tempfile.mkdtemp(prefix="ordo-kept-code-"))
        atexit.register(shutil.rmtree, _folder[0], True)
    try:
        registry = load_registry(materialize(packed, _folder[0]))
    except ValueError:
        return None
    if identity not in identities(registry):
        return None
    _loaded[identity] = registry
    return registry
