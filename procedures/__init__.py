"""Stored procedures: the ANALYZE + RUN contract, the registry and the built-in workloads."""

from procedures.contract import Abort, Procedure, Table, TxnContext, UndeclaredAccess
from procedures.registry import Registry, default_registry

__all__ = [
    "Abort",
    "Procedure",
    "Registry",
    "Table",
    "TxnContext",
    "UndeclaredAccess",
    "default_registry",
]
