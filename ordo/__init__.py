"""Ordo: a deterministic transaction engine for streams.

    import ordo
    app = ordo.App("bank")         # tables and procedures (ordo/app.py)
    client = ordo.Client(...)      # submit requests, collect outcomes (ordo/client.py)

Everything importable is under `ordo.`: the components are `ordo.sequencer`,
`ordo.scheduler`, `ordo.storage`, `ordo.recovery`, `ordo.procedures` and `ordo.spark_jobs`
(the repository's top-level folders of the same names, mapped into the package), so a
module of a user's own named `storage` or `procedures` shadows nothing of Ordo's. The
public API, below, is documented in docs/api.md.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Public name -> the module that defines it, imported on first use: `ordo.cli` starts
# without loading the Kafka client.
_PUBLIC = {
    "App": "ordo.app",
    "Context": "ordo.procedures.contract",  # what RUN receives as ctx
    "Client": "ordo.client",
    "AsyncClient": "ordo.client",
    "Submission": "ordo.client",
    "new_request": "ordo.client",
    "Outcome": "ordo.reading",  # what the client reads back (Client.read_outcomes, …)
    "StreamTuple": "ordo.reading",
    "Change": "ordo.reading",
    "UnreadableRecord": "ordo.reading",
    "StateRead": "ordo.live_reads",  # what a read of the state found (Client.get, …)
    "ReadFailed": "ordo.live_reads",
    "ReadTimeout": "ordo.live_reads",
    "Source": "ordo.sequencer.sources",  # an existing topic whose records become requests
    "SourceRecord": "ordo.sequencer.sources",
    "TestEngine": "ordo.testing",
    "check_deterministic": "ordo.testing",
    "Int": "ordo.procedures.args",  # an argument schema's field types
    "Str": "ordo.procedures.args",
    "Float": "ordo.procedures.args",
    "Bool": "ordo.procedures.args",
    "Object": "ordo.procedures.args",
    "Optional": "ordo.procedures.args",
    "List": "ordo.procedures.args",
    "OrdoError": "ordo.errors",
    "BrokerUnavailable": "ordo.errors",
    "TopicMissing": "ordo.errors",
    "NotSent": "ordo.errors",
    "Timeout": "ordo.errors",
    "OutcomeTimeout": "ordo.errors",
}

__all__ = [*_PUBLIC, "__version__"]

if TYPE_CHECKING:  # what type checkers and editors see of the names loaded on first use
    from ordo.app import App
    from ordo.client import AsyncClient, Client, Submission, new_request
    from ordo.errors import BrokerUnavailable, NotSent, OrdoError, OutcomeTimeout, Timeout, TopicMissing
    from ordo.procedures.contract import Context
    from ordo.procedures.args import Bool, Float, Int, List, Object, Optional, Str
    from ordo.reading import Change, Outcome, StreamTuple, UnreadableRecord
    from ordo.live_reads import ReadFailed, ReadTimeout, StateRead
    from ordo.procedures.sources import Source, SourceRecord
    from ordo.testing import TestEngine, check_deterministic


def __getattr__(name: str):
    import importlib

    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    if _is_submodule(name):  # `ordo.client.new_request` after a bare `import ordo`, as the guides write it
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'ordo' has no attribute {name!r}")


def _is_submodule(name: str) -> bool:
    import importlib.util

    return (
        name.isidentifier() and not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None
    )


def __dir__() -> list[str]:
    """The public names, the module's dunders and the submodules loaded so far: not the
    helpers of this file (`TYPE_CHECKING`, `_PUBLIC`)."""
    import types

    here = globals()
    return sorted({*__all__, *(n for n in here if n.startswith("__") or isinstance(here[n], types.ModuleType))})
