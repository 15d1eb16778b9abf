"""The code a procedure runs, found from its functions: the top-level statements of their
modules that they name, directly or through one another, and every module of the user's
project those statements import, directly or not. A digest of it is the procedure's code
identity (procedures/fingerprint.py).

Source is compared as its syntax tree without docstrings, so comments, docstrings and
formatting change nothing; a field a later Python adds empty to the tree is left out, so
the digest is the same in every process and across Python releases that only add fields.
A module without source (a `.pyc` alone, an extension) is digested by its bytes.

A module is the project's when it is not Python's own, not installed (site-packages) and
not Ordo's (Ordo's built-in workloads excepted): an edit of any file of the user's own
project changes the code identity, and an upgrade of Ordo never does. The installed modules
the reached code imports are listed apart (`Reach.installed`): a set's environment names
them with their distributions' versions (procedures/environment.py)."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import sys
import sysconfig
from typing import Any, Iterable

_INSTALLED = ("site-packages", "dist-packages")
_STDLIB = tuple(
    os.path.realpath(p) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]} if p
)
PYC_HEADER = 16  # magic, flags and the source's mtime and size (or hash): not the code


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


@functools.lru_cache(maxsize=None)
def is_project_module(name: str) -> bool:
    if name.startswith("ordo.procedures.workloads."):
        return True
    if name in ("ordo", "builtins", "__main__") or name.startswith("ordo."):
        return False
    if name.split(".")[0] in sys.stdlib_module_names:
        return False
    path = module_file(name)
    if path is None:
        return False
    real = os.path.realpath(path)
    return not any(part in real.split(os.sep) for part in _INSTALLED) and not real.startswith(_STDLIB)


@functools.lru_cache(maxsize=None)
def is_installed_module(name: str) -> bool:
    """A library's module: located, and neither the project's, nor Python's, nor Ordo's."""
    if name in ("ordo", "builtins", "__main__") or name.startswith("ordo."):
        return False
    if name.split(".")[0] in sys.stdlib_module_names or is_project_module(name):
        return False
    path = module_file(name)
    return path is not None and not os.path.realpath(path).startswith(_STDLIB)


def module_file(name: str) -> str | None:
    """Where a module's code is, without running anything not already run."""
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None) if module is not None else None
    if path is None and module is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        path = spec.origin if spec is not None and spec.has_location else None
    return path


# --- normalised syntax ----------------------------------------------------------------------


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    return tree


def normal_form(node: Any) -> str:
    """A node as text: its kind and its non-empty fields, no positions."""
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if value is None or value == []:
                continue
            fields.append(f"{name}={normal_form(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(map(normal_form, node)) + "]"
    return repr(node)


class _Module:
    """One project module's top-level statements, what each binds and names."""

    def __init__(self, name: str, tree: ast.Module):
        self.name = name
        self.statements = tree.body
        self.binders: dict[str, list[int]] = {}  # name -> the statements that bind it
        self.loose: list[int] = []  # statements that bind nothing (calls, mutations)
        self._forms: dict[int, str] = {}
        self._named: dict[int, set[str]] = {}
        self._imports: dict[int, set[str]] = {}
        for index, statement in enumerate(self.statements):
            bound = _names_bound(statement)
            if not bound and not _is_main_guard(statement):
                self.loose.append(index)
            for bound_name in bound:
                self.binders.setdefault(bound_name, []).append(index)

    # each worked out for the statements a procedure reaches only, once
    def form(self, index: int) -> str:
        if index not in self._forms:
            self._forms[index] = normal_form(self.statements[index])
        return self._forms[index]

    def named(self, index: int) -> set[str]:
        if index not in self._named:
            self._named[index] = _names_used(self.statements[index])
        return self._named[index]

    def imports(self, index: int) -> set[str]:
        if index not in self._imports:
            self._imports[index] = _imported(self.name, self.statements[index])
        return self._imports[index]

    def statement_at(self, line: int) -> int | None:
        for index, statement in enumerate(self.statements):
            if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
                return index
        return None


def _is_main_guard(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.If) and "__main__" in ast.dump(statement.test)


