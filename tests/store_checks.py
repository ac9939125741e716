"""Helpers shared by the durability, crash, cleanup and RocketMQ-issue tests (not a test module).

- small_config(): a geometry where every kind of file rolls over often.
- make_message(): deterministic messages (body derived from the key, so a reader can check it).
- walk_commitlog(): every record of the commitlog as the bytes say, independent of the store's queues.
- verify_store(): the consistency checks every durability test runs (see its docstring).
- wait_count(): the messages of a topic's queue 0 once there are n (timer and delivery tests).
- wait_until(), raw_request(): polling a condition; one remoting request through an Admin (admin tests).
- next_puts_continue(): after a recovery, one more put per queue gets exactly the queue's max offset (crash tests).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rmqstore.store.format import codec
from rmqstore.store.format import scanner
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import Message, PutMessageStatus

CHILD = Path(__file__).with_name("crash_child.py")
TOPICS = ("TopicA", "TopicB", "TopicC")
QUEUES = 4
PREPARED = codec.TRANSACTION_PREPARED_TYPE


def small_config(flush: str = "ASYNC_FLUSH", **extra) -> StoreConfig:
    values = {"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 600, "maxHashSlotNum": 64,
              "maxIndexNum": 256, "flushDiskType": flush, "flushIntervalConsumeQueue": 100,
              "flushIntervalCommitLog": 50, "syncFlushTimeout": 5000}
    values.update(extra)
    return StoreConfig.from_dict(values)


def body_for(key: str, n: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (n // len(seed) + 1))[:n]


def make_message(key: str, rng: random.Random, prepared: bool = False) -> Message:
    topic = rng.choice(TOPICS)
    n = rng.choice((10, 100, 300, 1000, 2500))
    return Message(topic, body_for(key, n), queue_id=rng.randrange(QUEUES),
                   sys_flag=PREPARED if prepared else 0, born_timestamp=1700000000000,
                   properties={"KEYS": key, "TAGS": f"tag{rng.randrange(3)}"})


@dataclass
class Acked:
    """One acknowledged put, as a client saw it."""
    offset: int
    queue_offset: int
    msg_id: str
    topic: str
    queue_id: int
    key: str
    body_len: int
    sys_flag: int

    def line(self) -> str:
        return (f"PUT_OK {self.offset} {self.queue_offset} {self.msg_id} {self.topic} {self.queue_id} {self.key} "
                f"{self.body_len} {self.sys_flag}")

    @classmethod
    def parse(cls, line: str) -> "Acked | None":
        p = line.split()
        if len(p) != 9 or p[0] != "PUT_OK":
            return None
        return cls(int(p[1]), int(p[2]), p[3], p[4], int(p[5]), p[6], int(p[7]), int(p[8]))

    @property
    def dispatchable(self) -> bool:
        t = self.sys_flag & codec.TRANSACTION_TYPE_MASK
        return t not in (codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE)


def next_puts_continue(store, acked_top: dict[tuple[str, int], int], tag: str, where: str = "",
                       body_len: int = 50) -> list[Acked]:
    """Queue offsets continue after a recovery: each queue of acked_top ({(topic, queue id): its highest
    acknowledged queue offset, -1 for none}) has a max offset past it, and one more put to it gets exactly
    that max offset (no gap, no reuse). The puts, as acknowledged."""
    added = []
    for (topic, qid), hi in sorted(acked_top.items()):
        expect = store.get_max_offset_in_queue(topic, qid)
        assert expect > hi, f"{where}: {topic}/{qid} max offset {expect}, but {hi} was acknowledged"
        key = f"{tag}-{topic}-{qid}"
        r = store.put_message(Message(topic, body_for(key, body_len), queue_id=qid, properties={"KEYS": key}))
        assert r.status is PutMessageStatus.PUT_OK, f"{where}: put after reopen: {r.status.name}"
        a = r.append_result
        assert a.logics_offset == expect, \
            f"{where}: {topic}/{qid}: next put got queue offset {a.logics_offset}, expected {expect}"
        added.append(Acked(a.wrote_offset, a.logics_offset, a.msg_id, topic, qid, key, body_len, 0))
    store.wait_dispatched()
    return added


@dataclass
class Rec:
    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    keys: str | None

    @property
    def dispatchable(self) -> bool:
        t = self.sys_flag & codec.TRANSACTION_TYPE_MASK
        return t not in (codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE)


def records_in_dir(commitlog_dir: Path) -> list[Rec]:
    """walk_commitlog without a store: the records of a commitlog directory's files as they are on disk
    (up to the first zero bytes, blank record or invalid record of each file)."""
    out: list[Rec] = []
    for p in sorted(Path(commitlog_dir).iterdir()):
        if not p.name.isdigit():         # a temporary a killed writer left (.NAME.new)
            continue
        data = p.read_bytes()
        base, pos = int(p.name), 0
        while pos < len(data):
            try:
                kind, size = scanner.check_record(data, pos, len(data), True)
            except codec.RecordError:
                break
            if kind != scanner.Outcome.MESSAGE:
                break
            r = scanner.decode_record(data, pos, len(data), read_body=False)
            out.append(Rec(base + pos, size, r.topic, r.queue_id, r.queue_offset, r.sys_flag,
                           r.properties.get("KEYS")))
            pos += size
    return out


class WalkCache:
    """Memo for walk_commitlog across reopens of one growing store (the kill loops walk it after every kill).

    A commitlog file's records (and walk_commitlog's assertions on them) are a pure function of the file's
    bytes, its first offset and the walk's limit: a file whose whole mapping holds exactly the bytes of a walk
    that passed gives exactly those records again, so they are reused instead of decoded again. Any change
    to a byte (a recovery that cut or zeroed it, a put) makes it a miss and the file is walked again."""

    def __init__(self):
        self._files: dict[int, tuple[int, bytes, list]] = {}

    def get(self, base: int, limit: int, data: bytes) -> list | None:
        hit = self._files.get(base)
        if hit is not None and hit[0] == limit and hit[1] == data:
            return hit[2]
        return None

    def put(self, base: int, limit: int, data: bytes, recs: list) -> None:
        self._files[base] = (limit, data, recs)


def walk_commitlog(store, cache: WalkCache | None = None) -> list[Rec]:
    """Every message record from the commitlog's min offset to its max offset, in order. Fails on
    anything that is not a record or a blank END_OF_FILE record inside the written part. cache: a
    WalkCache reused across calls on the same store directory (or its copies)."""
    q = store.commit_log.queue
    out: list[Rec] = []
    end = q.get_max_offset()
    for mf in list(q.files):
        limit = min(mf.file_size, end - mf.file_from_offset)
        mm = mf.mm
        data = None
        if cache is not None:
            data = bytes(mm)
            got = cache.get(mf.file_from_offset, limit, data)
            if got is not None:
                out += got
                continue
        recs: list[Rec] = []
        pos = 0
        while pos < limit:
            kind, size = scanner.check_record(mm, pos, limit, True)
            if kind == scanner.Outcome.END_OF_FILE:
                break
            assert kind == scanner.Outcome.MESSAGE, f"{mf.path}: no record at {pos} inside the written part (< {limit})"
            r = scanner.decode_record(mm, pos, limit, read_body=False)
            assert r.physical_offset == mf.file_from_offset + pos, f"{mf.path}@{pos}: record says {r.physical_offset}"
            recs.append(Rec(r.physical_offset, size, r.topic, r.queue_id, r.queue_offset, r.sys_flag,
                            r.properties.get("KEYS")))
            pos += size
        if cache is not None:
            cache.put(mf.file_from_offset, limit, data, recs)
        out += recs
    return out


def _queues_agree(store, records: list[Rec]) -> bool:
    """Checks 3 and 4 of verify_store, vectorised: True when every one of them holds (then the per-unit and
    per-record loops of verify_store would pass); False when one may not (verify_store then runs those loops,
    which fail with the precise message). Same reads: each queue's units(lo, hi), and for a record whose
    queue offset lies outside [lo, hi) the queue's get_unit, as the loops do."""
    n = len(records)
    rec_off = np.fromiter((r.offset for r in records), dtype=np.int64, count=n)
    if n and not (rec_off[1:] > rec_off[:-1]).all():
        return False                                # walk order is offset order; anything else: the slow way
    rec_size = np.fromiter((r.size for r in records), dtype=np.int64, count=n)
    rec_qoff = np.fromiter((r.queue_offset for r in records), dtype=np.int64, count=n)
    codes: dict[tuple[str, int], int] = {}
    rec_q = np.fromiter((codes.setdefault((r.topic, r.queue_id), len(codes)) for r in records), dtype=np.int64,
                        count=n)
    rec_disp = np.fromiter((r.dispatchable for r in records), dtype=bool, count=n)
    min_phy = store.get_min_phy_offset()
    seen: dict[tuple[str, int], tuple[int, np.ndarray, np.ndarray]] = {}
    # 3. consume queues agree with the commitlog
    for cq in store.consume_queues:
        lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
        units = cq.units(lo, hi)
        if len(units) != hi - lo:
            return False
        off = units["offset"].astype(np.int64)
        size = units["size"].astype(np.int64)
        seen[(cq.topic, cq.queue_id)] = (lo, off, size)
        if not len(off):
            continue
        if off[0] <= -1 or not (off[1:] > off[:-1]).all():
            return False
        pos = np.searchsorted(rec_off, off)
        hit = pos < n
        hit[hit] = rec_off[pos[hit]] == off[hit]
        if not (hit | (off < min_phy)).all():
            return False
        p = pos[hit]
        code = codes.get((cq.topic, cq.queue_id), -1)
        if not ((rec_q[p] == code).all() and (rec_qoff[p] == (lo + np.flatnonzero(hit))).all()
                and (rec_size[p] == size[hit]).all()):
            return False
    # 4. every dispatchable record has its unit
    by_code = {c: k for k, c in codes.items()}
    for c in np.unique(rec_q[rec_disp]).tolist():
        key = by_code[c]
        if store.consume_queues.find(*key) is None or key not in seen:
            return False
        lo, off, size = seen[key]
        sel = np.flatnonzero(rec_disp & (rec_q == c))
        i = rec_qoff[sel] - lo
        inside = (i >= 0) & (i < len(off))
        j = i[inside]
        if not ((off[j] == rec_off[sel[inside]]).all() and (size[j] == rec_size[sel[inside]]).all()):
            return False
        cq = store.consume_queues.find(*key)
        for s in sel[~inside].tolist():             # outside the units read above: the loop's own read
            r = records[s]
            u = cq.get_unit(r.queue_offset)
            if not (u is not None and u[0] == r.offset and u[1] == r.size):
                return False
    return True


