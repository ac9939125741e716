"""RocketMQ 4.4.0's own client with its ACL hook, against RocketMQ 4.4.0's own broker (aclEnable=true): every
signed request it sent and the broker's answer (tests/data/acl, recorded by tests/acl_relay.py during
AclTool's cases 1-8) replayed, first through rmqstore's checks alone, then over a socket against
`rmqstore serve` with the same plain_acl.yml. The answers must be RocketMQ's, refusal remarks byte for
byte, except where rmqstore follows RocketMQ 5 on purpose (DIFFERENCES)."""
from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from rmqstore.acl import AclDenied, PlainAccessValidator, parse_plain_acl
from rmqstore.broker.server import ServerProcess
from rmqstore.remoting.command import FrameDecoder
from rmqstore.remoting.codes import RequestCode

from broker.test_server import Conn

DATA = Path(__file__).resolve().parents[1] / "data" / "acl"
RELOAD_LAG_MS = 1000      # RocketMQ looks at the file every 500 ms: answers this soon after a change may be either


def _is_acl_refusal(code, remark) -> bool:
    return code == 1 and remark is not None and (
        remark.startswith("org.apache.rocketmq.acl.common.AclException: ") or "NullPointerException" in remark)


def load():
    frames, changes = [], {}
    with gzip.open(DATA / "java-4.4.0.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            if "acl_changed" in r:
                changes[r["acl_changed"]] = r["t"]
            else:
                r["cmd"] = FrameDecoder().feed(base64.b64decode(r["request"]))[0]
                frames.append(r)
    return frames, changes


FRAMES, CHANGES = load()
RULES = {v: (DATA / f"plain_acl-{v}.yml").read_text() for v in CHANGES}


def rocketmq_5_difference(r, ours) -> str | None:
    """Why rmqstore's answer to a recorded request may differ from RocketMQ 4.4.0's, or None."""
    cmd, remark = r["cmd"], r["remark"] or ""
    if "NullPointerException" in remark and ours == "No accessKey is configured":
        return "an unsigned request without ext fields: 4.4.0 fails with a NullPointerException"
    if remark.endswith("checkPerm(PlainPermissionLoader.java:136)") and ours is None:
        return "an unlisted resource takes the account's default permission (4.4.0 refuses all)"
    return None


def our_answer(validator, cmd) -> str | None:
    try:
        validator.check_remoting(cmd, "127.0.0.1")
        return None
    except AclDenied as e:
        return e.remark


def test_recording_covers_every_case():
    refused = {r["remark"].split(", org.apache")[0].split(": ", 1)[1] for r in FRAMES
               if _is_acl_refusal(r["code"], r["remark"]) and "AclException" in r["remark"]}
    assert {"No accessKey is configured", "No acl config for aclNobodyUser",
            "Check signature failed for accessKey=aclAppUser1", "No default permission for topic:AclTopicDenied",
            "No default permission for topic:AclTopicMain", "No acl config for aclNewUser8",
            "Need admin permission for request code=17, but accessKey=aclAppUser1 is not",
            "Need admin permission for request code=25, but accessKey=aclAppUser1 is not",
            "Need admin permission for request code=215, but accessKey=aclAppUser1 is not"} <= refused
    codes = {r["cmd"].code for r in FRAMES}
    assert {310, 11, 14, 15, 17, 21, 25, 34, 35, 38, 215} <= codes
    assert sum(1 for r in FRAMES if r["code"] == 0 and r["cmd"].code == 310) >= 100
    assert set(CHANGES) == {0, 1, 2}


def test_rmqstore_decides_every_recorded_request_as_rocketmq():
    validators = {v: PlainAccessValidator(parse_plain_acl(text, f"plain_acl-{v}.yml")) for v, text in RULES.items()}
    same = answered = 0
    differences: dict[str, int] = {}
    for r in FRAMES:
        if r["code"] is None:          # oneway: RocketMQ answered nothing
            continue
        answered += 1
        v = r["acl"]
        candidates = [v] + ([v - 1] if v > 0 and r["t"] - CHANGES[v] < RELOAD_LAG_MS else [])
        theirs = r["remark"] if _is_acl_refusal(r["code"], r["remark"]) else None
        answers = [our_answer(validators[c], r["cmd"]) for c in candidates]
        if theirs in answers:
            same += 1
            continue
        ours = answers[0]
        why = rocketmq_5_difference(r, ours and ours.split(": ", 1)[1].split(", org.apache")[0])
        assert why is not None, (f"request {r['cmd'].code} at {r['t']} ms (rules {v}): RocketMQ answered "
                                 f"{r['code']} {theirs!r}, rmqstore {ours!r}")
        differences[why] = differences.get(why, 0) + 1
    assert answered > 220 and same == answered - 2
    assert differences == {"an unsigned request without ext fields: 4.4.0 fails with a NullPointerException": 1,
                           "an unlisted resource takes the account's default permission (4.4.0 refuses all)": 1}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("acl-replay")
    (root / "home" / "conf").mkdir(parents=True)
    acl = root / "home" / "conf" / "plain_acl.yml"
    acl.write_text(RULES[0])
    os.chmod(acl, 0o600)
    srv = ServerProcess(root / "store", {"aclEnable": "true", "rocketmqHome": str(root / "home"),
                                         "autoCreateTopicEnable": "false", "brokerName": "broker-w37",
                                         "mappedFileSizeCommitLog": 4 << 20})
    srv.start()
    yield srv
    assert srv.stop() == 0, srv.log_tail()
    shutil.rmtree(root, ignore_errors=True)


def test_rmqstore_serve_answers_the_recorded_requests_as_rocketmq(server):
    """Every request made under the file as first written, in the order recorded, on the port recorded:
    a refusal's code and remark are RocketMQ's, an allowed request is not refused (a pull RocketMQ held
    for new messages is not waited for)."""
    conns = {"main": Conn(server.broker_addr), "vip": Conn(server.vip_addr)}
    checked = refused = 0
    try:
        for r in FRAMES:
            v = r["acl"]
            if RULES[v] != RULES[0] or (v > 0 and r["t"] - CHANGES[v] < RELOAD_LAG_MS) or r["code"] is None:
                continue
            cmd = r["cmd"]
            c = conns[r["port"]]
            theirs = r["remark"] if _is_acl_refusal(r["code"], r["remark"]) else None
            held = cmd.code == RequestCode.PULL_MESSAGE and theirs is None
            c.send(cmd)
            if held:
                continue
            got = c.wait(cmd.opaque, 30)
            assert got is not None, f"no answer to recorded request {cmd.code} at {r['t']} ms"
            ours = got.remark if _is_acl_refusal(got.code, got.remark) else None
            if ours != theirs:
                short = ours and ours.split(": ", 1)[1].split(", org.apache")[0]
                assert rocketmq_5_difference(r, short), (
                    f"request {cmd.code} at {r['t']} ms: RocketMQ {r['code']} {theirs!r}, rmqstore {got.code} {ours!r}")
            checked += 1
            refused += ours is not None
    finally:
        for c in conns.values():
            c.close()
    assert checked >= 180 and refused >= 25, (checked, refused)
