"""ConsumeQueue: the per-(topic, queueId) index of the commitlog that consumers read by logical offset.

Files `consumequeue/{topic}/{queueId}/{20-digit byte offset}` of mappedFileSizeConsumeQueue bytes, each a
run of 20-byte units (codec.CQ_UNIT): commitlog offset (8), message size (4), tags code (8). Unit n sits
at byte n * 20 of the queue. A queue whose first message is not logical offset 0 (its head was cleaned
in a previous life) starts with filler units (offset 0, size 0x7fffffff, tags 0), as RocketMQ writes.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..format import codec
from ..files.mapped_file import MappedFile, MappedFileQueue

log = logging.getLogger(__name__)

UNIT = codec.CQ_STORE_UNIT_SIZE
_pack = codec.CQ_UNIT.pack
_CQ_NP = np.dtype(codec.CQ_DTYPE)


def _file_by_time(ranges: list[tuple[int, int]], min_index: int, timestamp: int,
                  unit: Callable[[int], tuple[int, int] | None], store_time: Callable[[int, int], int]) \
        -> tuple[int, int]:
    """The file (logical range) search_by_time searches: the one before the first whose first message is
    newer than timestamp (that one when equal), else the last."""
    for j, (fs, fe) in enumerate(ranges):
        first = max(min_index, fs)
        u = unit(first) if first < fe else None
        if u is None or u[1] <= 0 or u[1] == codec.CQ_BLANK_SIZE:
            continue
        t = store_time(u[0], u[1])
        if t >= timestamp:
            return ranges[max(0, j - 1)] if t > timestamp else (fs, fe)
    return ranges[-1]


def search_by_time(ranges: list[tuple[int, int]], min_index: int, timestamp: int,
                   unit: Callable[[int], tuple[int, int] | None], store_time: Callable[[int, int], int],
                   min_phy_offset: int) -> int | None:
    """RocketMQ's getOffsetInQueueByTime over a queue's files, as logical offsets.

    ranges: [first, end) logical offsets of each file, in order; min_index: the queue's min offset;
    unit(i): (commitlog offset, size) of unit i, or None; store_time(offset, size): the message's store
    time, or -1 if it cannot be read. A file is chosen by its first message's store time, then the
    seeds' binary search runs inside it (units whose message is below min_phy_offset count as older).
    Returns the logical offset closest to timestamp, -1 for "the queue's min offset", None when a
    message cannot be read (the caller answers 0, as RocketMQ does).
    """
    fs, fe = _file_by_time(ranges, min_index, timestamp, unit, store_time)
    low, high = max(min_index - fs, 0), fe - fs - 1
    target = left = right = -1
    left_v = right_v = -1
    while high >= low:
        mid = (low + high) // 2
        u = unit(fs + mid)
        if u is None:
            break
        o, s = u
        if o < min_phy_offset:
            low = mid + 1
            left = mid
            continue
        t = store_time(o, s)
        if t < 0:
            return None
        if t == timestamp:
            target = mid
            break
        if t > timestamp:
            high = mid - 1
            right, right_v = mid, t
        else:
            low = mid + 1
            left, left_v = mid, t
    if target != -1:
        off = target
    elif left_v == -1:
        off = right
    elif right_v == -1:
        off = left
    else:
        off = right if abs(timestamp - left_v) > abs(timestamp - right_v) else left
    return -1 if off < 0 else fs + off


class ConsumeQueue:
    def __init__(self, topic: str, queue_id: int, root: str | Path, mapped_file_size: int, read_only: bool = False):
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = mapped_file_size
        self.queue = MappedFileQueue(Path(root) / topic / str(queue_id), mapped_file_size, read_only=read_only)
        self.max_physic_offset = -1      # end (offset + size) of the last unit's message
        self.min_logic_offset = 0        # byte offset of the first valid unit
        self.lock = threading.Lock()
        # while a repair on the open store rebuilds this queue from the commitlog (recovery.repair_queues_live,
        # cleared by the dispatcher once it has passed what the commitlog held): the queue's max offset
        # before the cut, whose units are coming back (readers: max_offset_for_readers); else -1
        self.rebuilding_to = -1

    # --- loading and recovery -------------------------------------------------------------------
    def load(self, extend_short_first: bool = False) -> None:
        self.queue.load(extend_short_first)

    def cut(self, files_kept: int, end: int, max_physic_offset: int, min_logic_offset: int) -> None:
        """Apply recovery's plan for this queue (recovery.QueuePlan): keep its first files_kept files, cut
        at byte offset end (the bytes after it zeroed), and take the planned max physic and min offsets."""
        with self.lock:
            q = self.queue
            extra = q.files[files_kept:]
            if extra:
                q.files = q.files[:files_kept]
                for mf in extra:
                    log.info("recovery: %s removed", mf.path)
                    mf.destroy()
            q.truncate_to(end)
            self.max_physic_offset = max_physic_offset
            self.min_logic_offset = min_logic_offset

    def recover(self, max_commit_log_offset: int | None = None, first_file: int | None = None) -> int:
        """Keep units up to the last valid one (RocketMQ's recover, from the third-last file or first_file,
        plus checks: offsets must grow and point inside the commitlog). Returns how many units were dropped."""
        files = self.queue.files
        if not files:
            return 0
        idx = max(0, len(files) - 3) if first_file is None else min(first_file, len(files) - 1)
        process = files[idx].file_from_offset
        last_end = -1
        prev_off = -1
        dropped_reason = None
        while idx < len(files):
            mf = files[idx]
            # units up to the file's first hole: the rest reads as zeros (invalid) without faulting it in
            arr = np.frombuffer(mf.mm, dtype=_CQ_NP, count=mf.data_end() // UNIT)
            off, size = arr["offset"].astype(np.int64), arr["size"].astype(np.int64)
            valid = (off >= 0) & (size > 0)
            # First invalid unit ends the queue.
            bad = np.flatnonzero(~valid)
            n = int(bad[0]) if len(bad) else len(arr)
            # Filler units (offset 0, size MAX) may only come before the first real unit.
            real = (size[:n] != codec.CQ_BLANK_SIZE) | (off[:n] != 0)
            ro = off[:n][real]
            if len(ro):
                ends = ro + size[:n][real]
                order_bad = np.flatnonzero(np.diff(np.concatenate(([prev_off], ro))) <= 0)
                limit_bad = np.flatnonzero(ends > max_commit_log_offset) if max_commit_log_offset is not None \
                    else np.array([], dtype=np.int64)
                cut = min([int(x) for x in (order_bad[:1].tolist() + limit_bad[:1].tolist())] or [len(ro)])
                if cut < len(ro):
                    real_idx = np.flatnonzero(real)
                    n = int(real_idx[cut])
                    dropped_reason = ("units out of order" if order_bad[:1].tolist() == [cut]
                                      else "units pointing past the commitlog's end")
                    ro = ro[:cut]
                if len(ro):
                    prev_off = int(ro[-1])
                    last_end = int(ro[-1] + size[:n][real[:n]][len(ro) - 1])
            process = mf.file_from_offset + n * UNIT
            del arr
            if n * UNIT == mf.file_size and idx + 1 < len(files):
                idx += 1
                continue
            break
        dropped = self._count_units_from(process)
        self.queue.truncate_dirty_files(process)
        self.queue.set_positions_from(process)
        if last_end >= 0:
            self.max_physic_offset = last_end
        if dropped_reason:
            log.warning("%s: %s at byte %d; later units dropped and rebuilt from the commitlog",
                        self.queue.store_path, dropped_reason, process)
        self.min_logic_offset = self._first_real_unit_offset()
        return dropped

    def _count_units_from(self, offset: int) -> int:
        """Units holding any non-zero byte at or after byte offset (what a truncation there drops)."""
        n = 0
        for mf in self.queue.files:
            if mf.file_from_offset + mf.file_size <= offset:
                continue
            start = max(0, offset - mf.file_from_offset)
            end = mf.data_end()         # past the first hole: zeros, not read (MappedFile.data_end)
            if end <= start:
                continue
            whole = (end - start) // UNIT
            arr = np.frombuffer(mf.mm, dtype=np.uint8, count=whole * UNIT, offset=start).reshape(-1, UNIT)
            n += int(arr.any(axis=1).sum())
            del arr
            if (end - start) % UNIT and mf.has_data(start + whole * UNIT, end):
                n += 1
        return n

    def _first_real_unit_offset(self) -> int:
        first = self.queue.first
        if first is None:
            return 0
        arr = np.frombuffer(first.mm, dtype=_CQ_NP, count=first.read_position // UNIT)
        real = np.flatnonzero((arr["size"] != codec.CQ_BLANK_SIZE) | (arr["offset"] != 0))
        del arr
        return first.file_from_offset + (int(real[0]) * UNIT if len(real) else first.read_position)

    # --- writing --------------------------------------------------------------------------------
    def put_units(self, units: list[tuple[int, int, int, int]]) -> None:
        """Append (commitlog offset, size, tags code, queue offset) units in order; units already there are
        skipped, a gap is filled with filler units only at the queue's very first file."""
        with self.lock:
            i, n = 0, len(units)
            while i < n:
                off, size, tags, cq_offset = units[i]
                if off + size <= self.max_physic_offset:
                    i += 1
                    continue  # already built (re-dispatch after recovery)
                mf = self.queue.last
                expect = cq_offset * UNIT
                if mf is None or mf.is_full or mf.file_from_offset + mf.wrote_position != expect \
                        or (mf.first_create_in_queue and mf.wrote_position == 0):
                    self._put_one(off, size, tags, cq_offset)   # the careful path: new file, gap, filler
                    i += 1
                    continue
                # Fast path: a run of consecutive units that fits the current file, written at once.
                room = mf.free_space // UNIT
                j = i
                parts = []
                nxt = cq_offset
                while j < n and j - i < room:
                    u = units[j]
                    if u[3] != nxt:
                        break
                    parts.append(_pack(u[0], u[1], u[2]))
                    nxt += 1
                    j += 1
                mf.append(b"".join(parts))
                last = units[j - 1]
                self.max_physic_offset = last[0] + last[1]
                i = j

    def put_arrays(self, offs: np.ndarray, sizes: np.ndarray, tags: np.ndarray, qoffs: np.ndarray) -> None:
        """put_units for int64 columns: runs of consecutive units are written with one copy each."""
        n = len(offs)
        with self.lock:
            i = int(np.count_nonzero(offs + sizes <= self.max_physic_offset))   # already built: a prefix
            if i >= n:
                return
            # run ends: where the next unit's queue offset is not this one's + 1
            breaks = np.flatnonzero(np.diff(qoffs[i:]) != 1) + i + 1
            bi = 0
            while i < n:
                mf = self.queue.last
                expect = int(qoffs[i]) * UNIT
                if mf is None or mf.is_full or mf.file_from_offset + mf.wrote_position != expect \
                        or (mf.first_create_in_queue and mf.wrote_position == 0):
                    self._put_one(int(offs[i]), int(sizes[i]), int(tags[i]), int(qoffs[i]))
                    i += 1
                    continue
                while bi < len(breaks) and breaks[bi] <= i:
                    bi += 1
                j = min(n, i + mf.free_space // UNIT, int(breaks[bi]) if bi < len(breaks) else n)
                arr = np.empty(j - i, dtype=_CQ_NP)
                arr["offset"], arr["size"], arr["tags_code"] = offs[i:j], sizes[i:j], tags[i:j]
                mf.append(arr.tobytes())
                self.max_physic_offset = int(offs[j - 1]) + int(sizes[j - 1])
                i = j

    def _put_one(self, off: int, size: int, tags: int, cq_offset: int) -> None:
        expect = cq_offset * UNIT
        mf = self.queue.get_last_mapped_file(expect)
        if mf is None:
            raise OSError(self.queue.create_failure())
        if mf.first_create_in_queue and cq_offset != 0 and mf.wrote_position == 0:
            self.min_logic_offset = expect
            self.queue.flushed_where = self.queue.committed_where = expect
            fill = expect - mf.file_from_offset
            if fill:
                mf.write_at(0, _pack(0, codec.CQ_BLANK_SIZE, 0) * (fill // UNIT))
        current = mf.file_from_offset + mf.wrote_position
        if cq_offset != 0 and expect != current:
            if expect < current:
                return  # already built
            log.warning("%s: logic queue order maybe wrong: expected byte %d, queue is at %d (unit for "
                        "commitlog offset %d)", self.queue.store_path, expect, current, off)
        mf.append(_pack(off, size, tags))
        self.max_physic_offset = off + size

    def flush(self, least_pages: int = 0) -> bool:
        return self.queue.flush(least_pages)

    # --- reading --------------------------------------------------------------------------------
    def get_min_offset_in_queue(self) -> int:
        return self.min_logic_offset // UNIT

    def get_max_offset_in_queue(self) -> int:
        return self.queue.get_max_offset() // UNIT

    def get_message_total_in_queue(self) -> int:
        return self.get_max_offset_in_queue() - self.get_min_offset_in_queue()

    def max_offset_for_readers(self) -> tuple[int, int]:
        """(units written, max offset readers see): the two differ while a repair on the open store rebuilds
        the queue (rebuilding_to): the offsets between are messages coming back, not gone. rebuilding_to is
        read before and after the units: it is set before a cut and cleared after the rebuild, so one of
        the two reads sees it whenever the units read are cut."""
        before = self.rebuilding_to
        n = self.get_max_offset_in_queue()
        return n, max(n, before, self.rebuilding_to)

    def get_index_buffer(self, start_index: int) -> tuple[bytes, int] | None:
        """Units from start_index to the end of the file holding it: (raw bytes, byte offset)."""
        offset = start_index * UNIT
        if offset < self.min_logic_offset:
            return None
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        data = mf.read_from(pos)
        if len(data) % UNIT:            # a file cut inside a unit: its part is no unit
            data = data[:len(data) - len(data) % UNIT]
        return (data, offset) if data else None

    def get_unit(self, index: int) -> tuple[int, int, int] | None:
        offset = index * UNIT
        if offset < self.min_logic_offset:
            return None
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        raw = mf.read(offset - mf.file_from_offset, UNIT)
        return codec.CQ_UNIT.unpack(raw) if raw else None

    def units(self, start_index: int, end_index: int) -> np.ndarray:
        """Units [start, end) as a numpy structured array (offset, size, tags_code), in order."""
        parts = []
        i = max(start_index, self.get_min_offset_in_queue())
        end_index = min(end_index, self.get_max_offset_in_queue())
        while i < end_index:
            got = self.get_index_buffer(i)
            if got is None:
                break
            data, _ = got
            arr = np.frombuffer(data, dtype=_CQ_NP)[: end_index - i]
            if not len(arr):
                break
            parts.append(arr)
            i += len(arr)
        return np.concatenate(parts) if parts else np.empty(0, dtype=_CQ_NP)

    def roll_next_file(self, index: int) -> int:
        per = self.file_size // UNIT
        return index + per - index % per

    def get_last_offset(self) -> int:
        """Commitlog offset just past the last unit's message (-1 if empty)."""
        return self.max_physic_offset

    def get_offset_in_queue_by_time(self, timestamp: int, store_time_of: Callable[[int, int], int],
                                    min_phy_offset: int) -> int:
        """The logical offset whose message's store time is closest to timestamp (RocketMQ's binary search).

        Files are chosen by their first message's store time (RocketMQ uses file mtimes, which copies and
        backups change); inside the file the search is the seeds' own."""
        files = self.queue.files
        if not files:
            return 0
        ranges = [(mf.file_from_offset // UNIT, (mf.file_from_offset + mf.read_position) // UNIT) for mf in files]

        def unit(i):
            u = self.get_unit(i)
            return (u[0], u[1]) if u else None
        found = search_by_time(ranges, self.min_logic_offset // UNIT, timestamp, unit, store_time_of, min_phy_offset)
        if found is None:
            return 0
        return self.get_min_offset_in_queue() if found < 0 else found

    # --- maintenance ----------------------------------------------------------------------------
    def truncate_dirty_logic_files(self, phy_offset: int) -> None:
        """Remove units whose message starts at or after phy_offset (the commitlog was cut there), and what
        follows the last unit kept: zero units (a file a crash left unwritten) and trailing fillers."""
        with self.lock:
            for mf in reversed(list(self.queue.files)):
                first = mf is self.queue.first
                if mf.read_position == 0 and not first:
                    self.queue.delete_last_mapped_file()    # an empty last file: the units are before it
                    continue
                arr = np.frombuffer(mf.mm, dtype=_CQ_NP, count=mf.read_position // UNIT)
                real = (arr["size"] > 0) & ~((arr["size"] == codec.CQ_BLANK_SIZE) & (arr["offset"] == 0))
                keep = np.flatnonzero(real & (arr["offset"] < phy_offset))
                if len(keep) == 0 and not first:
                    del arr, real
                    self.queue.delete_last_mapped_file()    # nothing of it stays: zeros, fillers, units past
                    continue
                if len(keep) == 0 and real.any():           # the first file: every message past the end
                    del arr, real
                    self.queue.truncate_dirty_files(mf.file_from_offset)
                    self.max_physic_offset = -1
                    break
                if len(keep):
                    k = int(keep[-1])
                    n = k + 1
                    self.max_physic_offset = int(arr["offset"][k]) + int(arr["size"][k])
                else:                                       # the first file holds fillers (and zeros) only
                    nz = np.flatnonzero(arr["size"] != 0)
                    n = int(nz[-1]) + 1 if len(nz) else 0
                    self.max_physic_offset = -1
                del arr, real
                self.queue.truncate_dirty_files(mf.file_from_offset + n * UNIT)
                break
            else:
                self.max_physic_offset = -1

    def correct_min_offset(self, phy_min_offset: int) -> None:
        """Move the queue's min offset past units whose messages were deleted from the commitlog."""
        first = self.queue.first
        if first is None:
            return
        with self.lock:
            files = self.queue.files
            for mf in files:
                arr = np.frombuffer(mf.mm, dtype=_CQ_NP, count=mf.read_position // UNIT)
                ok = np.flatnonzero((arr["offset"] >= phy_min_offset) & (arr["size"] > 0)
                                    & (arr["size"] != codec.CQ_BLANK_SIZE))
                n = len(arr)
                del arr
                if len(ok):
                    new_min = mf.file_from_offset + int(ok[0]) * UNIT
                    if new_min > self.min_logic_offset:
                        self.min_logic_offset = new_min
                    return
                if mf is files[-1]:
                    self.min_logic_offset = max(self.min_logic_offset, mf.file_from_offset + n * UNIT)

    def delete_expired_files(self, phy_min_offset: int) -> int:
        """Delete files whose every unit points below the commitlog's min offset (never the last file)."""
        victims: list[MappedFile] = []
        files = self.queue.files
        for mf in files[:-1]:
            raw = mf.read(mf.file_size - UNIT, UNIT)
            if raw is None:
                break
            o, s, _ = codec.CQ_UNIT.unpack(raw)
            if o + s <= phy_min_offset or (s == codec.CQ_BLANK_SIZE and o == 0):
                victims.append(mf)
            else:
                break
        n = self.queue.delete_files(victims)
        self.correct_min_offset(phy_min_offset)
        return n

    def destroy(self) -> None:
        self.queue.destroy()
        self.max_physic_offset = -1
        self.min_logic_offset = 0

    def shutdown(self) -> None:
        self.queue.shutdown()


def _file_sizes(d: Path) -> list[tuple[Path, int]]:
    """(path, size) of the 20-digit-named files of a queue directory, in name order."""
    out = []
    try:
        names = sorted(os.listdir(d))
    except OSError:                 # not a directory: MappedFileQueue.load says nothing is there
        return out
    for n in names:
        if n.isdigit() and len(n) == 20 and (d / n).is_file():
            out.append((d / n, (d / n).stat().st_size))
    return out


def short_only_file(files: list[tuple[Path | str, int]], file_size: int) -> tuple[Path | str, int] | None:
    """The queue's first file when it is its only file with data and is shorter than file_size (not empty):
    the one short file MappedFileQueue.load cannot judge alone. Pure: sizes only."""
    with_data = [i for i, (_, n) in enumerate(files) if n > 0]
    if with_data != [0]:
        return None
    p, n = files[0]
    return (p, n) if n < file_size else None


class ConsumeQueueTable:
    """All consume queues of a store, by topic and queue id (RocketMQ's consumeQueueTable)."""

    def __init__(self, store_dir: str | Path, mapped_file_size: int, read_only: bool = False):
        self.root = Path(store_dir) / "consumequeue"
        self.file_size = mapped_file_size
        self.read_only = read_only
        self.table: dict[str, dict[int, ConsumeQueue]] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Map every queue's files. A queue whose only file with data was cut short (#7355-style: a crash
        between creating and sizing it, a cut copy) is extended with zeros when another queue's file has
        the configured size (the geometry is then not in doubt); recovery rebuilds what it lost. Other
        short files are refused by MappedFileQueue.load, naming the file."""
        if not self.root.is_dir():
            return
        dirs = []
        for topic in sorted(os.listdir(self.root)):
            tdir = self.root / topic
            if not tdir.is_dir():
                continue
            for q in sorted(os.listdir(tdir)):
                if not q.isdigit():
                    log.warning("%s: not a queue id, ignored", tdir / q)
                    continue
                dirs.append((topic, int(q), tdir / q))
        sizes = {d: _file_sizes(d) for _, _, d in dirs}
        confirmed = any(size == self.file_size for fs in sizes.values() for _, size in fs)
        for topic, q, d in dirs:
            cut = short_only_file(sizes[d], self.file_size) if confirmed else None
            if cut is not None and not self.read_only:
                log.warning("%s: %d bytes instead of %d (cut short: other queues' files have the configured size): "
                            "extended with zeros, what it lost is rebuilt from the commitlog", cut[0], cut[1],
                            self.file_size)
                os.truncate(cut[0], self.file_size)
            cq = ConsumeQueue(topic, q, self.root, self.file_size, self.read_only)
            cq.load(extend_short_first=cut is not None)
            if cut is not None and not cq.queue.repaired:
                cq.queue.repaired.append((str(cut[0]), cut[1]))
            self.table.setdefault(topic, {})[q] = cq

    def remove(self, cq: ConsumeQueue) -> bool:
        """Forget cq (its files stay: cq.destroy() removes them); False if the table holds another queue
        under its name, or none."""
        with self._lock:
            queues = self.table.get(cq.topic)
            if queues is None or queues.get(cq.queue_id) is not cq:
                return False
            del queues[cq.queue_id]
            if not queues:
                del self.table[cq.topic]
            return True

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        m = self.table.get(topic)
        return m.get(queue_id) if m else None

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        m = self.table.get(topic)
        cq = m.get(queue_id) if m else None
        if cq is None:
            with self._lock:
                m = self.table.setdefault(topic, {})
                cq = m.get(queue_id)
                if cq is None:
                    cq = ConsumeQueue(topic, queue_id, self.root, self.file_size, self.read_only)
                    m[queue_id] = cq
        return cq

    def __iter__(self) -> Iterator[ConsumeQueue]:
        for m in list(self.table.values()):
            yield from list(m.values())

    def sorted_queues(self) -> list[ConsumeQueue]:
        return [self.table[t][q] for t in sorted(self.table) for q in sorted(self.table[t])]

    def topic_queue_offsets(self) -> dict[str, int]:
        """"topic-queueId" -> next queue offset, from the queues' max offsets."""
        return {f"{cq.topic}-{cq.queue_id}": cq.get_max_offset_in_queue() for cq in self}

    def max_physic_offset(self) -> int:
        return max((cq.max_physic_offset for cq in self), default=-1)

    def min_max_physic_offset(self) -> int | None:
        vals = [cq.max_physic_offset for cq in self if cq.max_physic_offset >= 0]
        return min(vals) if vals else None

    def flush(self, least_pages: int = 0) -> None:
        for cq in self:
            cq.flush(least_pages)

    def shutdown(self) -> None:
        for cq in self:
            cq.shutdown()

    def destroy(self) -> None:
        for cq in self:
            cq.destroy()
        self.table.clear()
