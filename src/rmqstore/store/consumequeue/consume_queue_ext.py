"""The consume queue extension: RocketMQ 4.4.0's ConsumeQueueExt files, byte for byte.

With `enableConsumeQueueExt=true` every consume queue unit's 8-byte tags code field holds an address into
`STORE/consumequeue_ext/TOPIC/QUEUE/`, whose files (`mappedFileSizeConsumeQueueExt` bytes, 48 MiB by
default, named by their first offset like every mapped file) hold one variable-size unit per message:

    size        short   20 + bit map length
    tagsCode    long    the tags code the consume queue unit would have held
    storeTime   long    the message's store timestamp
    bitMapSize  short   bit map length in bytes (0: none)
    bitMap      bytes   the message's filter bit map (filter/bloom.py), when the broker computes them

big-endian, packed one after another. A unit never straddles files: when the next one does not fit with 4
bytes to spare, a short -1 marks the end of the file's data and the unit goes to the next file. A unit's
address is Long.MIN_VALUE + its offset in the files; any tags code <= Integer.MIN_VALUE - 1 is an address
(a tags code is an int, a delay queue's delivery time is positive). Readers take the real tags code from
the ext unit; a unit whose address cannot be read is treated as having no tags code (RocketMQ logs it).

Opening finds each file's end by walking its units (RocketMQ's recover) and drops what no consume queue
unit points at any more past the last address in use; the files before the first address still in use
are deleted as the consume queue's old files are.
"""
from __future__ import annotations

import dataclasses
import logging
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..format import codec, scanner
from ..files.mapped_file import MappedFileQueue

log = logging.getLogger(__name__)

EXT_DIR = "consumequeue_ext"
MIN_EXT_UNIT_SIZE = 20
END_BLANK_DATA_LENGTH = 4
MAX_ADDR = -(1 << 31) - 1           # Integer.MIN_VALUE - 1: a tags code at or below it is an address
LONG_MIN = -(1 << 63)
_HEAD = struct.Struct(">hqqh")
_HEAD_NP = np.dtype([("size", ">i2"), ("tags", ">i8"), ("time", ">i8"), ("bm_len", ">i2")])
_HEAD_IDX = np.arange(_HEAD.size)
_END_MARK = struct.pack(">h", -1)

BitMapCalculator = Callable[[str, list], "list[bytes] | None"]   # (topic, properties of each message)


def is_ext_addr(v: int) -> bool:
    return v <= MAX_ADDR


def decorate(offset: int) -> int:
    return offset + LONG_MIN


def undecorate(address: int) -> int:
    return address - LONG_MIN


@dataclass(frozen=True, slots=True)
class CqExtUnit:
    tags_code: int
    store_time: int
    bit_map: bytes | None = None

    @property
    def size(self) -> int:
        return MIN_EXT_UNIT_SIZE + len(self.bit_map or b"")

    def encode(self) -> bytes:
        bm = self.bit_map or b""
        return _HEAD.pack(MIN_EXT_UNIT_SIZE + len(bm), self.tags_code, self.store_time, len(bm)) + bm

    @classmethod
    def decode(cls, buf, pos: int = 0) -> "CqExtUnit | None":
        if pos + _HEAD.size > len(buf):
            return None
        size, tags, store_time, bm_len = _HEAD.unpack_from(buf, pos)
        if size < 1 or bm_len < 0 or size != MIN_EXT_UNIT_SIZE + bm_len or pos + size > len(buf):
            return None
        return cls(tags, store_time, bytes(buf[pos + _HEAD.size:pos + size]) if bm_len else None)


@dataclass
class ExtColumns:
    """Ext units read for many consume queue units: ok (readable), tags codes, store times, and the bit maps
    (a row per unit, None when no unit has one) with has_bit_map telling which rows hold one."""
    ok: np.ndarray
    tags: np.ndarray
    store_times: np.ndarray
    bit_maps: np.ndarray | None
    has_bit_map: np.ndarray


