"""The bloom filter RocketMQ 4.4.0 puts in the consume queue extension (filter/.../util/BloomFilter.java,
BitsArray.java), bit for bit.

Parameters (BloomFilter.createByFn(f, n), f = maxErrorRateOfBloomFilter in percent, n =
expectConsumerNumUseFilter): k = ceil(log_0.5(f/100)) hash functions, m = ceil(n * log2(100/f) * log2(e))
bits rounded up to whole bytes (f=20, n=32: k=3, m=112, 14 bytes).

A consumer's bit positions (BloomFilterData) come from the string "group#topic": Guava's murmur3_128 of its
UTF-8 bytes (seed 0), asLong() (the first 8 bytes, little-endian) split into hash1 (low 32 bits) and hash2
(high 32 bits); position i (1..k) is hash1 + i * hash2 as a Java int, bit-inverted when negative, modulo m.
A bit map is m bits in bytes: bit p is (byte p / 8) & (1 << p % 8).
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

_M64 = (1 << 64) - 1
_C1, _C2 = 0x87C37B91114253D5, 0x4CF5AD432745937F


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    return k ^ (k >> 33)


def murmur3_x64_128(data: bytes, seed: int = 0) -> tuple[int, int]:
    """MurmurHash3 x64 128-bit (as Guava's Hashing.murmur3_128): (h1, h2) as unsigned 64-bit ints."""
    h1 = h2 = seed & _M64
    n = len(data)
    nblocks = n // 16
    for i in range(nblocks):
        k1, k2 = struct.unpack_from("<QQ", data, i * 16)
        k1 = (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64
        h1 ^= k1
        h1 = (_rotl(h1, 27) + h2) & _M64
        h1 = (h1 * 5 + 0x52DCE729) & _M64
        k2 = (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64
        h2 ^= k2
        h2 = (_rotl(h2, 31) + h1) & _M64
        h2 = (h2 * 5 + 0x38495AB5) & _M64
    tail = data[nblocks * 16:]
    k1 = int.from_bytes(tail[:8], "little")
    k2 = int.from_bytes(tail[8:], "little")
    if len(tail) > 8:
        k2 = (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64
        h2 ^= k2
    if tail:
        k1 = (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64
        h1 ^= k1
    h1 ^= n
    h2 ^= n
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    return h1, h2


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


@dataclass(frozen=True)
class BloomFilterData:
    """A consumer's bit positions in the bit map (RocketMQ's BloomFilterData, persisted in consumerFilter.json)."""
    bit_pos: tuple[int, ...]
    bit_num: int


class BloomFilter:
    def __init__(self, f: int = 20, n: int = 32):
        if not 1 <= f < 100:
            raise ValueError(f"maxErrorRateOfBloomFilter must be 1..99 (percent), not {f}")
        if n < 1:
            raise ValueError(f"expectConsumerNumUseFilter must be at least 1, not {n}")
        self.f, self.n = f, n
        rate = f / 100.0
        self.k = math.ceil(math.log(rate) / math.log(0.5))
        m = math.ceil(n * (math.log(1 / rate) / math.log(2)) * (math.log(math.e) / math.log(2)))
        self.m = 8 * math.ceil(m / 8.0)
        self.byte_length = self.m // 8

    def __repr__(self) -> str:
        return f"f: {self.f}, n: {self.n}, k: {self.k}, m: {self.m}"

    def bit_positions(self, s: str) -> tuple[int, ...]:
        h64 = murmur3_x64_128(s.encode("utf-8"))[0]
        h1, h2 = _int32(h64), _int32(h64 >> 32)
        out = []
        for i in range(1, self.k + 1):
            c = _int32(h1 + i * h2)
            if c < 0:
                c = ~c
            out.append(c % self.m)
        return tuple(out)

    def generate(self, s: str) -> BloomFilterData:
        return BloomFilterData(self.bit_positions(s), self.m)

    def is_valid(self, data: BloomFilterData | None) -> bool:
        return data is not None and data.bit_num == self.m and len(data.bit_pos) == self.k

    def empty(self) -> bytearray:
        return bytearray(self.byte_length)

    @staticmethod
    def hash_to(data: BloomFilterData, bits: bytearray) -> None:
        for p in data.bit_pos:
            bits[p >> 3] |= 1 << (p & 7)

    @staticmethod
    def is_hit(data: BloomFilterData, bits: bytes) -> bool:
        return all(bits[p >> 3] & (1 << (p & 7)) for p in data.bit_pos)
