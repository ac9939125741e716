"""The store lifecycle workloads of the suite: restart, end to end with the dispatcher, long polling."""
from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

from ..bench import batch_columns, generate_messages
from ...store.format.message_batch import MessageBatch
from .common import TOPIC, QUEUES, BATCH, Table, _rate, _fmt_rate, _NoGC, _rmq_config, _open


class LifecycleWorkloads:
    """benchsuite.Suite's workloads: restart, end to end, long polling; each returns a Table (self: the Suite)."""

    # --- restart ---------------------------------------------------------------------------------
    def restart(self):
        from ...store.store import MessageStore
        s = self.state.pop("rmq")
        self.state["stores"].remove(s)
        path = self.state["rmq_path"]
        cfg = s.config
        s.close()
        n = self.p["n_100"]
        t = Table("restart", f"Restart: MessageStore.open of a store holding {n:,} messages", "s", False)
        t0 = time.perf_counter()
        s = MessageStore.open(path, cfg)
        el = time.perf_counter() - t0
        t.add("rmqstore open after clean shutdown", el, f"{el:.3f} s", ref=True)
        s.close()
        # a child opens the store, appends a batch more, reports, and is SIGKILLed (RocketMQ #1258's case)
        code = (
            "import sys\n"
            "from rmqstore.store.store import MessageStore\n"
            "from rmqstore.store.conf.config import StoreConfig\n"
            "from rmqstore.tools.bench import generate_messages\n"
            f"cfg = StoreConfig(mapped_file_size_commit_log={cfg.mapped_file_size_commit_log})\n"
            f"s = MessageStore.open({str(path)!r}, cfg)\n"
            f"ms = generate_messages(2000, 100, {QUEUES}, {TOPIC!r})\n"
            "for i in range(0, 2000, 500):\n"
            "    s.put_messages(ms[i:i + 500])\n"
            "print('READY', flush=True)\n"
            "import time\n"
            "time.sleep(60)\n")
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            line = child.stdout.readline()
            if "READY" not in line:
                raise RuntimeError(f"child did not get ready: {line!r}")
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            child.stdout.close()
        t0 = time.perf_counter()
        s = MessageStore.open(path, cfg)
        el = time.perf_counter() - t0
        rep = s.recovery_report
        try:
            summary = rep.summary()
        except Exception:  # noqa: BLE001
            summary = ""
        total = sum(s.get_max_offset_in_queue(TOPIC, q) for q in range(QUEUES))
        t.add("rmqstore open after SIGKILL", el, f"{el:.3f} s ({total:,} messages in the queues after recovery)")
        s.close()
        if summary:
            t.notes.append(f"recovery after SIGKILL: {summary}")
        t.notes.append("After SIGKILL the child had appended 2,000 messages more to the store, its dispatcher "
                       "possibly behind; open = lock, recovery (CRC checks from the checkpoint's file), "
                       "re-dispatch of what the dead dispatcher had not noted, services started.")
        return t

    # --- end to end ------------------------------------------------------------------------------
    def e2e(self):
        n = self.p["e2e"]
        t = Table("e2e", f"End to end: {n:,} messages of 100 B put in batches of {BATCH} while the dispatcher builds "
                         "the consume queues and key index, until all are dispatched", "msg/s", True)
        msgs = generate_messages(n, 100, QUEUES, TOPIC)
        batches = [msgs[i:i + BATCH] for i in range(0, n, BATCH)]
        for name, inputs, ref in (("rmqstore put + dispatch", batches, True),
                                  ("rmqstore MessageBatch put + dispatch", [batch_columns(b) for b in batches], False)):
            d = self.dir("e2e")
            s = _open(d, _rmq_config(self.p), services=True)
            lags = []
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    lags.append(s.dispatch_behind_bytes())
                    stop.wait(0.01)

            sampler = threading.Thread(target=sample, daemon=True)
            columns = not ref
            with _NoGC():
                sampler.start()
                t0 = time.perf_counter()
                for b in inputs:
                    s.put_messages(MessageBatch(**b) if columns else b)
                t_put = time.perf_counter() - t0
                ok = s.wait_dispatched(timeout=600)
                el = time.perf_counter() - t0
                stop.set()
                sampler.join()
            s.close()
            shutil.rmtree(d, ignore_errors=True)
            lag_txt = (f"lag max {max(lags) / 1e6:,.1f} MB, mean {statistics.fmean(lags) / 1e6:,.1f} MB "
                       f"({len(lags)} samples)") if lags else "no lag samples"
            t.add(name, _rate(n, el),
                  f"{_fmt_rate(_rate(n, el))} (puts alone {_fmt_rate(_rate(n, t_put))}; {lag_txt})"
                  + ("" if ok else " NOT DISPATCHED"), ref=ref)
        return t

    # --- long polling ----------------------------------------------------------------------------
    def long_poll(self):
        from ...messaging.consumer import measure_long_polling_latency
        n = self.p["longpoll"]
        t = Table("long_poll", f"Long polling: put to PushConsumer listener, {n} messages one at a time", "ms", False)
        d = self.dir("longpoll")
        r = measure_long_polling_latency(d, n=n)
        shutil.rmtree(d, ignore_errors=True)
        t.add("rmqstore median", r["median_ms"], f"{r['median_ms']:.3f} ms", ref=True)
        t.add("rmqstore p99", r["p99_ms"], f"{r['p99_ms']:.3f} ms")
        return t