class ConsumeQueueExt:
    """The extension files of one consume queue."""

    def __init__(self, root: Path, topic: str, queue_id: int, file_size: int):
        self.topic, self.queue_id = topic, queue_id
        self.file_size = file_size
        self.queue = MappedFileQueue(root / EXT_DIR / topic / str(queue_id), file_size)
        self.lock = threading.Lock()

    def load_and_recover(self) -> None:
        """Map the files and find where their units end: walk each file's units up to a size <= 0 (the end
        mark of a full file, or the zeros after the last unit); the end is where the last file's walk stops."""
        q = self.queue
        q.load()
        if not q.files:
            return
        end = 0
        for mf in q.files:
            pos, limit, mm = 0, min(mf.data_end(), self.file_size), mf.mm
            while pos + 2 <= limit:
                size = struct.unpack_from(">h", mm, pos)[0]
                if size <= 0:
                    break
                if size < MIN_EXT_UNIT_SIZE or pos + size > self.file_size - END_BLANK_DATA_LENGTH:
                    log.warning("%s: the unit at %d claims %d bytes: the file's units end there", mf.path, pos, size)
                    break
                pos += size
            end = mf.file_from_offset + pos
        q.truncate_to(end)

    def put(self, units: list[CqExtUnit]) -> list[int] | None:
        """Append units; their addresses, or None when a file cannot be created (the caller keeps the plain
        tags codes, as RocketMQ does when an ext put fails)."""
        return self.put_encoded([u.encode() for u in units])

    def put_encoded(self, units: list[bytes]) -> list[int] | None:
        """put() of units already encoded (encode_units)."""
        out: list[int] = []
        with self.lock:
            q = self.queue
            i = 0
            while i < len(units):
                mf = q.get_last_mapped_file(0)
                if mf is None:
                    log.error("%s: cannot create an extension file: %s", q.store_path, q.create_failure())
                    return None
                room = self.file_size - mf.wrote_position - END_BLANK_DATA_LENGTH
                parts, addrs, used = [], [], 0
                while i < len(units):
                    b = units[i]
                    if used + len(b) > room:
                        break
                    addrs.append(decorate(mf.file_from_offset + mf.wrote_position + used))
                    parts.append(b)
                    used += len(b)
                    i += 1
                if parts:
                    mf.append(b"".join(parts))
                    out.extend(addrs)
                if i < len(units):      # the next unit does not fit: mark the file's end, go on in a new one
                    mf.write_at(mf.wrote_position, _END_MARK)
                    mf.wrote_position = self.file_size
        return out

    def get(self, address: int) -> CqExtUnit | None:
        if not is_ext_addr(address):
            return None
        real = undecorate(address)
        mf = self.queue.find_mapped_file_by_offset(real)
        if mf is None:
            return None
        pos = real - mf.file_from_offset
        head = mf.read(pos, _HEAD.size)
        if head is None:
            return None
        bm_len = struct.unpack_from(">h", head, 18)[0]
        raw = head if bm_len <= 0 else mf.read(pos, _HEAD.size + bm_len)
        return CqExtUnit.decode(raw) if raw is not None else None

    def read_columns(self, addresses: np.ndarray) -> "ExtColumns":
        """The units at many addresses at once (numpy gathers from the mapped files): the read path's batch."""
        n = len(addresses)
        real = (addresses.astype(np.int64).view(np.uint64) + np.uint64(1 << 63)).view(np.int64)
        ok = np.zeros(n, dtype=bool)
        tags, times, bm_len = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
        where: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []      # (rows, positions, file bytes)
        for mf in list(self.queue.files):
            sel = np.flatnonzero((real >= mf.file_from_offset) & (real < mf.file_from_offset + self.file_size))
            if not len(sel):
                continue
            limit = mf.read_position
            pos = real[sel] - mf.file_from_offset
            sel, pos = sel[pos + _HEAD.size <= limit], pos[pos + _HEAD.size <= limit]
            try:
                buf = np.frombuffer(mf.mm, dtype=np.uint8)
            except ValueError:      # unmapped under us (the file was deleted)
                continue
            h = np.ascontiguousarray(buf[pos[:, None] + _HEAD_IDX]).view(_HEAD_NP).ravel()
            good = (h["bm_len"] >= 0) & (h["size"] == MIN_EXT_UNIT_SIZE + h["bm_len"]) & (pos + h["size"] <= limit)
            rows = sel[good]
            ok[rows], tags[rows], times[rows], bm_len[rows] = True, h["tags"][good], h["time"][good], h["bm_len"][good]
            where.append((rows, pos[good], buf))
        width = int(bm_len.max()) if n else 0
        maps = None
        if width:
            maps = np.zeros((n, width), dtype=np.uint8)
            for rows, pos, buf in where:
                full = bm_len[rows] == width        # (units with another length keep no bit map: read)
                maps[rows[full]] = buf[(pos[full] + MIN_EXT_UNIT_SIZE)[:, None] + np.arange(width)]
        return ExtColumns(ok, tags, times, maps, (bm_len == width) & ok if width else np.zeros(n, dtype=bool))

    def truncate_by_max_address(self, address: int) -> None:
        """Forget units after the one at address (the last a consume queue unit points at)."""
        unit = self.get(address)
        if unit is not None:
            self.queue.truncate_to(undecorate(address) + unit.size)

    def delete_below(self, address: int) -> int:
        """Delete the files wholly before the unit at address (the first one still in use)."""
        real = undecorate(address)
        victims = [mf for mf in self.queue.files[:-1] if mf.file_from_offset + self.file_size <= real]
        return self.queue.delete_files(victims)

    def flush(self) -> None:
        self.queue.flush()

    def shutdown(self) -> None:
        self.queue.shutdown()


