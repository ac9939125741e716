"""The append workloads of the suite: async appends of 100 B and 1 KiB, durable (SYNC_FLUSH) appends."""
from __future__ import annotations

import collections
import mmap
import os
import shutil
import sqlite3
import _thread
import threading
import time
import zlib

from ..bench import batch_columns, generate_messages, ok_count
from ...store.format import codec
from ...store.format.message_batch import MessageBatch
from ...store.conf.config import SYNC_FLUSH
from .common import (TOPIC, QUEUES, BATCH, Table, _rate, _fmt_rate, _NoGC, _rmq_config, _open, _dispatch_all,
                     _commitlog_chunks)


FLOOR_ROW = "limit: a put's unavoidable Python steps, nothing checked (python_put_floor)"
SYNC_FLOOR_ROW = "limit: the plainest durable Python put, {threads} (python_sync_floor)"


def sync_floor_row(threads: int) -> str:
    """The sync_append row of python_sync_floor with that many threads."""
    return SYNC_FLOOR_ROW.format(threads=f"{threads} thread{'s' if threads > 1 else ''}")


def _floor_putter(msgs, path):
    """python_put_floor's file and put: (put, fd, close); the file is allocated for msgs and mapped, fd stays
    open (for fdatasync) until close()."""
    size = sum(len(m.body) + 200 + len(m.topic) + sum(len(k) + len(v) + 2 for k, v in m.properties.items())
               for m in msgs)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        mm = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
    lock, table, pack, crc32, hs = threading.Lock(), {}, codec.HEADER_V4.pack, zlib.crc32, codec.HEADER_V4.size
    answer = collections.namedtuple("Answer", "status offset size store_timestamp queue_offset")
    pos, magic, host = 0, codec.MESSAGE_MAGIC_CODE, bytes(4)

    def put(m):
        nonlocal pos
        p = ("\x02".join(map("\x01".join, m.properties.items())) + "\x02").encode()
        body = m.body
        topic = m.topic.encode()
        tail = b"".join((len(topic).to_bytes(1, "big"), topic, len(p).to_bytes(2, "big"), p))
        size = hs + len(body) + len(tail)
        crc = crc32(body) & 0x7FFFFFFF
        key = f"{m.topic}-{m.queue_id}"
        with lock:
            now = time.time_ns() // 1_000_000
            at = pos
            qoff = table.get(key, 0)
            mm[at:at + size] = b"".join((pack(size, magic, crc, m.queue_id, m.flag, qoff, at, 0, m.born_timestamp,
                                              host, 0, now, host, 0, 0, 0, len(body)), body, tail))
            pos = at + size
            table[key] = qoff + 1
        return answer(0, at, size, now, qoff)

    def close():
        mm.close()
        os.close(fd)
        os.unlink(path)

    return put, fd, close


def python_put_floor(msgs, path) -> float:
    """Seconds to put msgs one call each with only what any put must do in Python (RocketMQ's putMessage
    does each): properties serialized, the body's CRC, the header packed with the physical and queue
    offsets and the store time, the record copied into a mapped file (allocated first, as the commitlog's
    tail is) under a lock, the queue offset advanced, an answer object made. Nothing is validated and no
    file rolls: a floor for put_message in this interpreter, not a store."""
    put, _, close = _floor_putter(msgs, path)
    try:
        t0 = time.perf_counter()
        for m in msgs:
            put(m)
        return time.perf_counter() - t0
    finally:
        close()


def python_sync_floor(msgs, path, threads: int) -> float:
    """Seconds to put msgs durably (each on disk before its put returns) from `threads` threads with the
    least a SYNC_FLUSH put needs in Python: python_put_floor's put, then with one thread an fdatasync in the
    putting thread; with several, the plainest group commit: each put queues a one-shot lock and sleeps on
    it, one flusher thread takes every queued put, fdatasyncs once and wakes them. No checks, no dispatch:
    a floor for this interpreter's threads on this disk, not a store."""
    put, fd, close = _floor_putter(msgs, path)
    parts = [msgs[i::threads] for i in range(threads)]
    queue: collections.deque = collections.deque()
    signal = _thread.allocate_lock()
    signal.acquire()
    stop = False

    def flusher():
        while not stop:
            signal.acquire(True, 0.01)
            batch = []
            while queue:
                batch.append(queue.popleft())
            if batch:
                os.fdatasync(fd)
                for done in batch:
                    done.release()

    def alone(part):
        for m in part:
            put(m)
            os.fdatasync(fd)

    def grouped(part):
        for m in part:
            put(m)
            done = _thread.allocate_lock()
            done.acquire()
            queue.append(done)
            if signal.locked():
                try:
                    signal.release()
                except RuntimeError:    # released by another put in between
                    pass
            done.acquire()

    f = threading.Thread(target=flusher, daemon=True)
    if threads > 1:
        f.start()
    ths = [threading.Thread(target=alone if threads == 1 else grouped, args=(part,)) for part in parts]
    try:
        t0 = time.perf_counter()
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        return time.perf_counter() - t0
    finally:
        stop = True
        if threads > 1:
            f.join()
        close()


