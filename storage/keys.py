"""Order-preserving encoding of logical keys `(table, key)` into RocksDB keys.

Layout: table name (UTF-8) + 0x00 + tag + key bytes. Integers (int64) are stored
big-endian with the sign bit flipped so byte order equals numeric order; strings as
UTF-8. Integer keys sort before string keys of the same table. Engine metadata lives
under a leading 0x00, which no table name can produce.
"""

from __future__ import annotations

import struct
from functools import lru_cache

_INT = b"\x01"
_STR = b"\x02"
_SEP = b"\x00"
_BIAS = 1 << 63
_PACK = struct.Struct(">Q").pack
_UNPACK = struct.Struct(">Q").unpack
META_PREFIX = b"\x00"


def table_prefix(table: str) -> bytes:
    return table.encode() + _SEP


@lru_cache(maxsize=1 << 18)
def encode_key(table: str, key: int | str) -> bytes:
    """Memoised: a transaction names each key several times (ANALYZE, placement, RUN)."""
    if type(key) is int:
        return table.encode() + _SEP + _INT + _PACK(key + _BIAS)
    if type(key) is str:
        return table.encode() + _SEP + _STR + key.encode()
    raise TypeError(f"key of table '{table}' must be an integer or a string, got {type(key).__name__}")


def decode_key(raw: bytes) -> tuple[str, int | str]:
    table, _, rest = raw.partition(_SEP)
    tag, body = rest[:1], rest[1:]
    if tag == _INT:
        return table.decode(), _UNPACK(body)[0] - _BIAS
    if tag == _STR:
        return table.decode(), body.decode()
    raise ValueError(f"not a table key: {raw!r}")


def meta_key(name: str) -> bytes:
    return META_PREFIX + name.encode()


def check_table_name(name: str) -> None:
    if not name or "\x00" in name:
        raise ValueError(f"invalid table name {name!r}")
