"""The read workloads of the suite: consume everything back by queue, key lookups."""
from __future__ import annotations

import os
import random
import shutil
import time

from ..bench import generate_messages
from .common import (TOPIC, QUEUES, BATCH, Table, _rate, _fmt_rate, _pct, _NoGC, _rmq_config, _open,
                     _dispatch_all)


class ReadWorkloads:
    """benchsuite.Suite's workloads: the reads (consume, key_lookup); each returns a Table (self: the Suite)."""

    # --- consume ---------------------------------------------------------------------------------
    def consume(self):
        from ...store.reads.batch_read import read_queue_bodies
        s = self.state["rmq"]
        n = self.p["n_100"]
        t = Table("consume", f"Consume everything by queue: {n:,} messages of 100 B (append_100B's data)",
                  "msg/s", True)
        with _NoGC():
            t0 = time.perf_counter()
            got = sum(len(read_queue_bodies(s, TOPIC, q)) for q in range(QUEUES))
            el = time.perf_counter() - t0
        assert got == n, (got, n)
        t.add("rmqstore batch_read (list of bytes)", _rate(n, el), _fmt_rate(_rate(n, el)), ref=True)
        with _NoGC():
            t0 = time.perf_counter()
            got = sum(len(read_queue_bodies(s, TOPIC, q, as_buffer=True)[1]) - 1 for q in range(QUEUES))
            el = time.perf_counter() - t0
        assert got == n, (got, n)
        t.add("rmqstore batch_read (one buffer + offsets)", _rate(n, el), _fmt_rate(_rate(n, el)))
        try:
            m, el = self._consume_mixed_lengths(n // 4)
            t.add("rmqstore batch_read (list of bytes), bodies of 1-400 B", _rate(m, el),
                  f"{_fmt_rate(_rate(m, el))} ({m:,} msgs)")
        except Exception as e:  # noqa: BLE001
            t.error("rmqstore batch_read, bodies of 1-400 B", e)
        self._consume_get_message(t, s, n)
        self._consume_others(t, n)
        t.notes.append("batch_read returns bodies only (no properties decoded); get_message decodes every "
                       "field of every message into a MessageExt, as RocketMQ's pull path hands them out. "
                       "append_100B's bodies share one length, batch_read's best case (one gather per "
                       "commitlog file); the 1-400 B row reads a store whose bodies do not.")
        return t

    def _consume_get_message(self, t: Table, s, n) -> None:
        with _NoGC():
            t0 = time.perf_counter()
            got = 0
            for q in range(QUEUES):
                off = 0
                while True:
                    r = s.get_message("bench", TOPIC, q, off, 32)
                    if not r.messages:
                        break
                    got += len(r.messages)
                    off = r.next_begin_offset
            el = time.perf_counter() - t0
        assert got == n, (got, n)
        t.add("rmqstore get_message, 32 at a time (decoded MessageExt)", _rate(n, el), _fmt_rate(_rate(n, el)))

    def _consume_others(self, t: Table, n) -> None:
        """sqlite, queuelib and persist-queue read back what append_100B stored in them."""
        con = self.state.get("sqlite")
        if con is not None:
            with _NoGC():
                t0 = time.perf_counter()
                got = 0
                for q in range(QUEUES):
                    cur = con.execute("SELECT body FROM m WHERE qid = ? ORDER BY id", (q,))
                    while True:
                        rows = cur.fetchmany(1000)
                        if not rows:
                            break
                        got += len(rows)
                el = time.perf_counter() - t0
            t.add("sqlite3 SELECT body WHERE qid=? ORDER BY id", _rate(got, el), _fmt_rate(_rate(got, el)))
        q = self.state.get("queuelib")
        if q is not None:
            try:
                pop = q.pop
                with _NoGC():
                    t0 = time.perf_counter()
                    got = 0
                    while pop() is not None:
                        got += 1
                    el = time.perf_counter() - t0
                q.close()
                t.add("queuelib FifoDiskQueue.pop", _rate(got, el), _fmt_rate(_rate(got, el)) +
                      ("" if got == n else f" ({got:,} msgs)"))
            except Exception as e:  # noqa: BLE001
                t.error("queuelib FifoDiskQueue.pop", e)
        pq = self.state.get("persistqueue")
        if pq is not None:
            try:
                with _NoGC():
                    t0 = time.perf_counter()
                    got = 0
                    get, done = pq.get, pq.task_done
                    while pq.qsize():
                        get(block=False)
                        done()
                        got += 1
                    el = time.perf_counter() - t0
                t.add("persist-queue Queue.get + task_done", _rate(got, el), _fmt_rate(_rate(got, el)) +
                      ("" if got == n else f" ({got:,} msgs)"))
            except Exception as e:  # noqa: BLE001
                t.error("persist-queue Queue.get", e)

    def _consume_mixed_lengths(self, n):
        """(n, seconds) to read back, by queue, a store of n messages whose bodies have random lengths of
        1-400 B: batch_read's case when bodies do not share one length."""
        from ...store.reads.batch_read import read_queue_bodies
        rnd = random.Random(1)
        msgs = generate_messages(n, 1, QUEUES, TOPIC)
        blob = os.urandom(400)
        for msg in msgs:
            msg.body = blob[:rnd.randint(1, 400)]
        s = _open(self.dir("consume-mixed"), _rmq_config(self.p))
        try:
            for i in range(0, n, BATCH):
                s.put_messages(msgs[i:i + BATCH])
            _dispatch_all(s)
            with _NoGC():
                t0 = time.perf_counter()
                got = sum(len(read_queue_bodies(s, TOPIC, q)) for q in range(QUEUES))
                el = time.perf_counter() - t0
            assert got == n, (got, n)
            return n, el
        finally:
            s.close()
            shutil.rmtree(self.work / "consume-mixed", ignore_errors=True)

    # --- key lookups -----------------------------------------------------------------------------
    def key_lookup(self):
        s = self.state["rmq"]
        n = self.p["n_100"]
        k = self.p["lookups"]
        t = Table("key_lookup", f"Key lookup: {k:,} random keys of a store holding {n:,} keys (p99 latency)",
                  "us", False)
        rng = random.Random(7)
        keys = [f"key-{rng.randrange(n)}" for _ in range(k)]

        def measure(fn):
            lat = []
            pc = time.perf_counter_ns
            with _NoGC():
                for key in keys:
                    t0 = pc()
                    r = fn(key)
                    lat.append((pc() - t0) / 1000)
                    if not r:
                        raise AssertionError(f"{key} not found")
            return _pct(lat, 0.5), _pct(lat, 0.99)

        for name, fn, ref in (
                ("rmqstore find_messages_by_key", lambda key: s.find_messages_by_key(TOPIC, key), True),
                ("rmqstore query_message (raw index)", lambda key: s.query_message(TOPIC, key, 32).messages, False)):
            try:
                p50, p99 = measure(fn)
                t.add(name, p99, f"p50 {p50:,.1f} us, p99 {p99:,.1f} us", ref=ref)
            except Exception as e:  # noqa: BLE001
                t.error(name, e)
        con = self.state.get("sqlite")
        if con is not None:
            q = "SELECT id, body, topic, tags FROM m WHERE key = ?"
            p50, p99 = measure(lambda key: con.execute(q, (key,)).fetchall())
            t.add("sqlite3 indexed SELECT WHERE key=?", p99, f"p50 {p50:,.1f} us, p99 {p99:,.1f} us")
        return t
