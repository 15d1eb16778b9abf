"""Order-preserving encoding of logical keys `(table, key)` into RocksDB keys.

Layout: table name (UTF-8) + 0x00 + tag + key bytes. Integers (int64) are stored
big-endian with the sign bit flipped so byte order equals numeric order; strings as
UTF-8. Integer keys sort before string keys, and both before composite keys, of the same
table. Engine metadata lives under a leading 0x00, which no table name can produce.

Composite keys are tuples of integers and strings (docs/keys.md): tag 0x03, then each
component as its own tag and body. A string component is escaped (0x00 -> 0x00 0xFF) and
ends with 0x00 0x01, so a shorter string sorts before its extensions and the encoding of
a tuple's prefix is a byte prefix of the tuple's encoding: byte order = tuple order.

A declared range (`KeyRange`, every key of a table starting with some components) encodes
under tag 0x04 with the same components: a key never stored, which schedulers lock like
any other key (docs/keys.md).
"""

from __future__ import annotations

import struct
from functools import lru_cache

_INT = b"\x01"
_STR = b"\x02"
_TUPLE = b"\x03"
_RANGE = b"\x04"
_RANGE_BYTE = 4
_SEP = b"\x00"
_STR_END = b"\x00\x01"
_BIAS = 1 << 63
_PACK = struct.Struct(">Q").pack
_UNPACK = struct.Struct(">Q").unpack
META_PREFIX = b"\x00"


def table_prefix(table: str) -> bytes:
    return table.encode() + _SEP


class KeyRange:
    """The keys of a table whose leading components equal `components`. Not a tuple, so
    that it never compares (or caches) equal to the composite key it names."""

    __slots__ = ("components",)

    def __init__(self, components) -> None:
        self.components = tuple(components)

    def __eq__(self, other) -> bool:
        return type(other) is KeyRange and other.components == self.components

    def __hash__(self) -> int:
        return hash((KeyRange, self.components))

    def __repr__(self) -> str:
        return f"KeyRange{self.components!r}"


_ranges_seen = False


def ranges_seen() -> bool:
    """Whether this process ever encoded a range: code that treats ranged transactions
    apart can skip looking for them until then."""
    return _ranges_seen


_int_prefixes: dict[str, bytes] = {}


def encode_key(table: str, key: int | str | tuple) -> bytes:
    """A composite key must be a tuple (msgpack and JSON give lists: `normal_key`).

    Integer keys are encoded on every call: a table's prefix plus 8 bytes costs less than
    a memo lookup that misses, which is what most keys of a wide key space do (about
    0.2 µs against 0.6). Other keys are memoised: a transaction names each key several
    times (ANALYZE, placement, RUN)."""
    if type(key) is int:
        prefix = _int_prefixes.get(table)
        if prefix is None:
            prefix = _int_prefixes[table] = table.encode() + _SEP + _INT
        return prefix + _PACK(key + _BIAS)
    return _encode_other(table, key)


@lru_cache(maxsize=1 << 18)
def _encode_other(table: str, key: str | tuple) -> bytes:
    if type(key) is str:
        return table.encode() + _SEP + _STR + key.encode()
    if type(key) is tuple:
        return table.encode() + _SEP + _TUPLE + _components(table, key)
    if type(key) is KeyRange:
        global _ranges_seen
        _ranges_seen = True
        return table.encode() + _SEP + _RANGE + _components(table, key.components)
    raise TypeError(f"key of table '{table}' must be an integer, a string or a tuple of them, got {type(key).__name__}")


def _components(table: str, key: tuple) -> bytes:
    if not key:
        raise TypeError(f"composite key of table '{table}' is empty")
    parts = []
    for component in key:
        kind = type(component)
        if kind is int:
            if not -_BIAS <= component < _BIAS:
                raise TypeError(f"key component of table '{table}' outside 64 bits: {component}")
            parts.append(_INT + _PACK(component + _BIAS))
        elif kind is str:
            parts.append(_STR + component.encode().replace(b"\x00", b"\x00\xff") + _STR_END)
        else:
            raise TypeError(
                f"composite key components of table '{table}' must be integers or strings, got {kind.__name__}"
            )
    return b"".join(parts)


