"""`python -m rmqstore.demo` (what `make demo` runs): a short tour on a store in ./demo-store.

1. generates a few messages in the messages.jsonl format (two topics, tags, keys, a unicode topic,
   an empty body, a prepared transaction message);
2. `rmqstore load ./demo-store` appends them and prints one put result each;
3. `rmqstore cat ./demo-store` decodes the records back in physical order;
4. the library: a producer sends orders, a consumer group reads them, a key query finds one;
5. the pipeline: Spark reads the store as a DataFrame and streams from it (skipped, with a note, when
   rmqstore[spark] is not installed).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

STORE = Path("demo-store")
CONFIG = "mapedFileSizeCommitLog=4096\n"   # tiny files, so the demo rolls over to a second one


def demo_messages(n: int = 24) -> list[dict]:
    topics = ["TopicA", "TopicB", "订单Topic"]
    out = []
    for i in range(n):
        props = {"UNIQ_KEY": f"DEMO{i:028d}", "TAGS": "TagA" if i % 2 else "TagB"}
        if i % 3 == 0:
            props["KEYS"] = f"order-{i} user-{i % 5}"
        out.append({
            "topic": topics[i % len(topics)], "queueId": i % 2, "flag": 0,
            "sysFlag": 4 if i == 7 else 0,               # one prepared transaction message
            "bornTimestamp": 1_700_000_000_000 + i, "bornHost": "10.0.0.1:50000", "storeHost": "127.0.0.1:10911",
            "reconsumeTimes": 0, "preparedTransactionOffset": 0, "properties": props,
            "body": "" if i == 5 else f"hello #{i} ".encode().hex() * 4,
        })
    return out


def run(args: list[str], stdin: str | None = None) -> str:
    cmd = [sys.executable, "-m", "rmqstore", *args]
    print("$ rmqstore " + " ".join(args) + (" < messages.jsonl" if stdin is not None else ""), flush=True)
    res = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit(f"demo: `rmqstore {' '.join(args)}` exited with {res.returncode}")
    return res.stdout


def main() -> int:
    if STORE.exists():
        shutil.rmtree(STORE)
    STORE.mkdir()
    (STORE / "store.conf").write_text(CONFIG)
    msgs = demo_messages()
    jsonl = "".join(json.dumps(m, ensure_ascii=False) + "\n" for m in msgs)

    puts = run(["load", "-c", str(STORE / "store.conf"), str(STORE)], stdin=jsonl)
    for line in puts.splitlines()[:5]:
        print("  " + line)
    print(f"  ... {len(puts.splitlines())} put results\n")

    records = run(["cat", str(STORE)])
    print(f"{'offset':>7} {'size':>4}  {'topic':<10} {'q':>1} {'qoff':>4} {'sysFlag':>7}  properties / body")
    for line in records.splitlines():
        r = json.loads(line)
        props = r["properties"].replace("\x01", "=").replace("\x02", " ").strip()
        body = bytes.fromhex(r["body"]).decode(errors="replace")[:24]
        print(f"{r['commitLogOffset']:>7} {r['storeSize']:>4}  {r['topic']:<10} {r['queueId']:>1} "
              f"{r['queueOffset']:>4} {r['sysFlag']:>7}  {props[:60]} | {body!r}")
    files = sorted(p.name for p in (STORE / "commitlog").iterdir())
    print(f"\n{len(records.splitlines())} records in {STORE}/commitlog: {', '.join(files)}")
    library_tour()
    pipeline_tour()
    return 0


def library_tour() -> None:
    import threading

    import time

    from .config import StoreConfig
    from .consumer import CONSUME_SUCCESS, ConsumeFromWhere, PushConsumer
    from .message_batch import MessageBatch
    from .producer import Producer
    from .store import MessageStore

    print("\n== the library: a producer and a consumer group")
    cfg = StoreConfig.load(STORE / "store.conf")
    with MessageStore.open(STORE, cfg) as store:
        producer = Producer(store, group="demo-producer")
        for i in range(8):
            r = producer.send("Orders", f"order {i}", tags="paid" if i % 2 else "new", keys=[f"order-{i}"])
            print(f"  sent {r.msg_id} to queue {r.message_queue.queue_id} at offset {r.queue_offset}")
        got: list = []
        done = threading.Event()

        def on_messages(msgs):
            got.extend(msgs)
            if len(got) >= 4:
                done.set()
            return CONSUME_SUCCESS

        consumer = PushConsumer(store, "demo-consumers", on_messages,
                                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        consumer.subscribe("Orders", "paid")
        consumer.start()
        done.wait(10)
        consumer.shutdown()
        print("  consumer group 'demo-consumers' (tag 'paid') got:",
              sorted(m.body.decode() for m in got))
        found = store.find_messages_by_key("Orders", "order-3")
        print("  query by key order-3:", [(m.queue_id, m.queue_offset, m.body.decode()) for m in found])


    # a batch given as columns, the fastest way in (in a store of RocketMQ's default geometry: the demo
    # store's 4 KiB files would hold 15 messages each)
    with MessageStore.open(STORE / "batch-store", StoreConfig()) as store:
        n = 100_000
        batch = MessageBatch("Clicks", [b"click %d" % i for i in range(n)], queue_ids=[i % 4 for i in range(n)],
                             tags="web", keys=[f"click-{i}" for i in range(n)])
        t0 = time.perf_counter()
        rs = store.put_messages(batch)
        put_s = time.perf_counter() - t0
        store.wait_dispatched()
        print(f"  MessageBatch of {n:,} messages: all ok {rs.all_ok}, put in {put_s * 1000:.0f} ms, "
              f"dispatched after {(time.perf_counter() - t0) * 1000:.0f} ms; 'click-77' is at queue offset "
              f"{store.find_messages_by_key('Clicks', 'click-77')[-1].queue_offset} of queue 1")


def pipeline_tour() -> None:
    try:
        from .spark import demo_pipeline
        import pyspark  # noqa: F401
    except ImportError:
        print("\n(rmqstore[spark] is not installed: skipping the Spark pipeline)")
        return
    print("\n== the pipeline: Spark reads and streams the store")
    demo_pipeline(STORE, config=STORE / "store.conf")


if __name__ == "__main__":
    sys.exit(main())
