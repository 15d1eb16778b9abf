"""Values are msgpack. Maps are encoded with sorted keys so that equal values always have
equal bytes, whatever order a procedure built them in: the digest depends on it."""

from __future__ import annotations

from typing import Any

import msgpack

_packb = msgpack.packb
_unpackb = msgpack.unpackb


def canonical(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {k: canonical(value[k]) for k in sorted(value)}
    if kind is list or kind is tuple:
        return [canonical(v) for v in value]
    return value


def encode_value(value: Any) -> bytes:
    kind = type(value)
    if kind is dict or kind is list or kind is tuple:
        value = canonical(value)
    return _packb(value)


def decode_value(raw: bytes) -> Any:
    return _unpackb(raw, strict_map_key=False)