def find_by_key(store, topic: str, key: str, store_timestamp: int | None = None) -> list:
    """store.find_messages_by_key, with the time window RocketMQ's queryMessage takes when the message's
    store time is known: [store time - 1 s, store time] (an index entry keeps its time in whole seconds
    from its file's start). The lookup then searches the index files of that second instead of every one
    (hundreds in the small-file stores of the crash tests, where full-range lookups of every key were most
    of a kill loop's time). Without a time: the default, full range."""
    if store_timestamp is None:
        return store.find_messages_by_key(topic, key)
    return store.find_messages_by_key(topic, key, begin=store_timestamp - 1000, end=store_timestamp)


FULL_RANGE_LOOKUPS = 8      # the first lookups of each check keep the default (every index file) range


def verify_store(store, acked: list[Acked] = (), *, check_index: bool = True, index_sample: int | None = None,
                 rng: random.Random | None = None, walk_cache: WalkCache | None = None) -> list[Rec]:
    """Assert what every durable store must satisfy; returns the commitlog's records.

    1. every acknowledged put is there: look_message_by_offset gives its topic, queue, queue offset, body, msgId;
    2. no duplicates: each (topic, queue, queueOffset) of a dispatchable record once in the commitlog;
    3. each consume queue is gap-free from min to max, its units point at strictly increasing offsets, each at
       a record of that topic/queue/queue offset and size; 4. every dispatchable record has its unit;
    5. the index finds every acknowledged key (find_messages_by_key); all of them or a sample.
    3 and 4 are checked vectorised first (_queues_agree); only when that finds something are they checked
    unit by unit and record by record, for the precise failure. walk_cache: see WalkCache.
    """
    store.wait_dispatched(timeout=20)
    records = walk_commitlog(store, walk_cache)
    by_offset = {r.offset: r for r in records}
    stamps: dict[int, int] = {}
    # 1. acknowledged => present, same content
    for a in acked:
        m = store.look_message_by_offset(a.offset)
        assert m is not None, f"acknowledged put {a} is missing"
        assert (m.topic, m.queue_id, m.queue_offset, m.msg_id) == (a.topic, a.queue_id, a.queue_offset, a.msg_id), \
            f"acknowledged put {a} reads back as {m.topic}/{m.queue_id}/{m.queue_offset}/{m.msg_id}"
        assert m.body == body_for(a.key, a.body_len), f"body of {a} differs"
        stamps[a.offset] = m.store_timestamp
    # 2. no duplicates
    seen: dict[tuple[str, int, int], int] = {}
    for r in records:
        if not r.dispatchable:
            continue
        k = (r.topic, r.queue_id, r.queue_offset)
        assert k not in seen, f"queue offset {k} twice in the commitlog: at {seen[k]} and {r.offset}"
        seen[k] = r.offset
    if not _queues_agree(store, records):
        # 3. consume queues agree with the commitlog
        for cq in store.consume_queues:
            lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
            units = cq.units(lo, hi)
            assert len(units) == hi - lo, f"{cq.topic}/{cq.queue_id}: {len(units)} units readable in [{lo}, {hi})"
            prev = -1
            for i, u in enumerate(units):
                off, size = int(u["offset"]), int(u["size"])
                assert off > prev, f"{cq.topic}/{cq.queue_id} unit {lo + i}: offset {off} not above {prev}"
                prev = off
                r = by_offset.get(off)
                if r is None and off < store.get_min_phy_offset():
                    continue            # cleaned from the commitlog
                assert r is not None, f"{cq.topic}/{cq.queue_id} unit {lo + i} points at {off}: no record starts there"
                assert (r.topic, r.queue_id, r.queue_offset, r.size) == (cq.topic, cq.queue_id, lo + i, size), \
                    f"{cq.topic}/{cq.queue_id} unit {lo + i} -> {off}: record is {r}"
        # 4. every dispatchable record has its unit
        for r in records:
            if not r.dispatchable:
                continue
            cq = store.consume_queues.find(r.topic, r.queue_id)
            assert cq is not None, f"no consume queue for {r}"
            u = cq.get_unit(r.queue_offset)
            assert u is not None and u[0] == r.offset and u[1] == r.size, \
                f"record {r} has no unit (unit {r.queue_offset} of {r.topic}/{r.queue_id} is {u})"
    # 5. the index finds the keys
    if check_index and store.config.message_index_enable:
        todo = list(acked)
        if index_sample is not None and len(todo) > index_sample:
            rng = rng or random.Random(0)
            todo = todo[-index_sample // 2:] + rng.sample(todo[:-index_sample // 2], index_sample // 2)
        for i, a in enumerate(todo):
            ts = stamps[a.offset] if i >= FULL_RANGE_LOOKUPS else None
            found = {m.commit_log_offset for m in find_by_key(store, a.topic, a.key, ts)}
            assert a.offset in found, f"key {a.key} of {a} not found by the index ({sorted(found)})"
    return records


def file_bytes(root: Path) -> dict[str, bytes]:
    """Every file under root and its bytes (to prove that something changed nothing)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


class Child:
    """crash_child.py running on a store; its stdout collected by a thread (so the pipe never fills)."""

    def __init__(self, store: Path, flush: str, run_id: str, seed: int, max_seconds: float = 30):
        self.proc = subprocess.Popen([sys.executable, str(CHILD), str(store), flush, run_id, str(seed),
                                      str(max_seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.raw: list[bytes] = []
        self.err = b""
        self.ready = threading.Event()
        self._t_out = threading.Thread(target=self._read_out, daemon=True)
        self._t_err = threading.Thread(target=self._read_err, daemon=True)
        self._t_out.start()
        self._t_err.start()

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            self.raw.append(line)
            if line.startswith(b"READY"):
                self.ready.set()
        self.ready.set()

    def _read_err(self) -> None:
        self.err = self.proc.stderr.read()

    def puts_seen(self) -> int:
        return sum(1 for r in self.raw if r.startswith(b"PUT_OK"))

    def kill(self) -> None:
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self._t_out.join(timeout=10)
        self._t_err.join(timeout=10)

    def acked(self) -> list[Acked]:
        """PUT_OK lines written whole before the kill (a torn last line was never seen by the 'client')."""
        out = []
        for line in self.raw:
            if line.endswith(b"\n"):
                a = Acked.parse(line.decode())
                if a is not None:
                    out.append(a)
        return out

    def failures(self) -> list[str]:
        return [r.decode().strip() for r in self.raw if r.startswith(b"PUT_FAIL")]

    def wait_puts(self, n: int, timeout: float = 30) -> bool:
        """Wait until the child reported n acknowledged puts (False on timeout or if it died)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.puts_seen() >= n:
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.01)
        return False


