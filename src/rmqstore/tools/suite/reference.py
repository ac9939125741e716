"""The workloads of the suite measured elsewhere: RocketMQ 4.4.0's own store (same run), Spark, the server."""
from __future__ import annotations


from .appends import FLOOR_ROW, sync_floor_row
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
                    v("append_100B", "rmqstore put_message (1 at a time)"),
                    _limit("a put's unavoidable Python steps: ", text("append_100B", FLOOR_ROW))),
            Compare(f"SYNC_FLUSH (each put on disk before it returns), 1 producer thread, {n_sync:,} messages", f1,
                    v("sync_append", "rmqstore SYNC_FLUSH, 1 "),
                    _limits(("write + fsync per message: ", text("sync_append", "limit: os.write + fsync per message")),
                            ("the plainest durable Python put: ", text("sync_append", sync_floor_row(1))))),
            Compare(f"SYNC_FLUSH, 16 producer threads, {n_sync:,} messages", f16,
                    v("sync_append", "rmqstore SYNC_FLUSH, 16"),
                    _limits(("write + fsync per 16 messages: ", text("sync_append", "limit: os.write + fsync per 16")),
                            ("16 Python threads, plainest group commit: ", text("sync_append", sync_floor_row(16))))),
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

    def ha(self):
        """Master/slave pairs (suite/ha_bench.py): rmqstore's beside RocketMQ 4.4.0's, with its Java producer."""
        from .ha_bench import bench_ha, ha_table
        return ha_table(bench_ha(self.dir("ha")))

    def grpc(self):
        """bench_grpc's figures (the official Python 5.x client over gRPC) beside the remoting rows of the
        server step (this run's; measured here when that step did not run); ratios against remoting async send."""
        from ...broker.bench_grpc import bench_grpc
        remoting = next((t for t in self.tables if t.key == "server" and t.ref_value()), None)
        remoting_error, measured_here = None, remoting is None
        if remoting is None:
            from ...broker.server import bench_server
            try:
                remoting = server_table(bench_server("full"))
            except Exception as e:  # noqa: BLE001 - reported as a row; the gRPC figures are still measured
                remoting_error = e
        try:     # a step of the full scale; at the other scales (tests) a few hundred messages
            full = bool(self.p["extras"])
            t = grpc_table(bench_grpc("full" if full else 300, sync_messages=None if full else 50), remoting)
        except Exception as e:  # noqa: BLE001 - the remoting rows stay; the error is the gRPC row
            t = grpc_table({}, remoting)
            t.error("rmqstore server, gRPC (official 5.x client)", e)
        if remoting_error is not None:
            t.error("rmqstore server, remoting (bench_server, run in this step)", remoting_error)
        elif measured_here:
            t.notes.insert(0, "The remoting rows were measured in this step (the server step did not run).")
        return t


def _limit(label: str, text: str) -> str:
    """A limit column's text: the label and the limit row's figure, or nothing when that row is missing."""
    return label + text if text else ""


def _limits(*pairs: tuple[str, str]) -> str:
    """Several limits in one column (_limit each, the missing ones left out)."""
    return "; ".join(x for x in (_limit(label, text) for label, text in pairs) if x)


def spark_table(r: dict) -> Table:
    """bench_spark's answer as a table: each query beside Spark reading the same rows from Parquet (compare:
    msg/s, ratio rmqstore / Parquet; the Python data source API's floor too, as limit rows), then reads
    without Spark as rows (ratios against Spark by queue)."""
    n = r.get("messages", 0)
    t = Table("spark", f"Spark: read {n:,} messages of ~{r.get('body_size', 512)} B, each query beside "
                       "Spark reading the same rows from Parquet", "msg/s", True)
    for q in r.get("queries", []):
        ours, theirs = q["rmqstore_seconds"], q["parquet_seconds"]
        c = Compare(q["query"], n / theirs if theirs else None, n / ours if ours else None,
                    rocketmq_text=f"{_fmt_rate(n / theirs)} ({theirs:.2f} s)" if theirs else "not measured",
                    rmqstore_text=f"{_fmt_rate(n / ours)} ({ours:.2f} s)" if ours else "not measured")
        c.limit = "" if q.get("same", True) else "DIFFERENT ANSWERS"
        t.compare.append(c)
    for key, name, ref, kind in (
            ("spark_queue", "rmqstore Spark data source, by queue (mode=queue)", True, ""),
            ("spark_commitlog", "rmqstore Spark data source, commitlog order", False, ""),
            ("spark_parquet", "Spark reading the same messages from Parquet", False, "other"),
            ("local_vectorised_headers", "rmqstore without Spark: headers only (as `stats`)", False, ""),
            ("local_reader", "rmqstore without Spark: every message decoded", False, "")):
        rate = r.get(f"{key}_msgs_per_s")
        if rate:
            t.add(name, rate, f"{_fmt_rate(rate)}, {r.get(f'{key}_MB_per_s', 0):,.0f} MB/s, "
                              f"{r.get(f'{key}_seconds', 0):.2f} s", ref=ref, kind=kind)
    t.notes.append(f"Store: {n:,} messages, {r.get('bytes', 0) / 1e6:,.0f} MB of commitlog, "
                   f"Spark master {r.get('master')} ({r.get('cores')} cores); best of the runs after a warm-up. "
                   "Spark 4.3's Python data source API has no column pruning: a read builds every column "
                   "unless option `columns` names those the query needs; the limit rows are what that API costs "
                   "before any RocketMQ work (no file read, no parsing: rows already in Arrow), each run "
                   "alternately with Parquet like every query: their ratio is the best any Python data source "
                   "can reach here. Parquet's count() reads only its footers. "
                   f"Writing the Parquet copy took {r.get('parquet_write_seconds', 0):.1f} s "
                   f"({r.get('parquet_MB', 0):,.0f} MB). Rebuilding the consume queues and index: "
                   f"{r.get('rebuild_local_seconds', 0):.2f} s in this process, "
                   f"{r.get('rebuild_spark_seconds', 0):.2f} s "
                   f"as a Spark job ({r.get('rebuild_spark_tasks')} tasks); same answers: "
                   f"{r.get('same_answer')} (reads), {r.get('rebuild_same_queues')} (rebuild).")
    if r.get("trigger_live_ms") is not None:
        t.notes.append(f"A stream's latestOffset (asked before every micro-batch; goal under 100 ms): the first "
                       f"{r['trigger_first_ms']:,.0f} ms (the stopped store's recovery emulated once), then "
                       f"{r['trigger_stopped_ms']:.1f} ms while the store is unchanged, {r['trigger_live_ms']:.1f} ms "
                       "while a writer (MessageStore) holds it open and appends 100 messages between triggers (medians of "
                       f"20; the appends seen: {r.get('trigger_live_sees_appends')}).")
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


