"""Stored procedures: the ANALYZE + RUN contract, the registry and the built-in workloads."""

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
