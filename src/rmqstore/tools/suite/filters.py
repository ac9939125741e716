"""The `sql92` step of the suite: pulls of a 1 %-selective SQL92 selector with the consume queue extension's
bit maps (enableConsumeQueueExt + enableCalcFilterBitMap: a miss is skipped without reading the message),
the same selector without them (every message read and evaluated), and the 1 % tag filter (the consume
queue's tags code); plus what computing the bit maps costs the dispatcher."""
from __future__ import annotations

import time

from .common import TOPIC, QUEUES, Table, _NoGC, _dispatch_all, _fmt_rate, _open, _rate, _rmq_config

SELECTOR = "a = 7"          # 1 % of the messages: property a is i % 100, tag T<i % 100>
TAG = "T7"


class FilterWorkloads:
    """benchsuite.Suite's `sql92` workload (self: the Suite)."""

    def sql92(self):
        from ...filter.consumer_filter import ConsumerFilterManager, ExpressionMessageFilter
        from ...messaging.consumer import SubscriptionData
        from ...store.format.message import Message
        n = max(2000, self.p["n_100"] // 10)
        t = Table("sql92", f"SQL92 filtering: pulls of a 1 % selector over {n:,} messages (32 at a time, "
                  "every queue to its end)", "msg/s", True)
        msgs = [Message(TOPIC, b"x" * 100, queue_id=i % QUEUES,
                        properties={"a": str(i % 100), "b": "red" if i % 2 else "blue", "TAGS": f"T{i % 100}"})
                for i in range(n)]
        plain = _open(self.dir("sql92-plain"), _rmq_config(self.p))
        self.state.setdefault("stores", []).append(plain)
        plain_s = self._sql92_put_into(plain, msgs, None)
        ext_cfg = _rmq_config(self.p, enable_consume_queue_ext=True)
        filters = ConsumerFilterManager()
        filters.register(TOPIC, "bench", SELECTOR, "SQL92", 1)
        time.sleep(0.002)       # messages stored after the group registered: their bit maps know it
        store = _open(self.dir("sql92-ext"), ext_cfg)
        self.state.setdefault("stores", []).append(store)
        ext_s = self._sql92_put_into(store, msgs, filters)
        data = filters.get(TOPIC, "bench")
        want = n // 100 + (1 if n % 100 > 7 else 0)
        cases = [("rmqstore SQL92 selector, bit map pre-filter (enableCalcFilterBitMap)",
                  ExpressionMessageFilter(data.compiled, data, filters.bloom), True),
                 ("rmqstore SQL92 selector, no bit map (every message read)",
                  ExpressionMessageFilter(data.compiled), False),
                 ("rmqstore tag filter (tags code in the ext unit)", SubscriptionData.build(TOPIC, TAG), False)]
        cases = [(name, flt, ref, store) for name, flt, ref in cases] + [
            ("rmqstore tag filter, store without the extension (tags code in the consume queue)",
             SubscriptionData.build(TOPIC, TAG), False, plain)]
        for name, flt, ref, st in cases:
            got, el = self._sql92_pull_all(st, flt)
            assert got == want, (name, got, want)
            t.add(name, _rate(n, el), f"{_fmt_rate(_rate(n, el))} scanned, {got:,} delivered in {el * 1000:,.0f} ms",
                  ref=ref)
        t.add("rmqstore put + dispatch, plain store", _rate(n, plain_s), _fmt_rate(_rate(n, plain_s)), chart=False)
        t.add("rmqstore put + dispatch, ext units + bit maps (1 SQL92 group)", _rate(n, ext_s),
              _fmt_rate(_rate(n, ext_s)), chart=False)
        t.notes.append(f"Selector {SELECTOR!r} and tag {TAG!r} each match 1 % of the messages (4 queues). The first "
                       "three rows read the same store (enableConsumeQueueExt): without a bit map every message "
                       "is read from the commitlog, decoded and evaluated; with it a miss costs its share of a "
                       "batched ext unit read and 3 bit tests (a bloom filter: false positives are evaluated); "
                       "the tag filter takes its tags codes from the ext units there, from the consume queue "
                       "in a store without the extension (fourth row). The last two rows: what writing the ext "
                       "units and evaluating the selector at dispatch costs (put_messages of 1,000 and a "
                       "synchronous dispatch, per message).")
        return t

    @staticmethod
    def _sql92_put_into(store, msgs, filters) -> float:
        if filters is not None:
            store.consume_queue_ext.bit_map_calculator = filters.bit_maps
        with _NoGC():
            t0 = time.perf_counter()
            for i in range(0, len(msgs), 1000):
                store.put_messages(msgs[i:i + 1000])
            _dispatch_all(store)
            return time.perf_counter() - t0

    @staticmethod
    def _sql92_pull_all(store, flt) -> tuple[int, float]:
        got = 0
        with _NoGC():
            t0 = time.perf_counter()
            for q in range(QUEUES):
                off = 0
                while True:
                    r = store.get_message("bench", TOPIC, q, off, 32, flt)
                    got += len(r.messages)
                    if r.next_begin_offset >= r.max_offset or r.next_begin_offset <= off:
                        break
                    off = r.next_begin_offset
            return got, time.perf_counter() - t0
