"""Argument schemas: a request's `args` object is checked against its procedure's schema
before ANALYZE, so a wrong shape becomes a clear rejection instead of a crash.

Also the one rule for values that travel through Ordo (`value_problem`): request bodies,
values RUN writes and results all pass it. The log and the shards are msgpack and the
outputs strict JSON; a value one of them cannot hold would otherwise fail far from its
cause, when a whole batch is encoded."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# msgpack holds integers from -2**63 to 2**64 - 1; beyond them encoding fails.
WIRE_INT_MIN = INT64_MIN
WIRE_INT_MAX = 2**64 - 1
# Deep enough for any real value, far below what msgpack (512) and the recursive JSON
# codecs (the interpreter's recursion limit) give up at.
MAX_DEPTH = 64
_WIRE_RANGE = "(-2**63 to 2**64 - 1)"


class ArgumentError(ValueError):
    """The arguments of a request do not match its procedure's schema."""


@dataclass(frozen=True, slots=True)
class Int:
    """An integer argument within [min, max] (both included; a 64-bit integer by default).
    `Int(0)`: zero or more; `Int(1, 25)`: 1 to 25. A bool is not an integer here."""

    min: int = INT64_MIN
    max: int = INT64_MAX

    def __post_init__(self) -> None:
        # Bounds inside msgpack's range make every accepted integer loggable, with no
        # check of its own on the sequencer's path.
        if not WIRE_INT_MIN <= self.min <= self.max <= WIRE_INT_MAX:
            raise ValueError(f"Int bounds [{self.min}, {self.max}] must lie within [-2**63, 2**64 - 1]")

    def check(self, name: str, value: Any) -> int:
        """`value` if it fits, else ArgumentError naming argument `name`."""
        # bool is an int subclass in Python but never a valid integer argument.
        if type(value) is not int:
            raise ArgumentError(f"argument '{name}': expected integer, got {_kind(value)}")
        if not self.min <= value <= self.max:
            if not WIRE_INT_MIN <= value <= WIRE_INT_MAX:
                # Not the number itself: thousands of digits make no reason.
                raise ArgumentError(f"argument '{name}': integer out of range {_WIRE_RANGE}")
            raise ArgumentError(f"argument '{name}': {value} outside [{self.min}, {self.max}]")
        return value


@dataclass(frozen=True, slots=True)
class Str:
    """A string argument of at most `max_len` characters."""

    max_len: int = 256

    def check(self, name: str, value: Any) -> str:
        """`value` if it fits, else ArgumentError naming argument `name`."""
        if type(value) is not str:
            raise ArgumentError(f"argument '{name}': expected string, got {_kind(value)}")
        if len(value) > self.max_len:
            raise ArgumentError(f"argument '{name}': longer than {self.max_len} characters")
        return value


@dataclass(frozen=True, slots=True)
class Float:
    """A number, carried as an IEEE-754 double. An integer argument is taken as the float
    it names (the log then holds the float); a boolean, infinity or NaN is refused."""

    min: float = -math.inf
    max: float = math.inf

    def __post_init__(self) -> None:
        if math.isnan(self.min) or math.isnan(self.max) or self.min > self.max:
            raise ValueError(f"Float bounds [{self.min}, {self.max}] must be numbers, min <= max")

    def check(self, name: str, value: Any) -> float:
        """`value` as a float if it fits, else ArgumentError naming argument `name`."""
        kind = type(value)
        if kind is int:
            if abs(value) > 2**53:
                raise ArgumentError(f"argument '{name}': integer {value} has no exact float")
            value = float(value)
        elif kind is not float:
            raise ArgumentError(f"argument '{name}': expected number, got {_kind(value)}")
        if not math.isfinite(value):
            raise ArgumentError(f"argument '{name}': {value} is not a finite number")
        if not self.min <= value <= self.max:
            raise ArgumentError(f"argument '{name}': {value!r} outside [{self.min!r}, {self.max!r}]")
        return value


@dataclass(frozen=True, slots=True)
class Bool:
    """A boolean argument: true or false, never a number."""

    def check(self, name: str, value: Any) -> bool:
        """`value` if it is a boolean, else ArgumentError naming argument `name`."""
        if type(value) is not bool:
            raise ArgumentError(f"argument '{name}': expected boolean, got {_kind(value)}")
        return value