class ConsumeQueueExtTable:
    """The extension of every consume queue of a store; the dispatcher's writer (`decorate`), the readers'
    lookups (`tags_code_and_unit`)."""

    def __init__(self, store_path: str | Path, config, commit_log):
        self.root = Path(store_path)
        self.file_size = config.mapped_file_size_consume_queue_ext
        self.enabled = config.enable_consume_queue_ext
        self.commit_log = commit_log
        self.table: dict[tuple[str, int], ConsumeQueueExt] = {}
        self.bit_map_calculator: BitMapCalculator | None = None    # the broker's (enableCalcFilterBitMap)
        self._lock = threading.Lock()

    # --- open -------------------------------------------------------------------------------------
    def load(self, consume_queues) -> None:
        """Load every queue's extension files and cut each after the last address its consume queue holds."""
        base = self.root / EXT_DIR
        if not base.is_dir():
            return
        for tdir in sorted(p for p in base.iterdir() if p.is_dir()):
            for qdir in sorted(p for p in tdir.iterdir() if p.is_dir() and p.name.isdigit()):
                ext = ConsumeQueueExt(self.root, tdir.name, int(qdir.name), self.file_size)
                ext.load_and_recover()
                self.table[(tdir.name, int(qdir.name))] = ext
                cq = consume_queues.find(tdir.name, int(qdir.name))
                last = _last_address(cq)
                if last is not None:
                    ext.truncate_by_max_address(last)

    def find(self, topic: str, queue_id: int) -> ConsumeQueueExt | None:
        return self.table.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueueExt:
        ext = self.table.get((topic, queue_id))
        if ext is None:
            with self._lock:
                ext = self.table.get((topic, queue_id))
                if ext is None:
                    ext = self.table[(topic, queue_id)] = ConsumeQueueExt(self.root, topic, queue_id, self.file_size)
        return ext

    # --- read ---------------------------------------------------------------------------------------
    def unit(self, topic: str, queue_id: int, address: int) -> CqExtUnit | None:
        ext = self.table.get((topic, queue_id))
        return ext.get(address) if ext is not None else None

    def resolve(self, topic: str, queue_id: int, units: bytes, message_filter) -> tuple[list, list] | None:
        """For a run of consume queue units (the read path's buffer): each unit's real tags code (None when
        its ext unit cannot be read) and whether the filter's bit map test rules it out, or None when no
        unit holds an ext address. The filter's optional `cq_ext_mask(store_times, bit_maps, has_bit_map)`
        answers, for all units at once, which must still be read."""
        codes = np.frombuffer(units, dtype=codec.CQ_DTYPE)["tags_code"].astype(np.int64)
        is_ext = codes <= MAX_ADDR
        if not is_ext.any():
            return None
        tags: list = codes.tolist()
        skip = [False] * len(codes)
        ext = self.table.get((topic, queue_id))
        rows = np.flatnonzero(is_ext)
        if ext is None:
            for r in rows.tolist():
                tags[r] = None
            return tags, skip
        cols = ext.read_columns(codes[rows])
        for r, ok, t in zip(rows.tolist(), cols.ok.tolist(), cols.tags.tolist()):
            tags[r] = t if ok else None
        mask_of = getattr(message_filter, "cq_ext_mask", None)
        if mask_of is not None and cols.bit_maps is not None:
            read = mask_of(cols.store_times, cols.bit_maps, cols.has_bit_map)
            for r in rows[~read].tolist():
                skip[r] = True
        return tags, skip

    # --- write (the dispatcher) -------------------------------------------------------------------------
    def decorate(self, batch, consume_queues):
        """The batch (DispatchBatch or DispatchRequests) with each new consume queue unit's tags code replaced
        by the address of an ext unit holding it, its store time and its bit map."""
        if isinstance(batch, list):
            return self._decorate_requests(batch, consume_queues)
        idx = np.flatnonzero(scanner.is_dispatched(batch.sys_flags))
        if not len(idx):
            return batch
        tags = batch.tags_codes.copy()
        keys = batch.topic_ids[idx] * (1 << 32) + (batch.queue_ids[idx] & 0xFFFFFFFF)
        order = np.argsort(keys, kind="stable")
        for part in np.split(idx[order], np.flatnonzero(np.diff(keys[order])) + 1):
            topic, qid = batch.topic_names[int(batch.topic_ids[part[0]])], int(batch.queue_ids[part[0]])
            cq = consume_queues.find(topic, qid)
            if cq is not None:
                part = part[batch.offsets[part] + batch.sizes[part] > cq.max_physic_offset]   # not built yet
            if not len(part):
                continue
            offs, sizes = batch.offsets[part].tolist(), batch.sizes[part].tolist()
            maps = self._bit_maps(topic, lambda: self._properties(offs, sizes))
            addrs = self.find_or_create(topic, qid).put_encoded(
                encode_units(tags[part].tolist(), batch.store_timestamps[part].tolist(), maps))
            if addrs is not None:
                tags[part] = addrs
        out = codec.DispatchBatch.__new__(codec.DispatchBatch)
        for f in codec.DispatchBatch.__slots__:
            setattr(out, f, getattr(batch, f))
        out.tags_codes = tags
        return out

    def _decorate_requests(self, reqs: list, consume_queues) -> list:
        by_queue: dict[tuple[str, int], list[int]] = {}
        for i, r in enumerate(reqs):
            if scanner.is_dispatched(r.sys_flag):
                by_queue.setdefault((r.topic, r.queue_id), []).append(i)
        out = list(reqs)
        for (topic, qid), ids in by_queue.items():
            cq = consume_queues.find(topic, qid)
            if cq is not None:
                ids = [i for i in ids if reqs[i].commit_log_offset + reqs[i].msg_size > cq.max_physic_offset]
            if not ids:
                continue
            # (a DispatchRequest carries only the properties the store reads: the record has them all)
            maps = self._bit_maps(topic, lambda: self._properties([reqs[i].commit_log_offset for i in ids],
                                                                  [reqs[i].msg_size for i in ids]))
            addrs = self.find_or_create(topic, qid).put_encoded(
                encode_units([reqs[i].tags_code for i in ids], [reqs[i].store_timestamp for i in ids], maps))
            if addrs is not None:
                for i, a in zip(ids, addrs):
                    out[i] = dataclasses.replace(reqs[i], tags_code=a)
        return out

    def _bit_maps(self, topic: str, props_of) -> list[bytes] | None:
        calc = self.bit_map_calculator
        if calc is None:
            return None
        try:
            return calc(topic, props_of())
        except Exception:       # a filter's bug must not stop dispatching: the units go without bit maps
            log.exception("computing filter bit maps for %s failed", topic)
            return None

    def _properties(self, offsets: list[int], sizes: list[int]) -> list[dict]:
        """Every property of each record ({} when it cannot be read): the records' bytes read at once when
        they lie in one commitlog file (a batch's usually do)."""
        lo, hi = offsets[0], offsets[-1] + sizes[-1]
        raw = self.commit_log.get_message(lo, hi - lo) if 0 <= hi - lo <= 64 << 20 else None
        if raw is None:
            return [_record_properties(self.commit_log.get_message(o, s), 0) for o, s in zip(offsets, sizes)]
        return [_record_properties(raw, o - lo) for o in offsets]

    # --- upkeep ------------------------------------------------------------------------------------------
    def clean(self, consume_queues) -> int:
        """Delete extension files no consume queue unit points into any more; how many went."""
        n = 0
        for (topic, qid), ext in list(self.table.items()):
            cq = consume_queues.find(topic, qid)
            first = _first_address(cq)
            if first is not None:
                n += ext.delete_below(first)
        return n

    def flush(self) -> None:
        for ext in list(self.table.values()):
            ext.flush()

    def shutdown(self) -> None:
        for ext in list(self.table.values()):
            ext.shutdown()