def _names_bound(statement: ast.stmt) -> set[str]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in statement.names if alias.name != "*"}
    bound = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
    return bound


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _imported(module: str, statement: ast.stmt) -> set[str]:
    """The modules an import statement (anywhere inside `statement`) may load."""
    found = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                found.update(".".join(parts[: i + 1]) for i in range(len(parts)))
        elif isinstance(node, ast.ImportFrom):
            package = sys.modules.get(module)
            base = getattr(package, "__package__", None) or module.rpartition(".")[0]
            try:
                source = (
                    importlib.util.resolve_name("." * node.level + (node.module or ""), base)
                    if node.level
                    else node.module
                )
            except (ImportError, ValueError):
                continue
            if source:
                found.add(source)
                found.update(f"{source}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


@functools.lru_cache(maxsize=None)
def _parsed(name: str, path: str, stamp: tuple[int, int]) -> _Module | None:
    with open(path, "rb") as source:
        text = source.read()
    try:
        tree = ast.parse(text.replace(b"\r\n", b"\n"))
    except (SyntaxError, ValueError):
        return None
    return _Module(name, _strip_docstrings(tree))


def _module(name: str) -> tuple[_Module | None, str | None]:
    """(the parsed module, None) for source; (None, a digest of its bytes) for compiled code."""
    path = module_file(name)
    if path is None:
        return None, f"unlocated {name}"
    if not os.path.exists(path):
        return None, f"unlocated {name}"
    if path.endswith(".py"):
        stat = os.stat(path)
        parsed = _parsed(name, path, (stat.st_mtime_ns, stat.st_size))
        if parsed is not None:
            return parsed, None
    with open(path, "rb") as compiled:
        data = compiled.read()
    return None, _digest(data[PYC_HEADER:] if path.endswith(".pyc") else data)


def module_digest(name: str) -> str:
    """A digest of a whole module: its syntax tree without docstrings, or its compiled bytes."""
    module, compiled = _module(name)
    if compiled is not None:
        return compiled
    assert module is not None
    return _digest("\n".join(module.form(i) for i in range(len(module.statements))).encode())


# --- what a procedure reaches -----------------------------------------------------------------


class Reach:
    """The statements and whole modules reached from some roots."""

    def __init__(self) -> None:
        self.statements: dict[str, set[int]] = {}  # module -> indexes of its statements
        self.pieces: dict[str, set[str]] = {}  # module -> forms of parts of statements (lambdas)
        self.whole: set[str] = set()  # modules reached as a whole (imported, or without source)
        self.installed: set[str] = set()  # libraries' modules the reached code imports or calls

    def add_callable(self, item: Any) -> None:
        if isinstance(item, functools.partial):  # its arguments are values, not code
            self.add_callable(item.func)
            return
        function = getattr(item, "__func__", item)  # a bound method: its function
        code = getattr(function, "__code__", None)
        if code is None:  # a callable object: the module of its class
            self.add_module(type(item).__module__)
            return
        module_name = getattr(function, "__module__", None)
        if not isinstance(module_name, str) or not is_project_module(module_name):
            if isinstance(module_name, str) and is_installed_module(module_name):
                self.installed.add(module_name)
            return
        module, _ = _module(module_name)
        qualname = getattr(function, "__qualname__", "")
        top = qualname.split(".")[0]
        if module is None or "<locals>" in qualname:
            # compiled, or made by a factory whose arguments are written at its call sites
            self.add_module(module_name)
        elif top != "<lambda>" and top in module.binders:
            for index in module.binders[top]:
                self._add_statement(module, index)
        else:  # a lambda in a declaration: that lambda, and what it names
            index = module.statement_at(code.co_firstlineno)
            if index is None:
                self.add_module(module_name)
                return
            lambdas = [
                node
                for node in ast.walk(module.statements[index])
                if isinstance(node, ast.Lambda) and node.lineno == code.co_firstlineno
            ]
            self.pieces.setdefault(module_name, set()).update(normal_form(node) for node in lambdas)
            self._add_loose(module)
            for name in set().union(*(_names_used(node) for node in lambdas)):
                for bound in module.binders.get(name, ()):
                    self._add_statement(module, bound)

    def _add_loose(self, module: _Module) -> None:
        for index in module.loose:
            self._add_statement(module, index)

    def _add_statement(self, module: _Module, index: int) -> None:
        done = self.statements.setdefault(module.name, set())
        if index in done:
            return
        if not done:
            done.add(index)
            self._add_loose(module)
        done.add(index)
        for imported in module.imports(index):
            if imported != module.name:
                self.add_module(imported)
        for name in module.named(index):
            for bound in module.binders.get(name, ()):
                self._add_statement(module, bound)

    def add_module(self, name: str, named: bool = False) -> None:
        """All of a module; `named` (in `code=`) even when it is not the project's. A library's
        module is noted as installed instead."""
        if name in self.whole or not (named or is_project_module(name)):
            if name not in self.whole and is_installed_module(name):
                self.installed.add(name)
            return
        self.whole.add(name)
        module, _ = _module(name)
        if module is not None:
            for index in range(len(module.statements)):
                for imported in module.imports(index):
                    if imported != name:
                        self.add_module(imported)

    def digests(self) -> dict[str, str]:
        """Per module reached, a digest of what of it is reached (not of its name)."""
        out = {}
        for name in sorted(set(self.statements) | set(self.pieces) | self.whole):
            module, compiled = _module(name)
            if compiled is not None:
                out[name] = compiled
                continue
            assert module is not None
            indexes = range(len(module.statements)) if name in self.whole else sorted(self.statements.get(name, ()))
            text = "\n".join(module.form(i) for i in indexes)
            text += "\n" + "\n".join(sorted(self.pieces.get(name, ())))
            out[name] = _digest(text.encode())
        return out


def reach_of(roots: Iterable[Any], named_modules: Iterable[str] = ()) -> Reach:
    """What these functions (and the modules named in `code=`) reach."""
    reach = Reach()
    for item in roots:
        reach.add_callable(item)
    for name in named_modules:
        reach.add_module(name, named=True)
    return reach
