"""Hostile frames shared by the codec and server tests: each makes a naive decoder spend far more
than the frame's size (fixtures, because test modules here are not importable by one another)."""

from __future__ import annotations

import struct
from typing import Callable

import msgpack
import pytest

_M64 = (1 << 64) - 1
_XXPRIME_1, _XXPRIME_2, _XXPRIME_5 = 11400714785074694791, 14029467366897019727, 2870177450012600261
_HASH_MODULUS = (1 << 61) - 1  # CPython hashes an int to itself modulo this
_TUPLE_TAG = msgpack.packb(msgpack.ExtType(1, b""))


def _pairs(count: int) -> list[tuple[int, int]]:
    def after_first(a: int) -> int:
        acc = (_XXPRIME_5 + (hash(a) & _M64) * _XXPRIME_2) & _M64
        return ((acc << 31 | acc >> 33) & _M64) * _XXPRIME_1 & _M64

    inverse = pow(_XXPRIME_2, -1, 1 << 64)
    pairs, a = [], 0
    while len(pairs) < count:
        lane = ((0x5EED - after_first(a)) * inverse) & _M64  # the hash b needs
        if lane < _HASH_MODULUS:
            pairs.append((a, lane))
        a += 1
    return pairs


def _frame(header: bytes) -> bytes:
    return struct.pack("<I", len(header)) + header


@pytest.fixture
def colliding_pairs() -> Callable[[int], list[tuple[int, int]]]:
    """`count` distinct (a, b) whose tuple hashes are all equal: CPython's xxHash-style tuple hash
    is invertible in its last item, and an int's hash is the int itself (below 2**61 - 1)."""
    return _pairs


@pytest.fixture
def colliding_keys_frame() -> Callable[[int], bytes]:
    """A codec frame of [[{(a, b): None, ...}], {}] with `count` colliding tuple keys, packed by
    hand (building that dict here would itself take seconds)."""
    def build(count: int) -> bytes:
        entries = b"".join(b"\x93" + _TUPLE_TAG + msgpack.packb(a) + msgpack.packb(b) + b"\xc0" for a, b in _pairs(count))
        return _frame(b"\x92\x91\xde" + struct.pack(">H", count) + entries + b"\x80")
    return build


@pytest.fixture
def empty_lists_frame() -> Callable[[int], bytes]:
    """A codec frame of [[[], [], ... `count` of them], {}]: one byte (0x90) per list."""
    return lambda count: _frame(b"\x92\x91\xdd" + struct.pack(">I", count) + b"\x90" * count + b"\x80")
