"""Argument schemas: a request's `args` object is checked against its procedure's schema
before ANALYZE, so a wrong shape becomes a clear rejection instead of a crash."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class ArgumentError(ValueError):
    """The arguments of a request do not match its procedure's schema."""


@dataclass(frozen=True, slots=True)
class Int:
    min: int = INT64_MIN
    max: int = INT64_MAX

    def check(self, name: str, value: Any) -> int:
        # bool is an int subclass in Python but never a valid integer argument.
        if type(value) is not int:
            raise ArgumentError(f"argument '{name}': expected integer, got {_kind(value)}")
        if not self.min <= value <= self.max:
            raise ArgumentError(f"argument '{name}': {value} outside [{self.min}, {self.max}]")
        return value


@dataclass(frozen=True, slots=True)
class Str:
    max_len: int = 256

    def check(self, name: str, value: Any) -> str:
        if type(value) is not str:
            raise ArgumentError(f"argument '{name}': expected string, got {_kind(value)}")
        if len(value) > self.max_len:
            raise ArgumentError(f"argument '{name}': longer than {self.max_len} characters")
        return value


@dataclass(frozen=True, slots=True)
class List:
    item: Int | Str
    min_len: int = 0
    max_len: int = 1024

    def check(self, name: str, value: Any) -> list:
        if type(value) is not list:
            raise ArgumentError(f"argument '{name}': expected list, got {_kind(value)}")
        if not self.min_len <= len(value) <= self.max_len:
            raise ArgumentError(
                f"argument '{name}': expected {self.min_len}..{self.max_len} items, got {len(value)}"
            )
        for i, item in enumerate(value):
            self.item.check(f"{name}[{i}]", item)
        return value


Field = Int | Str | List


def check_args(schema: dict[str, Field], args: Any) -> dict[str, Any]:
    """Validate `args` against `schema`: every field present, no unknown field."""
    if type(args) is not dict:
        raise ArgumentError(f"'args' must be an object, got {_kind(args)}")
    missing = [name for name in schema if name not in args]
    if missing:
        raise ArgumentError(f"missing argument(s): {', '.join(sorted(missing))}")
    unknown = [name for name in args if name not in schema]
    if unknown:
        raise ArgumentError(f"unknown argument(s): {', '.join(sorted(map(str, unknown)))}")
    for name, field in schema.items():
        field.check(name, args[name])
    return args


def _kind(value: Any) -> str:
    return {
        type(None): "null",
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "object",
    }.get(type(value), type(value).__name__)
