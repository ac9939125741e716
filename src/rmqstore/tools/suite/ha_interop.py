"""The live interop check of replication against RocketMQ 4.4.0 (not part of `make test`: it needs Java and
../shared/realmq): every mix of master and slave, each driven by RocketMQ's own Java client (HaTool).

    python -m rmqstore.tools.suite.ha_interop [--pairs java:rmq,rmq:java,rmq:rmq,java:java] [--capture DIR]

Per pair (SYNC_MASTER, 64 KiB commitlog files): a send with no slave (SLAVE_NOT_AVAILABLE), the slave's
registration (cluster view), N sync sends (SEND_OK), topics and a committed offset on the slave
(SlaveSynchronize), a send straight to the slave (refused), the slave frozen (FLUSH_SLAVE_TIMEOUT), the
slave caught up, the master's SIGKILL and every key consumed from the slave, then both commitlogs byte for
byte and both stores' dumps. --capture writes a pcap per pair (tcpdump on lo): the Java side's bytes that
tests/store/test_ha_interop.py replays.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from .ha_pair import Pair, clean, commitlogs_equal

FILE = 64 * 1024
N = 1000


def run_pair(work: Path, master: str, slave: str, capture: Path | None, n: int = N) -> dict:
    clean(work)
    out: dict = {"pair": f"{master} master + {slave} slave"}
    dump = None
    if capture is not None:
        capture.mkdir(parents=True, exist_ok=True)
        pcap = capture / f"ha-{master}-master-{slave}-slave.pcap"
        dump = subprocess.Popen(["tcpdump", "-i", "lo", "-s", "0", "-U", "-w", str(pcap),
                                 "port 19876 or portrange 20909-20912 or portrange 21909-21912"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
    pair = Pair(work, master, slave, "SYNC_MASTER", FILE, extra={"syncFlushTimeout": "3000"}, start_slave=False)
    try:
        with pair:
            out["mktopic"] = pair.hatool("mktopic", pair.addr("master"), "HaT", 4)
            out["commit"] = pair.hatool("commit", pair.addr("master"), "ha_cg", "HaT", 0, 17)
            out["no_slave"] = pair.hatool("send", pair.ns, "HaT", 1, 256, 30)
            pair.start("slave")
            pair.wait_link()
            out["cluster"] = pair.hatool("cluster", pair.ns)
            out["send"] = pair.hatool("send", pair.ns, "HaT", n, 256, 600)
            out["waitsync"] = pair.hatool("waitsync", pair.addr("slave"), "HaT", "ha_cg", "HaT", 0, 17, 75)
            out["rawsend"] = pair.hatool("rawsend", pair.addr("slave"), "HaT")
            pair.procs["slave"].signal(signal.SIGSTOP)
            out["frozen"] = pair.hatool("send", pair.ns, "HaT", 1, 256, 60)
            pair.procs["slave"].signal(signal.SIGCONT)
            out["caught_up"] = pair.wait_caught_up()
            end = pair.max_offset("master")
            pair.procs["master"].stop(kill=True)
            time.sleep(2)
            out["route_after_kill"] = pair.hatool("route", pair.ns, "HaT")
            out["consume"] = pair.hatool("consume", pair.ns, "HaT", n, 120, 30)
        out["commitlog"] = commitlogs_equal(pair.store("master"), pair.store("slave"), end or 0, FILE)
        out["dump"] = _dumps_equal(pair, work)
    finally:
        if dump is not None:
            dump.send_signal(signal.SIGINT)
            dump.wait(10)
    return out


def _dumps_equal(pair: Pair, work: Path) -> str:
    conf = work / "dump.conf"
    conf.write_text(f"mappedFileSizeCommitLog={FILE}\n")
    got = []
    for which in ("master", "slave"):
        r = subprocess.run([sys.executable, "-m", "rmqstore", "dump", "-c", str(conf), str(pair.store(which))],
                           capture_output=True)
        if r.returncode != 0:
            return f"{which}: dump failed: {r.stderr.decode(errors='replace')[-300:]}"
        got.append(r.stdout)
    lines = got[0].count(b"\n")
    return f"equal ({lines} lines)" if got[0] == got[1] else "DIFFERENT"


SYNC_CODES = (103, 21, 43, 45, 201)      # REGISTER_BROKER and SlaveSynchronize's four requests


def extract(pcap: Path, out: Path) -> dict:
    """From a capture of a pair: the HA link's two directions (ha-stream.bin.gz: the master's frames;
    ha-reports.bin: the slave's offsets) and the remoting frames of registration and slave sync, with their
    answers (remoting.jsonl: {"src", "dst", "frame"} with the frame in hex), for tests/store/test_ha_interop.py."""
    import gzip
    from ...remoting.pcap import read_frames, read_streams
    out.mkdir(parents=True, exist_ok=True)
    ha = {k: v for k, v in read_streams(pcap).items() if 20912 in (k[0][1], k[1][1])}
    down = max((k for k in ha if k[0][1] == 20912), key=lambda k: len(ha[k]))
    (out / "ha-stream.bin.gz").write_bytes(gzip.compress(ha[down], 9, mtime=0))
    (out / "ha-reports.bin").write_bytes(ha[(down[1], down[0])])
    frames = read_frames(pcap)
    asked = {(f.src, f.dst, f.command.opaque) for f in frames
             if not f.command.is_response and f.command.code in SYNC_CODES}
    kept = [f for f in frames if (not f.command.is_response and f.command.code in SYNC_CODES)
            or (f.command.is_response and (f.dst, f.src, f.command.opaque) in asked)]
    with open(out / "remoting.jsonl", "w") as fh:
        for f in kept:
            fh.write(json.dumps({"src": f.src[1], "dst": f.dst[1], "frame": f.raw.hex()}) + "\n")
    return {"stream": len(ha[down]), "reports": len(ha[(down[1], down[0])]), "frames": len(kept)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rmqstore.tools.suite.ha_interop", description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", default="java:rmq,rmq:java,rmq:rmq,java:java")
    p.add_argument("--work", default="/tmp/rmqstore-ha-interop")
    p.add_argument("--capture", default=None, help="write a pcap per pair into this directory")
    p.add_argument("-n", type=int, default=N)
    p.add_argument("--extract", nargs=2, metavar=("PCAP", "DIR"), help="only: write test data from a capture")
    args = p.parse_args(argv)
    if args.extract:
        print(json.dumps(extract(Path(args.extract[0]), Path(args.extract[1]))))
        return 0
    results = []
    for spec in args.pairs.split(","):
        master, slave = spec.split(":")
        r = run_pair(Path(args.work) / spec.replace(":", "-"), master, slave,
                     Path(args.capture) if args.capture else None, args.n)
        print(json.dumps(r), flush=True)
        results.append(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
