"""A/B: `rmqstore bench` for two source trees, run alternately on the same machine, as a Markdown table.

    python benchmarks/ab.py --a /tmp/base/src --b src --rounds 3 --scale full

Each round runs A then B (then the next round B then A, so neither always goes first), each a fresh
process with PYTHONPATH set to its tree. The table gives each workload's median msg/s (wall clock and per
CPU second) over the rounds, the ratio B / A, and every run's figure, so that noise is visible.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def run(src: str, args: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    cmd = [sys.executable, "-m", "rmqstore", "bench", "--scale", args.scale, "--workload", args.workloads]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, cwd="/tmp")
    if out.returncode != 0:
        raise SystemExit(f"{src}: rmqstore bench failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)["workloads"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="source tree A (the directory holding the rmqstore package)")
    p.add_argument("--b", required=True, help="source tree B")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scale", default="small", choices=("small", "full"))
    p.add_argument("--workloads", default="put,put_batch,put_columns,e2e")
    args = p.parse_args()
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    t0 = time.time()
    for r in range(args.rounds):
        for side in ("AB" if r % 2 == 0 else "BA"):
            runs[side].append(run(args.a if side == "A" else args.b, args))
            print(f"round {r + 1} {side} done ({time.time() - t0:.0f} s)", file=sys.stderr)
    print(f"| workload | A msg/s (median) | B msg/s (median) | B / A | A per CPU s | B per CPU s | B / A (CPU) "
          f"| A runs | B runs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in args.workloads.split(","):
        a = [x[w]["msgs_per_s"] for x in runs["A"]]
        b = [x[w]["msgs_per_s"] for x in runs["B"]]
        ac = [x[w].get("msgs_per_cpu_s") or 0 for x in runs["A"]]
        bc = [x[w].get("msgs_per_cpu_s") or 0 for x in runs["B"]]
        ma, mb, mac, mbc = (statistics.median(v) for v in (a, b, ac, bc))
        print(f"| {w} | {ma:,.0f} | {mb:,.0f} | {mb / ma:.2f} | {mac:,.0f} | {mbc:,.0f} | "
              f"{(mbc / mac) if mac else 0:.2f} | {', '.join(f'{x:,}' for x in a)} | {', '.join(f'{x:,}' for x in b)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