class AppendWorkloads:
    """benchsuite.Suite's workloads: the appends (append_100B, append_1KiB, sync_append); each returns a Table (self: the Suite)."""

    # --- appends ---------------------------------------------------------------------------------
    def _append(self, key, title, n, body_size, keep: bool) -> Table:
        t = Table(key, f"{title}: {n:,} messages of {body_size} B, async flush", "msg/s", True)
        msgs = generate_messages(n, body_size, QUEUES, TOPIC)
        batches = [msgs[i:i + BATCH] for i in range(0, n, BATCH)]
        self._append_one_at_a_time(t, key, msgs, n)
        self._append_columns(t, key, batches, n)
        chunks, nbytes = self._append_batches(t, key, msgs, batches, n, keep)
        self._append_sqlite(t, key, batches, n, keep)
        self._append_disk_queues(t, key, msgs, n, keep)
        self._append_limits(t, key, n, chunks, nbytes)
        t.notes.append(f"rmqstore rows: appends to the commitlog only, with the dispatcher (the thread that "
                       f"builds the consume queues and the key index) stopped; the '+ dispatch' row then builds "
                       f"them in one go from the records read back from the commitlog. The end to end table runs "
                       f"both at once, as a broker does. Commitlog bytes: {nbytes:,}. queuelib and "
                       f"persist-queue store the body only; sqlite stores body, topic, queue, tag, key and "
                       f"maintains the key index.")
        return t

    def _append_one_at_a_time(self, t: Table, key, msgs, n) -> None:
        p = self.p
        # rmqstore, one put_message per message
        try:
            s = _open(self.dir(f"{key}-rmq-one"), _rmq_config(p))
            put = s.put_message
            with _NoGC():
                t0 = time.perf_counter()
                for m in msgs:
                    put(m)
                el = time.perf_counter() - t0
            s.close()
            shutil.rmtree(self.work / f"{key}-rmq-one", ignore_errors=True)
            t.add("rmqstore put_message (1 at a time)", _rate(n, el), _fmt_rate(_rate(n, el)))
        except Exception as e:  # noqa: BLE001
            t.error("rmqstore put_message (1 at a time)", e)
        try:
            path = self.dir(key) / "floor.bin"
            with _NoGC():
                el = python_put_floor(msgs, path)
            t.add(FLOOR_ROW, _rate(n, el), _fmt_rate(_rate(n, el)))
        except Exception as e:  # noqa: BLE001
            t.error(FLOOR_ROW, e)

    def _append_columns(self, t: Table, key, batches, n) -> None:
        p = self.p
        # rmqstore, the same batches as columns (MessageBatch, made in the timed loop)
        try:
            cols = [batch_columns(b) for b in batches]
            sc = _open(self.dir(f"{key}-rmq-cols"), _rmq_config(p))
            with _NoGC():
                t0 = time.perf_counter()
                okc = sum(ok_count(sc.put_messages(MessageBatch(**c))) for c in cols)
                el_c = time.perf_counter() - t0
            assert okc == n, f"rmqstore MessageBatch: {okc} of {n} puts ok"
            mb_c = sc.commit_log.get_max_offset()
            sc.close()
            del cols
            shutil.rmtree(self.work / f"{key}-rmq-cols", ignore_errors=True)
            t.add(f"rmqstore MessageBatch (columns, batches of {BATCH})", _rate(n, el_c),
                  f"{_fmt_rate(_rate(n, el_c))}, {mb_c / el_c / 1e6:,.0f} MB/s")
        except Exception as e:  # noqa: BLE001
            t.error("rmqstore MessageBatch", e)

    def _append_batches(self, t: Table, key, msgs, batches, n, keep: bool):
        """rmqstore put_messages in batches, then dispatch; returns the commitlog bytes as the batches wrote
        them (chunks, total) for the limit rows."""
        p = self.p
        # rmqstore, batched; then dispatch (consume queues + key index) on the same store
        s = _open(self.dir(f"{key}-rmq"), _rmq_config(p))
        with _NoGC():
            t0 = time.perf_counter()
            ok = 0
            for b in batches:
                ok += ok_count(s.put_messages(b))
            el = time.perf_counter() - t0
            t1 = time.perf_counter()
            _dispatch_all(s)
            el_d = time.perf_counter() - t1
        assert ok == n, f"rmqstore: {ok} of {n} puts ok"
        t.add(f"rmqstore put_messages (batches of {BATCH})", _rate(n, el),
              f"{_fmt_rate(_rate(n, el))}, {s.commit_log.get_max_offset() / el / 1e6:,.0f} MB/s", ref=True)
        t.add("rmqstore put_messages + dispatch (consume queues and key index built after the puts)",
              _rate(n, el + el_d),
              f"{_fmt_rate(_rate(n, el + el_d))} (building the queues and index alone {_fmt_rate(_rate(n, el_d))})")
        chunks, nbytes = _commitlog_chunks(s, len(batches))

        if keep:
            self.state["rmq"] = s
            self.state["rmq_path"] = self.work / f"{key}-rmq"
            self.state["msgs"] = msgs
            self.state.setdefault("stores", []).append(s)
        else:
            s.close()
            shutil.rmtree(self.work / f"{key}-rmq", ignore_errors=True)
        return chunks, nbytes

    def _append_sqlite(self, t: Table, key, batches, n, keep: bool) -> None:
        # sqlite3
        try:
            dbp = self.dir(key) / "sqlite.db"
            con = sqlite3.connect(dbp, isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=NORMAL")
            con.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, topic TEXT, qid INTEGER, tags TEXT, key TEXT, "
                        "born INTEGER, body BLOB)")
            con.execute("CREATE INDEX m_key ON m(key)")
            rows = [[(m.topic, m.queue_id, "TagA", m.properties["KEYS"], m.born_timestamp, m.body) for m in b]
                    for b in batches]
            ins = "INSERT INTO m (topic, qid, tags, key, born, body) VALUES (?,?,?,?,?,?)"
            with _NoGC():
                t0 = time.perf_counter()
                for rb in rows:
                    con.execute("BEGIN")
                    con.executemany(ins, rb)
                    con.execute("COMMIT")
                el = time.perf_counter() - t0
            del rows
            t.add(f"sqlite3 WAL NORMAL, executemany x{BATCH}, key index", _rate(n, el), _fmt_rate(_rate(n, el)))
            if keep:
                self.state["sqlite"] = con
            else:
                con.close()
        except Exception as e:  # noqa: BLE001
            t.error("sqlite3", e)

    def _append_disk_queues(self, t: Table, key, msgs, n, keep: bool) -> None:
        """queuelib and persist-queue, on the bodies (capped: they are slow)."""
        p = self.p
        cap = min(n, p["queue_cap"])
        capnote = "" if cap == n else f" (first {cap:,})"
        bodies = [m.body for m in msgs[:cap]]
        # queuelib
        try:
            from queuelib import FifoDiskQueue
            q = FifoDiskQueue(str(self.dir(key) / "queuelib"))
            push = q.push
            with _NoGC():
                t0 = time.perf_counter()
                for b in bodies:
                    push(b)
                el = time.perf_counter() - t0
            t.add("queuelib FifoDiskQueue.push", _rate(cap, el), _fmt_rate(_rate(cap, el)) + capnote)
            if keep:
                self.state["queuelib"] = q
            else:
                q.close()
        except Exception as e:  # noqa: BLE001
            t.error("queuelib FifoDiskQueue.push", e)
        # persist-queue
        try:
            import persistqueue
            pcap = min(cap, p["pq_cap"])
            pq = persistqueue.Queue(str(self.dir(key) / "persistqueue"), chunksize=1000)
            put = pq.put
            with _NoGC():
                t0 = time.perf_counter()
                for b in bodies[:pcap]:
                    put(b)
                el = time.perf_counter() - t0
            t.add("persist-queue Queue.put", _rate(pcap, el), _fmt_rate(_rate(pcap, el))
                  + ("" if pcap == n else f" (first {pcap:,}: it is slow)"))
            if keep:
                self.state["persistqueue"] = pq
        except Exception as e:  # noqa: BLE001
            t.error("persist-queue Queue.put", e)
        del bodies

    def _append_limits(self, t: Table, key, n, chunks, nbytes) -> None:
        # limits: the same commitlog bytes, in the same batches
        fn = self.dir(key) / "plain.bin"
        fd = os.open(fn, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        w = os.write
        t0 = time.perf_counter()
        for c in chunks:
            w(fd, c)
        el = time.perf_counter() - t0
        os.close(fd)
        os.unlink(fn)
        t.add("limit: os.write of the same bytes (per batch)", _rate(n, el),
              f"{_fmt_rate(_rate(n, el))}, {nbytes / el / 1e6:,.0f} MB/s")
        buf = bytearray()
        ext = buf.extend
        t0 = time.perf_counter()
        for c in chunks:
            ext(c)
        el = time.perf_counter() - t0
        del buf
        t.add("limit: in-memory copy (bytearray.extend)", _rate(n, el),
              f"{_fmt_rate(_rate(n, el))}, {nbytes / el / 1e6:,.0f} MB/s")


    def append_100(self):
        return self._append("append_100B", "Append", self.p["n_100"], 100, keep=True)

    def append_1k(self):
        t = self._append("append_1KiB", "Append", self.p["n_1k"], 1024, keep=False)
        shutil.rmtree(self.work / "append_1KiB", ignore_errors=True)
        return t

    # --- sync appends ----------------------------------------------------------------------------
    def sync_append(self):
        n = self.p["n_sync"]
        t = Table("sync_append", f"Sync-flush append: {n:,} messages of 100 B, each durable before the put "
                                 f"returns", "msg/s", True)
        msgs = generate_messages(n, 100, QUEUES, TOPIC)
        for threads in (1, 4, 16):
            self._sync_rmqstore(t, msgs, n, threads)
        self._sync_sqlite(t, msgs, n)
        self._sync_limits(t, n)
        for threads in (1, 16):
            self._sync_floor(t, msgs, n, threads)
        shutil.rmtree(self.work / "sync-sqlite", ignore_errors=True)
        shutil.rmtree(self.work / "sync-plain", ignore_errors=True)
        t.notes.append("Ratios against rmqstore with 1 producer thread: group commit should lift 16 threads "
                       "well above 1 (each put waits until its bytes are on disk; one fdatasync serves every put "
                       "waiting). The limit rows write about one record's bytes (290 B) and fsync.")
        return t

    def _sync_rmqstore(self, t: Table, msgs, n, threads: int) -> None:
        """rmqstore SYNC_FLUSH (group commit) from `threads` producer threads."""
        name = f"rmqstore SYNC_FLUSH, {threads} producer thread{'s' if threads > 1 else ''}"
        try:
            d = self.dir(f"sync-{threads}")
            s = _open(d, _rmq_config(self.p, flush_disk_type=SYNC_FLUSH), services=True)
            parts = [msgs[i::threads] for i in range(threads)]
            oks = [0] * threads

            def job(i):
                put = s.put_message
                c = 0
                for m in parts[i]:
                    if put(m).ok:
                        c += 1
                oks[i] = c

            ths = [threading.Thread(target=job, args=(i,)) for i in range(threads)]
            with _NoGC():
                t0 = time.perf_counter()
                for th in ths:
                    th.start()
                for th in ths:
                    th.join()
                el = time.perf_counter() - t0
            s.close()
            shutil.rmtree(d, ignore_errors=True)
            t.add(name, _rate(n, el), f"{_fmt_rate(_rate(n, el))} ({sum(oks)} ok)", ref=threads == 1)
        except Exception as e:  # noqa: BLE001
            t.error(name, e)

    def _sync_floor(self, t: Table, msgs, n, threads: int) -> None:
        name = sync_floor_row(threads)
        try:
            with _NoGC():
                el = python_sync_floor(msgs, self.dir("sync-plain") / f"floor{threads}.bin", threads)
            t.add(name, _rate(n, el), _fmt_rate(_rate(n, el)))
        except Exception as e:  # noqa: BLE001
            t.error(name, e)

    def _sync_sqlite(self, t: Table, msgs, n) -> None:
        try:
            d = self.dir("sync-sqlite")
            con = sqlite3.connect(d / "s.db", isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=FULL")
            con.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, topic TEXT, qid INTEGER, key TEXT, body BLOB)")
            con.execute("CREATE INDEX m_key ON m(key)")
            with _NoGC():
                t0 = time.perf_counter()
                for m in msgs:
                    con.execute("INSERT INTO m (topic, qid, key, body) VALUES (?,?,?,?)",
                                (m.topic, m.queue_id, m.properties["KEYS"], m.body))
                el = time.perf_counter() - t0
            con.close()
            t.add("sqlite3 WAL FULL, 1 transaction per message", _rate(n, el), _fmt_rate(_rate(n, el)))
        except Exception as e:  # noqa: BLE001
            t.error("sqlite3 FULL", e)

    def _sync_limits(self, t: Table, n) -> None:
        rec = b"x" * 290   # about one commitlog record of a 100 B message
        for per in (1, 16):
            fn = self.dir("sync-plain") / f"plain{per}.bin"
            fd = os.open(fn, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            chunk = rec * per
            with _NoGC():
                t0 = time.perf_counter()
                for _ in range(n // per):
                    os.write(fd, chunk)
                    os.fsync(fd)
                el = time.perf_counter() - t0
            os.close(fd)
            t.add(f"limit: os.write + fsync per {'message' if per == 1 else f'{per} messages'}",
                  _rate(n, el), _fmt_rate(_rate(n, el)))