@dataclass(frozen=True, slots=True)
class Object:
    """A JSON object: with `fields`, checked like a procedure's arguments (each field by its
    type, `Optional` ones filled in, no other key); without, any object of text keys whose
    values can travel through Ordo."""

    fields: dict | None = None
    max_keys: int = 256

    def check(self, name: str, value: Any) -> dict:
        """`value` if it fits (its `Optional` fields filled in), else ArgumentError naming the
        argument or field."""
        if type(value) is not dict:
            raise ArgumentError(f"argument '{name}': expected object, got {_kind(value)}")
        if len(value) > self.max_keys:
            raise ArgumentError(f"argument '{name}': more than {self.max_keys} keys")
        if self.fields is None:
            if any(type(key) is not str for key in value):
                raise ArgumentError(f"argument '{name}': object keys must be text")
            problem = value_problem(value)
            if problem is not None:
                raise ArgumentError(f"argument '{name}': {problem}")
            return value
        return _check_fields(self.fields, value, f"{name}.")


@dataclass(frozen=True, slots=True)
class Optional:
    """A field that may be left out (then it is `default`) or given as null."""

    field: Any
    default: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.field, Optional):
            raise ValueError("Optional(Optional(...)): one Optional is enough")
        if self.default is not None:  # kept as the field takes it (1 for a Float: 1.0)
            object.__setattr__(self, "default", self.field.check("default", _copy(self.default)))
        problem = value_problem(self.default)
        if problem is not None:
            raise ValueError(f"Optional default: {problem}")

    def check(self, name: str, value: Any) -> Any:
        """None for null, else `value` as `field` checks it."""
        return None if value is None else self.field.check(name, value)

    def missing(self) -> Any:
        """The value of the field when it is left out: a copy of `default`."""
        return _copy(self.default)


@dataclass(frozen=True, slots=True)
class List:
    """A list argument of `min_len` to `max_len` items, each an `item` (any argument type).
    As a key path (`keys=[("stock", "items")]`) every item is a key."""

    item: Any
    min_len: int = 0
    max_len: int = 1024

    def check(self, name: str, value: Any) -> list:
        """`value` if it and every item fit, else ArgumentError naming the argument or item."""
        if type(value) is not list:
            raise ArgumentError(f"argument '{name}': expected list, got {_kind(value)}")
        if not self.min_len <= len(value) <= self.max_len:
            raise ArgumentError(f"argument '{name}': expected {self.min_len}..{self.max_len} items, got {len(value)}")
        check = self.item.check
        for i, item in enumerate(value):
            checked = check(f"{name}[{i}]", item)
            if checked is not item:
                value[i] = checked
        return value


Field = Int | Str | Float | Bool | Object | Optional | List
FIELD_TYPES = (Int, Str, Float, Bool, Object, Optional, List)


def key_field_problem(field: Field, item: bool = False) -> str | None:
    """Why an argument of type `field` can be no key (docs/keys.md, "Which arguments are
    keys"), or None. Keys are int64 integers and strings: `Int()` within 64 bits, `Str()`,
    `Optional` of one of them with a default (a null then fails that request alone), and
    as a whole path a `List` of them, each item a key."""
    if isinstance(field, Str):
        return None
    if isinstance(field, Int):
        if field.min < INT64_MIN or field.max > INT64_MAX:
            return f"Int({field.min}, {field.max}) reaches past 64 bits, which a key cannot (keep max <= 2**63 - 1)"
        return None
    if isinstance(field, Optional):
        if item:
            return "an Optional list item can be null, which no key is"
        if field.default is None:
            return "Optional(...) without a default is null when left out, which no key is (give default=)"
        return key_field_problem(field.field, item=True)
    if isinstance(field, List):
        if item:
            return "a list inside a list is no key"
        return key_field_problem(field.item, item=True)
    names: dict[type, str] = {Float: "a Float", Bool: "a Bool", Object: "an Object"}
    return f"{names.get(type(field), repr(field))} is no key (keys are integers and strings)"


