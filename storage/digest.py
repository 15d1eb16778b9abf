"""An order-independent digest of a set of (key, value) pairs: the sum, modulo 2^128,
of a hash of each pair. Shards combine by addition, so the digest of a state does not
depend on how it is partitioned or in which order it is scanned."""

from __future__ import annotations

from hashlib import blake2b
from typing import Iterable

MODULUS = 1 << 128


def pair_hash(key: bytes, value: bytes) -> int:
    h = blake2b(len(key).to_bytes(4, "big"), digest_size=16)
    h.update(key)
    h.update(value)
    return int.from_bytes(h.digest(), "big")


def digest_pairs(pairs: Iterable[tuple[bytes, bytes]]) -> int:
    total = 0
    for key, value in pairs:
        total += pair_hash(key, value)
    return total % MODULUS


def combine(digests: Iterable[int]) -> int:
    return sum(digests) % MODULUS


def to_hex(digest: int) -> str:
    return f"{digest:032x}"
