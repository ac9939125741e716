"""A recording relay between RocketMQ 4.4.0's Java clients and RocketMQ's own broker: how
tests/data/acl/java-4.4.0.jsonl.gz was made (the Java side cannot be built in CI, so what it sent and what
RocketMQ answered is replayed from that file by tests/acl/test_acl_replay.py).

    python tests/acl_relay.py --namesrv 127.0.0.1:32876 --ns-listen 32877 \
        --broker 127.0.0.1:32911 --listen 32951 --acl-file HOME/conf/plain_acl.yml --out DIR

- The broker is started with namesrvAddr=127.0.0.1:NS_LISTEN: its REGISTER_BROKER / UNREGISTER_BROKER go
  through this relay, which rewrites `brokerAddr` to 127.0.0.1:LISTEN, so the clients' routes lead here.
- 127.0.0.1:LISTEN and LISTEN-2 (the VIP port) forward to the broker's listenPort and listenPort-2 byte for
  byte; every client request and the broker's answer to it (paired by opaque) is written to DIR/frames.jsonl:
  {"t": ms since start, "port": "main"|"vip", "conn": n, "request": base64 frame, "code": answer code,
   "remark": answer remark, "acl": version of the ACL file in force}.
- The ACL file is looked at every 20 ms; each content it had is DIR/acl-VERSION.yml.
Stops on SIGTERM / SIGINT.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import itertools
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rmqstore.remoting.codes import RequestCode  # noqa: E402
from rmqstore.remoting.command import FrameDecoder  # noqa: E402


class Recorder:
    def __init__(self, out: Path, acl_file: Path):
        self.out = out
        self.acl_file = acl_file
        self.t0 = time.monotonic()
        self.version = -1
        self.digest = None
        self.fh = open(out / "frames.jsonl", "a")
        self.conns = itertools.count(1)

    def now_ms(self) -> int:
        return int((time.monotonic() - self.t0) * 1000)

    def look(self) -> None:
        try:
            data = self.acl_file.read_bytes()
        except OSError:
            return
        d = hashlib.md5(data).hexdigest()
        if d != self.digest:
            self.digest = d
            self.version += 1
            (self.out / f"acl-{self.version}.yml").write_bytes(data)
            self.fh.write(json.dumps({"t": self.now_ms(), "acl_changed": self.version}) + "\n")
            self.fh.flush()

    def write(self, rec: dict) -> None:
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()


async def pump(reader, writer, on_frame=None, rewrite=None):
    """Copy reader -> writer; on_frame(raw, cmd) sees every frame; rewrite(cmd) may give new bytes."""
    dec = FrameDecoder()
    pending = b""
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            if on_frame is None and rewrite is None:
                writer.write(data)
                continue
            pending += data
            out = []
            while len(pending) >= 4:
                n = int.from_bytes(pending[:4], "big")
                if len(pending) < 4 + n:
                    break
                raw, pending = pending[:4 + n], pending[4 + n:]
                cmd = dec.feed(raw)[0]
                if on_frame is not None:
                    on_frame(raw, cmd)
                if rewrite is not None:
                    new = rewrite(cmd)
                    if new is not None:
                        raw = new
                out.append(raw)
            if out:
                writer.write(b"".join(out))
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--namesrv", required=True)
    p.add_argument("--ns-listen", type=int, required=True)
    p.add_argument("--broker", required=True)
    p.add_argument("--listen", type=int, required=True)
    p.add_argument("--acl-file", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = Recorder(out, Path(a.acl_file))
    rec.look()
    bhost, bport = a.broker.rsplit(":", 1)
    nhost, nport = a.namesrv.rsplit(":", 1)
    relay_addr = f"127.0.0.1:{a.listen}"

    def rewrite_register(cmd):
        if cmd.code in (RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER) and not cmd.flag & 1:
            cmd.ext_fields["brokerAddr"] = relay_addr
            cmd.header = None
            return cmd.encode()
        return None

    async def ns_conn(r, w):
        ur, uw = await asyncio.open_connection(nhost, int(nport))
        await asyncio.gather(pump(r, uw, rewrite=rewrite_register), pump(ur, w))

    def broker_conn(name: str, port: int):
        async def handle(r, w):
            conn = next(rec.conns)
            ur, uw = await asyncio.open_connection(bhost, port)
            asked: dict[int, tuple] = {}

            def on_request(raw, cmd):
                if not cmd.flag & 1:
                    if cmd.flag & 2:      # oneway: no answer comes
                        rec.write({"t": rec.now_ms(), "port": name, "conn": conn, "acl": rec.version,
                                   "request": base64.b64encode(raw).decode(), "code": None, "remark": None})
                    else:
                        asked[cmd.opaque] = (rec.now_ms(), raw, rec.version)

            def on_answer(raw, cmd):
                if cmd.flag & 1:
                    q = asked.pop(cmd.opaque, None)
                    if q is not None:
                        rec.write({"t": q[0], "port": name, "conn": conn, "acl": q[2],
                                   "request": base64.b64encode(q[1]).decode(), "code": cmd.code,
                                   "remark": cmd.remark})
            await asyncio.gather(pump(r, uw, on_frame=on_request), pump(ur, w, on_frame=on_answer))
        return handle

    servers = [await asyncio.start_server(ns_conn, "127.0.0.1", a.ns_listen),
               await asyncio.start_server(broker_conn("main", int(bport)), "127.0.0.1", a.listen),
               await asyncio.start_server(broker_conn("vip", int(bport) - 2), "127.0.0.1", a.listen - 2)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    print(json.dumps({"event": "ready", "broker": relay_addr}), flush=True)
    while not stop.is_set():
        rec.look()
        try:
            await asyncio.wait_for(stop.wait(), 0.02)
        except asyncio.TimeoutError:
            pass
    for s in servers:
        s.close()
    rec.fh.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
