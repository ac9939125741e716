"""The `acl` step of the suite: what plain ACL costs. `rmqstore serve` with aclEnable=true and rmqstore.client
signing every request (HmacSHA1, checked per request by the server), beside the same run with ACL off: async
and sync sends, CPU per send on each side; and, in process, one check and one signature alone."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from .common import Table, _fmt_rate

RULES = """\
accounts:
- accessKey: benchAdmin01
  secretKey: benchAdminSecret01
  admin: true
- accessKey: benchUser01
  secretKey: benchSecret01
  defaultTopicPerm: DENY
  defaultGroupPerm: DENY
  topicPerms: [BenchAclTopic=PUB|SUB, BenchAclTopic_sync=PUB|SUB]
  groupPerms: [bench_acl_cg=SUB]
"""
TOPIC = "BenchAclTopic"


def _round(acl: bool, work: Path, n: int, n_sync: int, body: bytes, in_flight: int, queues: int) -> dict:
    """One server (ACL on or off), async then sync sends: the figures."""
    from ...acl import SessionCredentials
    from ...broker.bench import cpu_seconds, cpu_us_per_msg, timed_sends
    from ...broker.process import ServerProcess
    from ...client import Admin, Message, Producer
    conf = {"mappedFileSizeCommitLog": 256 << 20, "autoCreateTopicEnable": "false"}
    user = admin = None
    if acl:
        (work / "home" / "conf").mkdir(parents=True, exist_ok=True)
        f = work / "home" / "conf" / "plain_acl.yml"
        f.write_text(RULES)
        os.chmod(f, 0o600)
        conf.update({"aclEnable": "true", "rocketmqHome": str(work / "home")})
        user = SessionCredentials("benchUser01", "benchSecret01")
        admin = SessionCredentials("benchAdmin01", "benchAdminSecret01")
    srv = ServerProcess(work / "store", conf).start()
    out: dict = {}
    try:
        with Admin(srv.namesrv_addr, credentials=admin) as a:
            a.create_topic(TOPIC, queues)
            a.create_topic(TOPIC + "_sync", queues)
        p = Producer("bench_acl_pg", srv.namesrv_addr, max_async_in_flight=in_flight, credentials=user).start()
        try:
            for f in [p.send_async(Message(TOPIC + "_sync", body)) for _ in range(min(500, n))]:      # warm-up
                f.result(30)
            cpu0 = (cpu_seconds(), cpu_seconds(srv.proc.pid))
            t0 = time.perf_counter()
            ok = 0
            for f in [p.send_async(Message(TOPIC, body)) for _ in range(n)]:
                try:
                    f.result(60)
                    ok += 1
                except Exception:  # noqa: BLE001 - counted
                    pass
            out["async_msgs_per_s"] = round(ok / (time.perf_counter() - t0))
            out["async_errors"] = n - ok
            out["async_cpu_us_per_msg"] = cpu_us_per_msg(cpu0, (cpu_seconds(), cpu_seconds(srv.proc.pid)), n)
            out["sync_msgs_per_s"], out["sync_latency_ms"] = timed_sends(
                lambda: p.send(Message(TOPIC + "_sync", body)), n_sync)
        finally:
            p.shutdown()
    finally:
        out["server_exit"] = srv.stop()
    return out


def _per_call_us(fn, items, repeats: int = 7) -> float:
    """Microseconds per fn(item), the fastest of `repeats` passes over items (timeit's rule: the other
    passes measured what else ran on the machine)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for x in items:
            fn(x)
        best = min(best, time.perf_counter() - t0)
    return round(best / len(items) * 1e6, 2)


def check_costs(body_size: int = 256, n: int = 3_000) -> dict:
    """Microseconds per operation, in process: signing a SEND_MESSAGE_V2 (client), checking it (server:
    lookup, HmacSHA1 over the sorted fields and the body, permissions), checking a gRPC call's metadata;
    beside decoding the same request's frame (what every request costs anyway)."""
    from ...acl import PlainAccessValidator, SessionCredentials, parse_plain_acl
    from ...acl.signature import RemotingSigner, grpc_authorization
    from ...remoting.command import FrameDecoder, RemotingCommand
    v = PlainAccessValidator(parse_plain_acl(RULES))
    creds = SessionCredentials("benchUser01", "benchSecret01")
    body = os.urandom(body_size)
    fields = {"a": "bench_acl_pg", "b": TOPIC, "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1700000000000",
              "h": "0", "i": "UNIQ_KEY\x010A0B0C0D0E0F\x02WAIT\x01true\x02", "j": "0", "k": "false", "m": "false"}
    signer = RemotingSigner(creds)
    cmds = [RemotingCommand(310, ext_fields=dict(fields), body=body) for _ in range(n)]
    out = {"sign_us": _per_call_us(signer, cmds)}
    out["check_us"] = _per_call_us(lambda c: v.check_remoting(c, "127.0.0.1"), cmds)
    frames = [c.encode() for c in cmds]
    out["decode_us"] = _per_call_us(lambda f: FrameDecoder().feed(f), frames)
    try:
        from rocketmq.grpc_protocol import definition_pb2 as d, service_pb2 as s
    except ImportError:
        return out
    msg = s.SendMessageRequest(messages=[d.Message(topic=d.Resource(name=TOPIC), body=body)])
    meta = {"authorization": grpc_authorization(creds, "20261127T104500Z"), "x-mq-date-time": "20261127T104500Z"}
    out["grpc_check_us"] = _per_call_us(lambda m: v.check_grpc(m, meta, "127.0.0.1"), [msg] * n)
    return out


