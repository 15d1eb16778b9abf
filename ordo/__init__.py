"""Ordo: a deterministic transaction engine for streams.

    import ordo
    app = ordo.App("bank")         # tables and procedures (ordo/app.py)
    client = ordo.Client(...)      # submit requests, collect outcomes (ordo/client.py)

Everything importable is under `ordo.`: the components are `ordo.sequencer`,
`ordo.scheduler`, `ordo.storage`, `ordo.recovery`, `ordo.procedures` and `ordo.spark_jobs`
(the repository's top-level folders of the same names, mapped into the package), so a
module of a user's own named `storage` or `procedures` shadows nothing of Ordo's.
"""

__version__ = "0.1.0"

__all__ = ["App", "Client", "Int", "Str", "Float", "Bool", "Object", "Optional", "List", "__version__"]
_FIELDS = ("Int", "Str", "Float", "Bool", "Object", "Optional", "List")  # an argument schema's field types (procedures/args.py)


def __getattr__(name: str):
    # Imported on first use: `ordo.cli` starts without loading the Kafka client.
    if name == "App":
        from ordo.app import App

        return App
    if name == "Client":
        from ordo.client import Client

        return Client
    if name in _FIELDS:
        from ordo.procedures import args

        return getattr(args, name)
    raise AttributeError(f"module 'ordo' has no attribute {name!r}")