def check_args(schema: dict[str, Field], args: Any) -> dict[str, Any]:
    """Validate `args` against `schema`: every field present (an `Optional` one left out
    is filled in with its default), no unknown field. The arguments are brought to their
    logged form in place (an integer given for a Float becomes that float), so the log
    holds exactly what every engine runs."""
    if type(args) is not dict:
        raise ArgumentError(f"'args' must be an object, got {_kind(args)}")
    return _check_fields(schema, args, "")


def _check_fields(schema: dict, args: dict, prefix: str) -> dict:
    missing = [name for name, field in schema.items() if name not in args and type(field) is not Optional]
    if missing:
        raise ArgumentError(f"missing argument(s): {', '.join(prefix + name for name in sorted(missing))}")
    unknown = [name for name in args if name not in schema]
    if unknown:
        raise ArgumentError(f"unknown argument(s): {', '.join(prefix + str(n) for n in sorted(map(str, unknown)))}")
    for name, field in schema.items():
        if name not in args:
            args[name] = field.missing()
            continue
        value = args[name]
        checked = field.check(prefix + name, value)
        if checked is not value:
            args[name] = checked
    return args


def _copy(value: Any) -> Any:
    """A private copy of a JSON-like value (a default handed to many requests)."""
    if type(value) is dict:
        return {key: _copy(member) for key, member in value.items()}
    if type(value) is list:
        return [_copy(member) for member in value]
    return value


# Schema (by identity, held so its id is not reused) -> names of its List fields.
_simple_schemas: dict[int, tuple[dict, tuple[str, ...]]] = {}


def list_fields(schema: dict[str, Field]) -> tuple[str, ...] | None:
    """The names of the List fields of a schema made of Int, Str and List-of-Int-or-Str
    fields only, or None for a schema with a field type of its own. What such a schema
    accepts is a flat map of integers within 64 bits, text and lists of those, so it needs
    no walk to be known loggable, and a copy one level deep is a private copy. Costs one
    dictionary look-up per call."""
    cached = _simple_schemas.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    lists = []
    for name, field in schema.items():
        kind = type(field)
        if isinstance(field, List) and type(field.item) in (Int, Str):
            lists.append(name)
        elif kind is not Int and kind is not Str:
            return None
    _simple_schemas[id(schema)] = (schema, tuple(lists))
    return tuple(lists)


def text_problem(text: str) -> str | None:
    """Why `text` cannot be encoded as UTF-8 (a lone surrogate, which JSON's \\u escapes
    can produce), or None."""
    if text.isascii():
        return None
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return f"text is not valid Unicode: lone surrogate at character {exc.start}"
    return None


def value_problem(value: Any, max_depth: int = MAX_DEPTH) -> str | None:
    """Why `value` cannot travel through Ordo, or None. Allowed: null, booleans, integers
    from -2**63 to 2**64 - 1, finite floats, valid text, lists (tuples) and maps keyed by
    text or integers, nested at most `max_depth` deep. Iterative, so no depth of input
    can exhaust the stack."""
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        kind = type(item)
        if kind is int:
            if not WIRE_INT_MIN <= item <= WIRE_INT_MAX:
                return f"integer out of range {_WIRE_RANGE}"
        elif kind is str:
            if not item.isascii():
                problem = text_problem(item)
                if problem is not None:
                    return problem
        elif item is None or kind is bool:
            continue
        elif kind is float:
            if not math.isfinite(item):
                return f"{item} is not a finite number"
        elif kind is list or kind is tuple or kind is dict:
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels"
            depth += 1
            if kind is dict:
                for key, member in item.items():
                    key_kind = type(key)
                    if key_kind is str:
                        if not key.isascii():
                            problem = text_problem(key)
                            if problem is not None:
                                return problem
                    elif key_kind is int:
                        if not WIRE_INT_MIN <= key <= WIRE_INT_MAX:
                            return f"integer out of range {_WIRE_RANGE}"
                    else:
                        return f"map key of type {key_kind.__name__} (keys are text or integers)"
                    push((member, depth))
            else:
                for member in item:
                    push((member, depth))
        else:
            return f"Object of type {kind.__name__} is not JSON serializable"
    return None


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
