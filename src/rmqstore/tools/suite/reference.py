"""The workloads of the suite measured elsewhere: RocketMQ 4.4.0's own store (same run), Spark, the server."""
from __future__ import annotations


from .common import (BATCH, REFERENCE_BUILD, ROCKETMQ, find_reference, run_reference, Table, Compare, _rate,
                     _fmt_rate, _NoGC)


class ReferenceWorkloads:
    """benchsuite.Suite's workloads: RocketMQ's own store, Spark, the server; each returns a Table (self: the Suite)."""

    # --- RocketMQ 4.4.0's own store, same run ---------------------------------------------------------
    def rocketmq(self):
        """RocketMQ 4.4.0's DefaultMessageStore (../shared/reference/), run now, on this machine, with the same
        100 B messages: adds its rows to the append, sync and end to end tables (their ratios are then
        measured in this run) and returns the side-by-side table of issue 20. When the reference is not
        built, the table says so and how to build it; no RocketMQ figure is quoted from elsewhere."""
        by = {t.key: t for t in self.tables}
        n, n_sync = self.p["n_100"], self.p["n_sync"]
        t = Table("rocketmq", f"{ROCKETMQ} beside rmqstore, both measured in this run", "msg/s", True)
        binary = find_reference()
        ref: dict = {}
        if binary is None:
            t.notes.append(f"**{ROCKETMQ} was not run: its reference benchmark is not built on this machine** "
                           f"(looked for $RMQSTORE_REFERENCE, then ~/.cache/rmqstore-reference/refbench). Build it "
                           f"once, then run `make bench` again: {REFERENCE_BUILD}.")
        else:
            for key, mode, count, arg in (("bench", "bench", n, 0), ("sync1", "syncbench", n_sync, 1),
                                          ("sync16", "syncbench", n_sync, 16)):
                try:
                    with _NoGC():
                        ref[key] = run_reference(binary, self.work, mode, count, 100, arg)
                except Exception as e:  # noqa: BLE001 - reported in the table, not fatal
                    t.notes.append(f"{ROCKETMQ} `{mode}` ({count:,} messages) failed: {e}")
        if ref and n < 1_000_000:
            t.notes.append(f"At this scale ({n:,} messages, a few seconds of Java) the JVM's start-up and warm-up "
                           f"(code interpreted until the JIT compiles it) weigh on RocketMQ's figures; the full "
                           f"scale (1,000,000 messages) is the comparison to quote.")
        self._rocketmq_rows(by, ref, n, n_sync, binary is not None)
        self._compare_rows(t, by, ref, n, n_sync, binary is not None)
        t.notes.append(f"{ROCKETMQ}: its own store (DefaultMessageStore, Java, this machine's JVM) timed by "
                       f"../shared/reference/RefBench.java in a fresh directory, one JVM per row (JIT warm-up "
                       f"included, as for rmqstore's first call). Its store has no batch put: every message is one "
                       f"putMessage call, and its dispatcher thread builds the consume queues and the key index "
                       f"while it puts. rmqstore's single-put row appends with its dispatcher stopped.")
        return t

    def _rocketmq_rows(self, by, ref, n, n_sync, built):
        """RocketMQ's rows in the workload tables (so the chart and each table's ratios show them)."""
        missing = "not built (see the first table)" if not built else "failed (see the first table's notes)"
        b = ref.get("bench")
        rows = (("append_100B", f"{ROCKETMQ} putMessage (1 at a time, its dispatcher running)",
                 _rate(b["n"], b["put_s"]) if b else None),
                ("e2e", f"{ROCKETMQ} putMessage 1 at a time, until dispatched",
                 _rate(b["n"], b["put_and_dispatch_s"]) if b else None))
        for key, name, v in rows:
            if key in by:
                by[key].add(name, v, _fmt_rate(v) if v else missing, kind="rocketmq")
        for key, threads in (("sync1", 1), ("sync16", 16)):
            r = ref.get(key)
            v = _rate(r["n"], r["put_s"]) if r else None
            if "sync_append" in by:
                by["sync_append"].add(f"{ROCKETMQ} SYNC_FLUSH, {threads} producer thread{'s' * (threads > 1)}", v,
                                      (f"{_fmt_rate(v)} ({r['n'] - r['not_ok']} ok)" if r else missing),
                                      kind="rocketmq")

    def _compare_rows(self, t, by, ref, n, n_sync, built):
        def v(key, prefix):
            for r in (by[key].rows if key in by else []):
                if r.system.startswith(prefix) and r.value:
                    return r.value
            return None

        def text(key, prefix):
            for r in (by[key].rows if key in by else []):
                if r.system.startswith(prefix) and r.value:
                    return r.text
            return ""

        b, s1, s16 = ref.get("bench"), ref.get("sync1"), ref.get("sync16")
        rq = "not built" if not built else "failed"
        pd = _rate(b["n"], b["put_and_dispatch_s"]) if b else None
        one = _rate(b["n"], b["put_s"]) if b else None
        f1 = _rate(s1["n"], s1["put_s"]) if s1 else None
        f16 = _rate(s16["n"], s16["put_s"]) if s16 else None
        disk = text("append_100B", "limit: os.write")
        t.compare += [
            Compare(f"put + dispatch of {n:,} messages: rmqstore MessageBatch of {BATCH} (RocketMQ: one putMessage "
                    f"each, its only way in), until the consume queues and key index are built", pd,
                    v("e2e", "rmqstore MessageBatch put + dispatch"), f"disk write: {disk}" if disk else ""),
            Compare(f"the same, rmqstore given lists of {BATCH} Message objects", pd,
                    v("e2e", "rmqstore put + dispatch"), ""),
            Compare(f"put_message, one message per call ({n:,} messages, async flush)", one,
                    v("append_100B", "rmqstore put_message (1 at a time)"), ""),
            Compare(f"SYNC_FLUSH (each put on disk before it returns), 1 producer thread, {n_sync:,} messages", f1,
                    v("sync_append", "rmqstore SYNC_FLUSH, 1 "),
                    "write + fsync per message: " + text("sync_append", "limit: os.write + fsync per message")),
            Compare(f"SYNC_FLUSH, 16 producer threads, {n_sync:,} messages", f16,
                    v("sync_append", "rmqstore SYNC_FLUSH, 16"),
                    "write + fsync per 16 messages: " + text("sync_append", "limit: os.write + fsync per 16")),
        ]
        for c in t.compare:
            c.rocketmq_text = _fmt_rate(c.rocketmq) if c.rocketmq else rq

    # --- extras ----------------------------------------------------------------------------------
    def spark(self):
        """bench_spark's figures as rows: reads of the same store by Spark (both modes, and from Parquet) and
        without Spark; the ratio is against Spark reading the store by queue."""
        from ...spark import bench_spark
        return spark_table(bench_spark(200_000, work_dir=str(self.work)))

    def server(self):
        """bench_server's figures as rows (msg/s over loopback); the ratio is against async send."""
        from ...broker.server import bench_server
        return server_table(bench_server("full"))