def encode_units(tags: list[int], store_times: list[int], bit_maps: list[bytes] | None) -> list[bytes]:
    """CqExtUnit.encode for many units."""
    if not bit_maps:
        head = struct.Struct(">hqqh").pack
        return [head(MIN_EXT_UNIT_SIZE, t, ts, 0) for t, ts in zip(tags, store_times)]
    return [_HEAD.pack(MIN_EXT_UNIT_SIZE + len(bm), t, ts, len(bm)) + bm
            for t, ts, bm in zip(tags, store_times, bit_maps)]


def _record_properties(buf, pos: int) -> dict:
    """The properties of the message record at pos of buf ({} when it cannot be read)."""
    if buf is None:
        return {}
    try:
        magic = struct.unpack_from(">I", buf, pos + 4)[0]
        hs = codec.header_struct(struct.unpack_from(">i", buf, pos + codec.POS_SYSFLAG)[0])
        body_len = struct.unpack_from(">i", buf, pos + hs.size - 4)[0]
        return codec.topic_and_properties(buf, pos + hs.size + body_len, magic)[1]
    except (struct.error, ValueError, IndexError):
        return {}


def _last_address(cq) -> int | None:
    """The tags code of the queue's last unit when it is an ext address."""
    if cq is None or cq.get_max_offset_in_queue() <= cq.get_min_offset_in_queue():
        return None
    unit = cq.get_unit(cq.get_max_offset_in_queue() - 1)
    return unit[2] if unit is not None and is_ext_addr(unit[2]) else None


