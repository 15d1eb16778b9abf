"""The components stay in layers: a module imports only from its own layer or the ones
below it, lazily or not (docs/architecture.md, "Components and layers"). Read from the
source, so a new arrow back up fails here, not in a reader's head."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Lowest first. A folder is a component; the `ordo` package holds the base modules every
# layer may use, reading a data directory, the API and the app on top.
LAYERS = [
    "base",
    "storage",
    "broker",
    "procedures",
    "log",
    "sequencer",
    "recovery",
    "scheduler",
    "api",
    "spark_jobs",
    "app",
]
FOLDERS = ["storage", "broker", "procedures", "log", "sequencer", "scheduler", "recovery", "spark_jobs"]
ORDO_MODULES = {
    "errors": "base",
    "maven": "base",
    "extras": "base",
    "config": "base",
    "lifeline": "base",
    "stopping": "base",
    "state": "storage",  # dump and digest over a data directory's shards
    "client": "api",
    "reading": "api",
    "live_reads": "api",
    "embedded": "api",
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in FOLDERS:
        return parts[1]
    if len(parts) > 1 and parts[1] == "__main__":
        return "app"  # the `ordo` command
    if len(parts) > 1 and parts[1].startswith("__"):
        return "base"  # the package's own metadata (`__version__`)
    if len(parts) > 1:
        return ORDO_MODULES.get(parts[1], "app")
    return "app"  # the `ordo` package itself: its exports are the API


def module_of(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts[0] == "ordo" else "ordo." + ".".join(parts)


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ordo":
            if node.module == "ordo":
                found += [(node.lineno, f"ordo.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "ordo"]
    return found


def test_no_module_imports_from_a_layer_above_its_own():
    arrows_up = []
    for folder in [*FOLDERS, "ordo"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = module_of(path)
            here = LAYERS.index(layer_of(source))
            for line, target in imports(path):
                if LAYERS.index(layer_of(target)) > here:
                    arrows_up.append(f"{path.relative_to(ROOT)}:{line} ({layer_of(source)}) imports {target}")
    assert not arrows_up, "imports from a layer above:\n" + "\n".join(arrows_up)


def test_every_component_folder_says_what_it_owns():
    for folder in FOLDERS:
        doc = ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text()))
        assert doc, f"{folder}/__init__.py has no docstring saying what it owns"