def bench_acl(n: int = 30_000, n_sync: int = 3_000, *, body_size: int = 256, in_flight: int = 512, queues: int = 4,
              rounds: int = 2, cost_calls: int = 3_000) -> dict:
    """ACL off and on, `rounds` times each, alternating (a shared machine's noise falls on both); the best
    round of each is kept."""
    from ...broker.bench import bench_body
    body = bench_body(body_size)
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    tmp = Path(tempfile.mkdtemp(prefix="rmqstore-bench-acl-"))
    try:
        for r in range(rounds):
            for acl in (False, True):
                work = tmp / f"{'on' if acl else 'off'}-{r}"
                runs["on" if acl else "off"].append(_round(acl, work, n, n_sync, body, in_flight, queues))
                shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    best = {}
    for key, rs in runs.items():
        b = dict(max(rs, key=lambda x: x.get("async_msgs_per_s", 0)))
        fastest_sync = max(rs, key=lambda x: x.get("sync_msgs_per_s", 0))
        b["sync_msgs_per_s"], b["sync_latency_ms"] = fastest_sync.get("sync_msgs_per_s"), fastest_sync.get(
            "sync_latency_ms")
        best[key] = b
    return {"messages": n, "sync_messages": n_sync, "body_size": body_size, "in_flight": in_flight,
            "queues": queues, "rounds": rounds, "off": best.get("off", {}), "on": best.get("on", {}),
            "in_process": check_costs(body_size, cost_calls)}


def acl_table(r: dict) -> Table:
    t = Table("acl", f"Plain ACL: rmqstore serve with aclEnable=true and signed requests, beside the same run "
                     f"without ACL ({r['messages']:,} messages of {r['body_size']} B)", "msg/s", True)
    off, on = r.get("off") or {}, r.get("on") or {}
    for run, label, ref in ((off, "ACL off", True), (on, "ACL on (every request signed and checked)", False)):
        if run.get("async_msgs_per_s"):
            t.add(f"rmqstore server, {label}: async send ({r['in_flight']} in flight)", run["async_msgs_per_s"],
                  _fmt_rate(run["async_msgs_per_s"]), ref=ref)
    for run, label in ((off, "ACL off"), (on, "ACL on")):
        if run.get("sync_msgs_per_s"):
            lat = run.get("sync_latency_ms") or {}
            t.add(f"rmqstore server, {label}: sync send, one at a time", run["sync_msgs_per_s"],
                  _fmt_rate(run["sync_msgs_per_s"]) + (f", latency p50 {lat.get('p50', 0):.2f} ms" if lat else ""))
    cpu_off, cpu_on = off.get("async_cpu_us_per_msg") or {}, on.get("async_cpu_us_per_msg") or {}
    ip = r.get("in_process") or {}
    t.notes.append(
        f"CPU per async send, ACL off / on: server {cpu_off.get('server', '?')} / {cpu_on.get('server', '?')} us, "
        f"client {cpu_off.get('client', '?')} / {cpu_on.get('client', '?')} us (best of {r['rounds']} alternating "
        f"rounds each; async send errors {off.get('async_errors')} / {on.get('async_errors')}). In process, one "
        f"SEND_MESSAGE_V2 of {r['body_size']} B (fastest of 7 passes): signing {ip.get('sign_us', '?')} us "
        f"(client), checking {ip.get('check_us', '?')} us (server: account, HmacSHA1 over the sorted fields and "
        f"the body, permissions), beside {ip.get('decode_us', '?')} us to decode its frame; a gRPC call's "
        f"authorization {ip.get('grpc_check_us', '?')} us. With ACL on the server checks each send on arrival, "
        f"before the batched put path.")
    return t


class AclWorkloads:
    """benchsuite.Suite's `acl` step (self: the Suite)."""

    def acl(self):
        full = bool(self.p["extras"])
        return acl_table(bench_acl(30_000 if full else 2_000, 3_000 if full else 200, rounds=2 if full else 1))