def _first_address(cq) -> int | None:
    if cq is None or cq.get_max_offset_in_queue() <= cq.get_min_offset_in_queue():
        return None
    unit = cq.get_unit(cq.get_min_offset_in_queue())
    return unit[2] if unit is not None and is_ext_addr(unit[2]) else None


class ConsumeQueueExtService:
    """Flushes the extension files and deletes the ones no consume queue unit points into any more, every
    `interval` seconds (the store's close flushes and closes them after the dispatcher drained)."""

    def __init__(self, table: ConsumeQueueExtTable, consume_queues, interval: float = 10.0):
        self.table, self.consume_queues, self.interval = table, consume_queues, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ConsumeQueueExtService", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.table.flush()
                self.table.clean(self.consume_queues)
            except (OSError, ValueError) as e:
                log.error("consume queue extension upkeep failed: %s", e)

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None


def delivery_time_of_ext(store, cq, address: int, offset: int, size: int, delay_ms: int) -> int:
    """A delay queue unit's delivery time when its tags code is an ext address: the ext unit's tags code,
    else (unit unreadable) the message's store time + the level's delay (RocketMQ's ScheduleMessageService)."""
    ext = store.consume_queue_ext.unit(cq.topic, cq.queue_id, address)
    if ext is not None:
        return ext.tags_code
    log.error("%s/%d: ext unit %d unreadable: delivery time from the message's store time", cq.topic,
              cq.queue_id, address)
    return store._store_time(offset, size) + delay_ms
