"""`python -m rmqstore.tools.demo` (what `make demo` runs): a short tour on a store in ./demo-store.

1. writes a few messages to demo-store/messages.jsonl (three topics, one of them in Chinese, tags, keys,
   an empty body, a prepared transaction message);
2. runs `rmqstore load`, `rmqstore cat --limit 3` and `rmqstore stats` on them and shows each command line
   followed by its real output (the first lines of it, and how many more there are);
4. the library: a producer sends orders, a consumer group reads them, a key query finds one;
5. the pipeline: Spark reads the store as a DataFrame and streams from it (skipped, with a note, when
   the spark extra is not installed);
6. where the `rmqstore` command is (.venv/bin: not on the PATH until the virtualenv is activated).
"""
from __future__ import annotations

import json
import shlex
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


SHOW_LINES = 4      # lines of each command's output the demo prints; the rest is counted, not invented


def run(args: list[str], stdin_file: Path | None = None, out=print) -> str:
    """Runs `rmqstore ARGS [< stdin_file]` (this interpreter's rmqstore), prints the command line as a shell
    would take it and then the first SHOW_LINES lines of its standard output verbatim (a line
    `  [... N more lines]` says how many are not shown). Returns the whole output; exits on a failure."""
    cmd = [sys.executable, "-m", "rmqstore", *args]
    shown = "$ rmqstore " + " ".join(shlex.quote(a) for a in args)
    out(shown + (f" < {shlex.quote(str(stdin_file))}" if stdin_file is not None else ""))
    stdin = stdin_file.read_text(encoding="utf-8") if stdin_file is not None else None
    res = subprocess.run(cmd, input=stdin, capture_output=True, text=True, encoding="utf-8")
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit(f"demo: `{shown[2:]}` exited with {res.returncode}")
    lines = res.stdout.splitlines()
    for line in lines[:SHOW_LINES]:
        out(line)
    if len(lines) > SHOW_LINES:
        out(f"  [... {len(lines) - SHOW_LINES} more lines]")
    return res.stdout


def command_tour(store: Path = STORE, out=print) -> dict:
    """The command-line part of the demo, in the current directory: writes STORE/messages.jsonl, then runs
    and shows `rmqstore load`, `rmqstore cat --limit 3` and `rmqstore stats` on it. Every line after a `$`
    line is that command's own output (tests/tools/test_demo.py re-runs them and compares)."""
    if store.exists():
        shutil.rmtree(store)
    store.mkdir()
    conf = store / "store.conf"
    conf.write_text(CONFIG)
    msgs = demo_messages()
    jsonl = store / "messages.jsonl"
    jsonl.write_text("".join(json.dumps(m, ensure_ascii=False) + "\n" for m in msgs), encoding="utf-8")
    out(f"== the commands: {len(msgs)} messages (three topics, tags, keys, an empty body, a prepared "
        f"transaction message) written to {jsonl}, RocketMQ's file format with 4 KiB commitlog files ({conf})")
    puts = run(["load", "-c", str(conf), str(store)], stdin_file=jsonl, out=out)
    out("")
    records = run(["cat", "-c", str(conf), "--limit", "3", str(store)], out=out)
    out("")
    files = sorted(p.name for p in (store / "commitlog").iterdir())
    out(f"$ ls {store}/commitlog")
    for f in files:
        out(f)
    out("")
    stats_out = None
    try:
        import pyarrow  # noqa: F401 - `rmqstore stats` (local engine) needs it
    except ImportError:
        out("(pyarrow is not installed: skipping `rmqstore stats`)")
    else:
        stats_out = run(["stats", "-c", str(conf), str(store)], out=out)
    return {"puts": puts, "records": records, "files": files, "stats": stats_out}


def main() -> int:
    command_tour(STORE)
    library_tour()
    pipeline_tour()
    next_steps()
    return 0


def next_steps(out=print) -> None:
    """Where the `rmqstore` command the tour ran is: beside this interpreter (the virtualenv `make` made),
    not on the shell's PATH until that virtualenv is activated."""
    import os
    bin_dir = Path(sys.executable).parent
    rel = os.path.relpath(bin_dir)
    rel = rel if not rel.startswith("..") else str(bin_dir)
    out(f"\n== next: the command line is {rel}/rmqstore: run `{rel}/rmqstore --help`, or `source {rel}/activate` "
        "once in your shell and then `rmqstore --help` (docs/cli.md)")


def library_tour() -> None:
    import threading

    import time

    from ..store.conf.config import StoreConfig
    from ..messaging.consumer import CONSUME_SUCCESS, ConsumeFromWhere, PushConsumer
    from ..store.format.message_batch import MessageBatch
    from ..messaging.producer import Producer
    from ..store.store import MessageStore

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
        from ..spark import demo_pipeline
        import pyspark  # noqa: F401
    except ImportError:
        print("\n(the spark extra is not installed: skipping the Spark pipeline)")
        return
    print("\n== the pipeline: Spark reads and streams the store")
    demo_pipeline(STORE, config=STORE / "store.conf")


if __name__ == "__main__":
    sys.exit(main())
