"""The hash table inside an index file: the layout constants of its slots and entries, the write path
(RocketMQ's IndexFile.putKey, batched) and the walk along a slot's chain (selectPhyOffset).

One file is a 40-byte header (codec.INDEX_HEADER), maxHashSlotNum 4-byte slots (codec.INDEX_SLOT: the newest
entry of the keys hashed there, 0 for none), then maxIndexNum 20-byte entries (codec.INDEX_ENTRY: key hash,
commitlog offset, seconds since the file's begin timestamp, the previous entry of the same slot), big-endian:
format/codec.py."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..format import codec

HEADER_SIZE = codec.INDEX_HEADER_SIZE          # 40
SLOT_SIZE = codec.INDEX_HASH_SLOT_SIZE          # 4
ENTRY_SIZE = codec.INDEX_ENTRY_SIZE             # 20
INVALID_INDEX = codec.INDEX_INVALID             # 0
INT_MAX = 0x7FFFFFFF
_slot_pack = codec.INDEX_SLOT.pack_into
_slot_unpack = codec.INDEX_SLOT.unpack_from
_entry_struct_pack = codec.INDEX_ENTRY.pack
_entry_unpack = codec.INDEX_ENTRY.unpack_from
ENTRY_DTYPE = np.dtype(codec.INDEX_ENTRY_DTYPE)


class IndexEntries:
    """Mixed into IndexFile (index_file.py): its entries and hash slots. Uses the file's mapping, header
    counts and write limit; the file itself (open, header, checks, flush, close) stays in IndexFile."""

    def put_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """put_key with the key's hash already computed (0 <= key_hash <= INT_MAX)."""
        return self.put_hash_list((key_hash,), (phy_offset,), (store_timestamp,)) == 1

    def put_hash_list(self, hashes: Sequence[int], phy_offsets: Sequence[int], timestamps: Sequence[int],
                      lo: int = 0) -> int:
        """put_hash of keys lo.. (Python ints: a few keys, where put_hashes' numpy costs more than it saves),
        in order, while there is room; returns the index of the first key not put. The entries go into the
        file in one pwrite, then the slots (a slot never names an entry not written yet), then the counts
        (which publish the entries)."""
        count = c0 = self.index_count
        hi = min(len(hashes), lo + self._write_limit - c0)
        if hi <= lo:
            return lo
        mm, nslots = self._mm, self.hash_slot_num
        begin, begin_phy, new_slots = self.begin_timestamp, self.begin_phy_offset, 0
        newest: dict[int, int] = {}         # slot position -> the newest entry of this call in that slot
        entries = []
        for i in range(lo, hi):
            key_hash, ts = hashes[i], timestamps[i]
            slot_pos = HEADER_SIZE + (key_hash % nslots) * SLOT_SIZE
            slot_value = newest.get(slot_pos)
            if slot_value is None:
                slot_value = _slot_unpack(mm, slot_pos)[0]
                if slot_value <= INVALID_INDEX or slot_value > count:
                    if slot_value != INVALID_INDEX:
                        self._warn(("put-slot", slot_pos), "slot at byte %d holds %d (indexCount %d): treated "
                                   "as empty", slot_pos, slot_value, count)
                    slot_value = INVALID_INDEX
                    new_slots += 1
            if count <= 1:                  # the first entry: its time is the beginTimestamp (FIRST_ENTRY)
                time_diff = 0
                begin, begin_phy = ts, phy_offsets[i]
            elif begin <= 0:
                time_diff = 0
            else:
                time_diff = (ts - begin) // 1000
                if time_diff < 0:
                    time_diff = 0
                elif time_diff > INT_MAX:
                    time_diff = INT_MAX
            entries.append(_entry_struct_pack(key_hash, phy_offsets[i], time_diff, slot_value))
            newest[slot_pos] = count
            count += 1
        # nothing of this file changes before the entries are written (a full disk: an OSError here)
        self.mapped_file.pwrite(self.entries_base + c0 * ENTRY_SIZE, b"".join(entries))
        for slot_pos, entry in newest.items():
            _slot_pack(mm, slot_pos, entry)
        self.hash_slot_count += new_slots
        self.begin_timestamp, self.begin_phy_offset = begin, begin_phy
        self.end_phy_offset = phy_offsets[hi - 1]
        self.end_timestamp = timestamps[hi - 1]
        self.index_count = count
        self._dirty = True
        return hi

    def put_hashes(self, hashes: np.ndarray, phy_offsets: np.ndarray, timestamps: np.ndarray,
                   lo: int = 0, hi: int | None = None) -> int:
        """Put keys lo..hi-1 (int64 arrays of key hashes, offsets, store timestamps) while there is room,
        with exactly put_hash's result; returns the index of the first key not put (hi when all were).

        One function on purpose (a measured hot path: the key index of the e2e and put + dispatch rows of
        BENCHMARKS.md): slots, entries and chains of a whole batch are computed with numpy in one place."""
        if hi is None:
            hi = len(hashes)
        c0 = self.index_count
        n = min(hi - lo, self._write_limit - c0)
        if n <= 0:
            return lo
        h = hashes[lo:lo + n]
        phy = phy_offsets[lo:lo + n]
        ts = timestamps[lo:lo + n]
        mm = self._mm
        e = np.arange(c0, c0 + n, dtype=np.int64)                   # entry numbers
        slots = h % self.hash_slot_num
        order = np.argsort(slots, kind="stable")                    # same slot: in put order
        ss = slots[order]
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(ss[1:], ss[:-1], out=first[1:])
        last = np.empty(n, dtype=bool)
        last[-1] = True
        last[:-1] = first[1:]
        # preIndexNo: the previous entry of the batch in the same slot, or the slot's value on file,
        # which RocketMQ drops when it is <= 0 or > the indexCount at that put (c0 + position).
        prev_sorted = np.empty(n, dtype=np.int64)
        prev_sorted[1:] = e[order[:-1]]
        slot_view = np.frombuffer(mm, dtype=">i4", count=self.hash_slot_num, offset=HEADER_SIZE)
        fpos = order[first]
        fslots = ss[first]
        old = slot_view[fslots].astype(np.int64)
        bad = (old <= 0) | (old > c0 + fpos)
        if bad.any():
            garbage = np.flatnonzero(bad & (old != 0))
            if len(garbage):
                g = int(garbage[0])
                self._warn(("put-slot", HEADER_SIZE + int(fslots[g]) * SLOT_SIZE),
                           "%d slots hold values outside [1, indexCount] (slot %d = %d): treated as empty",
                           len(garbage), int(fslots[g]), int(old[g]))
            old[bad] = 0
        prev_sorted[first] = old
        prev = np.empty(n, dtype=np.int64)
        prev[order] = prev_sorted
        new_slot_count = int(bad.sum())
        # timeDiff, relative to the beginTimestamp of the moment: a first put replaces it.
        begin = self.begin_timestamp
        td = np.empty(n, dtype=np.int64)
        k = 0
        if c0 <= 1:
            td[0] = 0                           # the first entry: see FIRST_ENTRY
            begin = int(ts[0])
            k = 1
        if n > k:
            if begin <= 0:
                td[k:] = 0
            else:
                np.clip((ts[k:] - begin) // 1000, 0, INT_MAX, out=td[k:])
        rec = np.empty(n, dtype=ENTRY_DTYPE)
        rec["key_hash"] = h
        rec["phy_offset"] = phy
        rec["time_diff"] = td
        rec["prev"] = prev
        base = self.entries_base + c0 * ENTRY_SIZE
        self.mapped_file.pwrite(base, rec.tobytes())                # entries before the slots
        slot_view[ss[last]] = e[order[last]]
        del slot_view
        if c0 <= 1:
            self.begin_phy_offset = int(phy[0])
            self.begin_timestamp = begin
        self.hash_slot_count += new_slot_count
        self.end_phy_offset = int(phy[-1])
        self.end_timestamp = int(ts[-1])
        self.index_count = c0 + n                                    # last: publishes the entries
        self._dirty = True
        return lo + n

    def select_by_hash(self, key_hash: int, max_num: int, begin: int, end: int, out: list[int]) -> None:
        if self._closed or len(out) >= max_num:
            return
        count = self.index_count
        try:
            mm = self._mm
            slot_pos = HEADER_SIZE + (key_hash % self.hash_slot_num) * SLOT_SIZE
            cur = _slot_unpack(mm, slot_pos)[0] if self._pread_fd is None else self._read_slot(mm, slot_pos)
            if cur <= INVALID_INDEX or cur > count or count <= 1 or cur >= self.index_num:
                if cur < 0 or cur >= self.index_num:
                    self._warn(("slot", slot_pos), "slot at byte %d holds %d, outside [0, %d]: no result",
                               slot_pos, cur, self.index_num)
                return
            begin_ts = self.begin_timestamp
            base = self.entries_base
            append = out.append
            steps = 0
            while True:
                if len(out) >= max_num:
                    break
                h, phy, td, prev = _entry_unpack(mm, base + cur * ENTRY_SIZE)
                if td < 0:
                    self._warn(("td", cur), "entry %d has a negative timeDiff %d: chain ends here", cur, td)
                    break
                time_read = begin_ts + td * 1000 if cur != 1 else begin_ts     # FIRST_ENTRY
                if h == key_hash and begin <= time_read <= end:
                    if phy < 0:
                        self._warn(("phy", cur), "entry %d has a negative phyOffset %d: skipped", cur, phy)
                    else:
                        append(phy)
                if prev <= INVALID_INDEX or time_read < begin:
                    if prev < 0:
                        self._warn(("prev", cur), "entry %d has a negative preIndexNo %d: chain ends here",
                                   cur, prev)
                    break
                if prev >= cur or prev > count:
                    # RocketMQ would follow it (a cycle such as 5 -> 3 -> 5 loops forever there).
                    self._warn(("prev", cur), "entry %d points back to entry %d (indexCount %d): a cycle or "
                               "garbage, chain ends here", cur, prev, count)
                    break
                steps += 1
                if steps >= count:   # unreachable while entry numbers strictly decrease; a last guard
                    self._warn(("steps", slot_pos), "chain of slot at byte %d longer than indexCount %d",
                               slot_pos, count)
                    break
                cur = prev
        except (ValueError, TypeError, OSError):  # mapping (or pread fd) closed under us: file deleted
            if not self._closed:
                raise
            return
