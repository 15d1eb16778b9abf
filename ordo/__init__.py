"""Ordo: a deterministic transaction engine for streams."""

__version__ = "0.1.0"