GRPC_ROWS = (("send_async_msgs_per_s", "async send ({in_flight} in flight)", ""),
             ("send_sync_msgs_per_s", "sync send, one at a time", "send_sync_latency_ms"),
             ("receive_ack_msgs_per_s", "SimpleConsumer receive (batches of {batch}, long polling) + ack each", ""))


def grpc_table(r: dict, remoting: Table | None) -> Table:
    """bench_grpc's answer beside the remoting rows of server_table (remoting: that table, None if not
    measured); ratios against the remoting async send."""
    t = Table("grpc", "RocketMQ 5 gRPC beside 4.x remoting, over loopback: the official Python 5.x client "
                      "against `rmqstore serve`", "msg/s", True)
    for row in (remoting.rows if remoting else []):
        if row.value:
            name = row.system.replace("rmqstore server: ", "rmqstore server, remoting (rmqstore.client): ")
            t.add(name, row.value, row.text, ref=row.system.startswith("rmqstore server: async send"))
    if remoting is None or not t.ref_value():
        t.notes.append("The remoting rows were not measured (bench_server failed or did not run): no ratios.")
    for key, what, lat_key in GRPC_ROWS:
        rate = r.get(key)
        if rate:
            lat = r.get(lat_key) or {}
            extra = f", latency p50 {lat.get('p50', 0):.2f} ms, p99 {lat.get('p99', 0):.2f} ms" if lat else ""
            t.add("rmqstore server, gRPC (official 5.x client): " + what.format(**{"in_flight": r.get("in_flight"),
                                                                                  "batch": r.get("batch")}),
                  rate, _fmt_rate(rate) + extra)
    for key, what in (("limit_grpc_unary_async_msgs_per_s", f"{r.get('in_flight')} in flight"),
                      ("limit_grpc_unary_sync_msgs_per_s", "one at a time")):
        rate = r.get(key)
        if rate:
            t.add(f"limit: grpcio unary round trips to an echo handler (grpc.aio server), {what}", rate,
                  f"{_fmt_rate(rate)} ({r.get('limit_grpc_calls', 0):,} calls of {r.get('limit_grpc_payload')} B)")
    if r:
        t.notes.append(_grpc_note(r))
    return t


def _grpc_note(r: dict) -> str:
    """The note under the grpc table: sizes, the exactly-once counts, CPU per message, what the limit rows are."""
    cs, cr = r.get("send_async_cpu_us_per_msg") or {}, r.get("receive_ack_cpu_us_per_msg") or {}
    ce = r.get("limit_grpc_unary_async_cpu_us_per_call") or {}
    return (f"gRPC: {r.get('messages', 0):,} messages of {r.get('body_size')} B ({r.get('sync_messages', 0):,} for "
            f"sync send) over {r.get('queues')} queues with {r.get('client', 'the official Python client')} "
            f"(Producer.send / send_async, SimpleConsumer.receive + ack); acked exactly once: {r.get('acked', 0):,} "
            f"of {r.get('messages', 0):,}, none again after ({r.get('redelivered_after_all_acked')} redelivered), "
            f"in {r.get('receive_calls', 0):,} receive calls; CPU per async send: client {cs.get('client', '?')} us, "
            f"server {cs.get('server', '?')} us; per receive + ack: client {cr.get('client', '?')} us, server "
            f"{cr.get('server', '?')} us; server exit code {r.get('server_exit')}. Acks are one call each: the "
            f"client's ack_async gives no future. The limit rows: grpcio alone on this machine (a grpc.aio server "
            f"process answering each request with itself, a plain grpc channel calling it): the per-call cost "
            f"every grpcio server and client pay before any RocketMQ work (CPU per call, {r.get('in_flight')} in "
            f"flight: client {ce.get('client', '?')} us, server {ce.get('server', '?')} us).")
