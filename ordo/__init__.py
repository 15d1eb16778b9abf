"""Ordo: a deterministic transaction engine for streams.

    import ordo
    app = ordo.App("bank")         # tables and procedures (ordo/app.py)
    client = ordo.Client(...)      # submit requests, collect outcomes (ordo/client.py)
"""

__version__ = "0.1.0"

__all__ = ["App", "Client", "__version__"]


def __getattr__(name: str):
    # Imported on first use: `ordo.cli` starts without loading the Kafka client.
    if name == "App":
        from ordo.app import App

        return App
    if name == "Client":
        from ordo.client import Client

        return Client
    raise AttributeError(f"module 'ordo' has no attribute {name!r}")
