"""Stored procedures: the ANALYZE + RUN contract, the registry and the built-in workloads;
what a procedure set is (its identity from the code it reaches, fingerprint.py and
reach.py), how a running process reads it again (reload.py) and how the log keeps its code
(kept.py). Imports only the base modules and storage."""

from ordo.procedures.contract import Abort, Context, Procedure, Table, TxnContext, UndeclaredAccess
from ordo.procedures.registry import Registry, default_registry

__all__ = [
    "Abort",
    "Context",
    "Procedure",
    "Registry",
    "Table",
    "TxnContext",
    "UndeclaredAccess",
    "default_registry",
]
