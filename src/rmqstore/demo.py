"""`python -m rmqstore.demo` (what `make demo` runs): a store in ./demo-store, filled and read back
through the command line.

1. generates a few messages in the messages.jsonl format (two topics, tags, keys, a unicode topic,
   an empty body, a prepared transaction message);
2. `rmqstore load ./demo-store` appends them and prints one put result each;
3. `rmqstore cat ./demo-store` decodes the records back in physical order.
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