# --- a small real filesystem for disk-full tests -------------------------------------------------------------
@contextlib.contextmanager
def small_filesystem(path: Path, size_mb: int = 8):
    """Mount a size-limited tmpfs at path (else an ext4 image on a loop device); skip if neither works."""
    import pytest
    path.mkdir(parents=True, exist_ok=True)
    how = None
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                       capture_output=True, text=True, timeout=30)
    if r.returncode == 0:
        how = "tmpfs"
    else:
        img = path.with_suffix(".img")
        with open(img, "wb") as f:
            f.truncate(size_mb << 20)
        mk = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(img)], capture_output=True, text=True,
                            timeout=60)
        lo = subprocess.run(["mount", "-o", "loop", str(img), str(path)], capture_output=True, text=True,
                            timeout=30) if mk.returncode == 0 else mk
        if lo.returncode != 0:
            pytest.skip(f"cannot mount a small filesystem here: tmpfs: {r.stderr.strip()}; "
                        f"loop ext4: {lo.stderr.strip()}")
        how = "ext4"
    try:
        yield how
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill_to(ballast: Path, ratio: float) -> float:
    """Grow or shrink the ballast file so that its filesystem is `ratio` used; returns the ratio reached."""
    from rmqstore.store.durability.cleanup import disk_used_ratio
    st = os.statvfs(ballast.parent)
    total = st.f_blocks * st.f_frsize
    used = total - st.f_bfree * st.f_frsize
    have = ballast.stat().st_size if ballast.exists() else 0
    want = max(0, have + int(ratio * total) - used)
    want = (want + 4095) // 4096 * 4096
    if want < have:
        os.truncate(ballast, want)
    elif want > have:
        with open(ballast, "ab") as f:
            left = want - have
            chunk = b"\xa5" * (1 << 16)
            while left > 0:
                f.write(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
            f.flush()
            os.fsync(f.fileno())
    return disk_used_ratio(ballast.parent)


@contextlib.contextmanager
def failing_filesystem(mountpoint: Path, work: Path, backing_mb: int = 16):
    """A real disk that fails: ext4 on a loop device whose backing image sits on a small tmpfs. Once the
    tmpfs is filled (write the yielded ballast path until ENOSPC), writeback of blocks never written before
    fails and msync/fsync answer EIO, as a dying disk does. Skips when mounting is not permitted."""
    import pytest
    backing = work / "backing"
    backing.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={backing_mb}m", "tmpfs", str(backing)],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the failing disk: {r.stderr.strip()}")
    try:
        img = backing / "disk.img"
        with open(img, "wb") as f:
            f.truncate(64 << 20)
        for cmd in (["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(img)],
                    ["mount", "-o", "loop", str(img), str(mountpoint)]):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                pytest.skip(f"cannot build the failing disk ({' '.join(cmd[:2])}): {r.stderr.strip()}")
        try:
            yield backing / "ballast"
        finally:
            if subprocess.run(["umount", str(mountpoint)], capture_output=True, timeout=30).returncode != 0:
                subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, timeout=30)
    finally:
        if subprocess.run(["umount", str(backing)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(backing)], capture_output=True, timeout=30)