def key_problem(key) -> str | None:
    """Why `key` cannot be a key (docs/keys.md), or None: an int64, a string of Unicode
    text, a non-empty tuple of them, or a range over such components. Checked where keys
    arrive from user code, so a bad key is one request's rejection, never a failure of
    the batch that holds it."""
    kind = type(key)
    if kind is int:
        return None if -_BIAS <= key < _BIAS else "an integer key must fit in 64 bits"
    if kind is str:
        return None if key.isascii() or _is_text(key) else "a string key must be Unicode text (no lone surrogates)"
    if kind is tuple or kind is KeyRange:
        components = key if kind is tuple else key.components
        if not components:
            return "a composite key must have at least one component"
        for component in components:
            part = type(component)
            if part is int:
                if not -_BIAS <= component < _BIAS:
                    return "an integer key component must fit in 64 bits"
            elif part is str:
                if not (component.isascii() or _is_text(component)):
                    return "a string key component must be Unicode text (no lone surrogates)"
            else:
                return f"a composite key's components must be integers or strings, got {_kind(component)}"
        return None
    return f"a key must be an integer, a string or a tuple of them, got {_kind(key)}"


def _is_text(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def normal_key(key):
    """A key as `encode_key` takes it: a list (what msgpack and JSON carry a tuple as)
    becomes a tuple. Every boundary where keys come from outside RUN's Python values
    (ANALYZE results, ctx.read/write/delete arguments) passes through here."""
    return tuple(key) if type(key) is list else key


def prefix_bytes(table: str, prefix: tuple) -> bytes:
    """The bytes every key of `table` whose leading components equal `prefix` starts with."""
    return table.encode() + _SEP + _TUPLE + _components(table, tuple(prefix))


def is_range_key(encoded: bytes) -> bool:
    at = encoded.find(_SEP) + 1
    return 0 < at < len(encoded) and encoded[at] == _RANGE_BYTE


def range_scan_prefix(encoded: bytes) -> bytes:
    """The byte prefix of every stored key in the range that `encoded` (a range key) names."""
    at = encoded.find(_SEP) + 1
    return encoded[:at] + _TUPLE + encoded[at + 1 :]


def decode_key(raw: bytes) -> tuple[str, int | str | tuple]:
    table, _, rest = raw.partition(_SEP)
    tag, body = rest[:1], rest[1:]
    if tag == _INT:
        return table.decode(), _UNPACK(body)[0] - _BIAS
    if tag == _STR:
        return table.decode(), body.decode()
    if tag == _TUPLE:
        return table.decode(), _decode_components(raw, body)
    if tag == _RANGE:
        return table.decode(), KeyRange(_decode_components(raw, body))
    raise ValueError(f"not a table key: {raw!r}")


def _decode_components(raw: bytes, body: bytes) -> tuple:
    out: list[int | str] = []
    i, n = 0, len(body)
    while i < n:
        tag = body[i : i + 1]
        if tag == _INT:
            out.append(_UNPACK(body[i + 1 : i + 9])[0] - _BIAS)
            i += 9
        elif tag == _STR:
            j, chunk = i + 1, bytearray()
            while True:
                k = body.find(_SEP, j)
                if k < 0 or k + 1 >= n:
                    raise ValueError(f"not a table key: {raw!r}")
                chunk += body[j:k]
                if body[k + 1] == 0xFF:
                    chunk += _SEP
                    j = k + 2
                elif body[k + 1] == 0x01:
                    i = k + 2
                    break
                else:
                    raise ValueError(f"not a table key: {raw!r}")
            out.append(chunk.decode())
        else:
            raise ValueError(f"not a table key: {raw!r}")
    return tuple(out)


def meta_key(name: str) -> bytes:
    return META_PREFIX + name.encode()


def check_table_name(name: str) -> None:
    if not name or "\x00" in name:
        raise ValueError(f"invalid table name {name!r}")
