"""resync.next_valid_record against a reference: the record boundaries a real store wrote.

Seeded random damage (bit flips, zeroed ranges, random bytes) inside one record or across several: the
resynchronisation must land exactly on the first intact record whose successors are intact too, never
inside a record, and answer None when nothing valid follows (a torn tail).
"""
from __future__ import annotations

import bisect
import random

import pytest

from rmqstore.store.format import codec, resync, scanner
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import Message
from rmqstore.store.store import MessageStore

SEED = random.randrange(1 << 30)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(commitlog bytes of one file, record start positions, end of the data) from a real store."""
    path = tmp_path_factory.mktemp("scan") / "store"
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, max_hash_slot_num=1024, max_index_num=4096)
    rnd = random.Random(7)
    with MessageStore.open(path, cfg, start_services=False) as s:
        starts, sizes = [], []
        for i in range(600):
            body = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 300)))
            if i % 50 == 7:     # bodies holding a copy of a whole record: resync must not stop inside them
                body = bytes(s.commit_log.get_message(starts[-1], sizes[-1])) + body
            r = s.put_message(Message(f"T{i % 4}", body, properties={"KEYS": f"k{i}"}, queue_id=i % 2))
            starts.append(r.append_result.wrote_offset)
            sizes.append(r.append_result.wrote_bytes)
        end = s.get_max_phy_offset()
    data = (path / "commitlog" / f"{0:020d}").read_bytes()
    return data, starts, end


def _damage(rnd: random.Random, buf: bytearray, lo: int, hi: int) -> None:
    kind = rnd.choice(["flip", "zero", "noise"])
    if kind == "flip":
        p = rnd.randrange(lo, hi)
        buf[p] ^= 1 << rnd.randrange(8)
    else:
        a = rnd.randrange(lo, hi)
        b = rnd.randrange(a + 1, hi + 1)
        buf[a:b] = bytes(b - a) if kind == "zero" else bytes(rnd.randrange(256) for _ in range(b - a))


def test_next_valid_record_matches_the_written_boundaries(written):
    data, starts, end = written
    rnd = random.Random(SEED)
    print(f"seed {SEED}")
    bounds = starts + [end]
    for trial in range(300):
        buf = bytearray(data)
        i = rnd.randrange(0, len(starts) - 6)
        j = i + rnd.choice([0, 0, 0, 1, 3])         # damage spans records i..j
        _damage(rnd, buf, starts[i], bounds[j + 1])
        base = rnd.choice([None, 0])
        got = resync.next_valid_record(buf, starts[i], end, base=base)
        # the reference: the first boundary after i whose record and the next two check (CRC included), or
        # fewer followed by a zero header (what the end of the written data looks like)
        expect = next((starts[k] for k in range(i + 1, len(starts)) if _chains(buf, data, bounds, k, base)), None)
        if base is None and got is not None and got != expect and got not in starts:
            # without base (no production caller omits it) a record copied into a body is a record like any other:
            # only where such a copy was written may it come first (seen: a copy whose properties' end and what
            # followed were zeroed, which reads as a record and then the end of the data)
            k = bisect.bisect_right(starts, got) - 1
            copy = data[starts[k - 1]:starts[k]]
            assert k % 50 == 7 and data[got:got + len(copy)] == copy and (expect is None or got < expect), \
                (f"seed {SEED} trial {trial}", i, j, got, expect)
            continue
        assert got == expect, (f"seed {SEED} trial {trial}", i, j, got, expect)


def _chains(buf, data, bounds, k: int, base) -> bool:
    for m in range(k, min(k + 3, len(bounds) - 1)):
        if m > k and bytes(buf[bounds[m]:bounds[m] + 8]) == bytes(8):
            return True
        if not _intact(buf, data, bounds[m], bounds[m + 1], base):
            return False
    return True


def _intact(buf, data, a: int, b: int, base=None) -> bool:
    if bytes(buf[a:b]) == data[a:b]:
        return True
    if base is not None and int.from_bytes(buf[a + 28:a + 36], "big") != base + a:
        return False        # PHYSICALOFFSET must name the record's own position
    try:
        return scanner.check_record(buf, a, len(buf), True) == (scanner.Outcome.MESSAGE, b - a)
    except codec.RecordError:
        return False


def test_torn_tail_has_no_next_record(written):
    data, starts, end = written
    buf = bytearray(data)
    buf[starts[-2] + 30:end] = bytes(end - starts[-2] - 30)
    assert resync.next_valid_record(buf, starts[-2], len(buf)) is None
    buf = bytearray(data)
    buf[starts[-1] + 9] ^= 0x10       # the last record damaged: nothing valid after it
    assert resync.next_valid_record(buf, starts[-1], end) is None


def test_chain_and_end_of_data(written):
    data, starts, end = written
    # the last record followed by the end of the data chains (nothing after it to contradict it)
    assert resync.chains_from(data, starts[-1], end)
    assert resync.next_valid_record(data, starts[-2], end) == starts[-1]
    # a record carrying another offset than where it lies is rejected when base is given
    assert resync.chains_from(data, starts[5], end, base=0)
    assert not resync.chains_from(data, starts[5], end, base=1)
    # an END_OF_FILE blank reaching the end of the buffer is a valid resync point
    blank = bytearray(data[:end]) + codec.encode_blank(64) + bytes(56)
    blank[starts[-1] + 4] ^= 0xFF
    assert resync.next_valid_record(blank, starts[-1], len(blank)) == end