def fill_up(ballast: Path) -> None:
    """Write the ballast file until its filesystem answers ENOSPC."""
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (1 << 16, 4096, 512):
            chunk = b"\x5a" * size
            try:
                while True:
                    os.write(fd, chunk)
            except OSError:
                pass
    finally:
        os.close(fd)


def tree_files(root: Path, sub: str) -> dict[str, bytes]:
    """Every file under root/sub, by its path relative to it: its bytes."""
    base = root / sub
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def index_parts(root: Path) -> list:
    """root's index files without their names and hashSlotCount (the local engine names files by the clock)."""
    out = []
    for p in sorted((root / "index").iterdir()):
        raw = p.read_bytes()
        b_ts, e_ts, b_phy, e_phy, _slots, count = codec.INDEX_HEADER.unpack_from(raw, 0)
        out.append(((b_ts, e_ts, b_phy, e_phy, count), raw[codec.INDEX_HEADER_SIZE:]))
    return out


def wait_count(store, topic: str, n: int, timeout: float = 30.0) -> list:
    """The messages of queue 0 of topic (up to 64) as soon as there are n, or what there is after timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = store.get_message("g", topic, 0, 0, 64).messages
        if len(got) >= n:
            return got
        time.sleep(0.05)
    return store.get_message("g", topic, 0, 0, 64).messages


def wait_until(cond, timeout: float, step: float = 0.05) -> bool:
    """cond() as soon as it is true, polled every step seconds, or its value after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def raw_request(admin, addr: str, code: int, fields: dict | None = None, timeout: float = 30):
    """One request of `code` (header fields) sent to addr through an rmqstore.client Admin; its answer."""
    m = admin._m()
    return m.invoke(addr, m.request(code, fields), timeout)


def run_until_sigkilled(code: str, root, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run `code` (a format string given {tests} and {root}: this directory, the store) in a child Python that
    ends by SIGKILLing itself; asserts it did. Returns the finished process (its stdout)."""
    proc = subprocess.run([sys.executable, "-c", code.format(tests=os.path.dirname(os.path.abspath(__file__)),
                                                             root=str(root))], capture_output=True, timeout=timeout)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    return proc