def spark_table(r: dict) -> Table:
    """bench_spark's answer as a table: one row per way of reading, ratios against Spark by queue."""
    t = Table("spark", f"Spark: read {r.get('messages', 0):,} messages of ~{r.get('body_size', 512)} B (the same "
                       f"aggregate each time)", "msg/s", True)
    for key, name, ref in (("spark_queue", "rmqstore Spark data source, by queue (mode=queue)", True),
                           ("spark_commitlog", "rmqstore Spark data source, commitlog order", False),
                           ("spark_parquet", "Spark reading the same messages from Parquet", False),
                           ("local_vectorised_headers", "rmqstore without Spark: headers only (as `stats`)", False),
                           ("local_reader", "rmqstore without Spark: every message decoded", False)):
        rate = r.get(f"{key}_msgs_per_s")
        if rate:
            t.add(name, rate, f"{_fmt_rate(rate)}, {r.get(f'{key}_MB_per_s', 0):,.0f} MB/s, "
                              f"{r.get(f'{key}_seconds', 0):.2f} s", ref=ref, kind="other" if "Parquet" in name else "")
    t.notes.append(f"Store: {r.get('messages', 0):,} messages, {r.get('bytes', 0) / 1e6:,.0f} MB of commitlog, "
                   f"Spark master {r.get('master')} ({r.get('cores')} cores); best of the runs after a warm-up. "
                   f"Writing the Parquet copy took {r.get('parquet_write_seconds', 0):.1f} s "
                   f"({r.get('parquet_MB', 0):,.0f} MB). Rebuilding the consume queues and index: "
                   f"{r.get('rebuild_local_seconds', 0):.2f} s in this process, "
                   f"{r.get('rebuild_spark_seconds', 0):.2f} s "
                   f"as a Spark job ({r.get('rebuild_spark_tasks')} tasks); same answers: "
                   f"{r.get('same_answer')} (reads), {r.get('rebuild_same_queues')} (rebuild).")
    return t


def server_table(r: dict) -> Table:
    """bench_server's answer as a table: async send, sync send, push consume; ratios against async send."""
    t = Table("server", "RocketMQ-protocol server over loopback: a Python client sends and consumes",
              "msg/s", True)
    lat = r.get("sync_send_latency_ms") or {}
    for key, name, ref, extra in (
            ("async_send_msgs_per_s", f"rmqstore server: async send ({r.get('in_flight')} in flight)", True, ""),
            ("sync_send_msgs_per_s", "rmqstore server: sync send, one at a time", False,
             f", latency p50 {lat.get('p50', 0):.2f} ms, p99 {lat.get('p99', 0):.2f} ms" if lat else ""),
            ("push_consume_msgs_per_s", "rmqstore server: push consume", False, "")):
        rate = r.get(key)
        if rate:
            t.add(name, rate, _fmt_rate(rate) + extra, ref=ref)
    cpu = r.get("async_send_cpu_us_per_msg") or {}
    t.notes.append(f"{r.get('messages', 0):,} messages of {r.get('body_size')} B ({r.get('sync_messages', 0):,} "
                   f"for sync send) over {r.get('queues')} queues; async send errors: {r.get('async_send_errors')}; "
                   f"CPU per async send: client {cpu.get('client', '?')} us, server {cpu.get('server', '?')} us; "
                   f"consumed {r.get('consumed', 0):,}; server exit code {r.get('server_exit')}. RocketMQ's own "
                   f"broker was not run (the reference benchmark times its store, not its server).")
    return t
