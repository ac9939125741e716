"""rmqstore.acl without a server: the signature (RocketMQ's own vector), plain_acl.yml and its line-numbered
errors, address patterns, every permission decision, the reload service and the gate's refusals."""
from __future__ import annotations

import logging
import os
import random

import pytest

from rmqstore.acl import (AclConfigError, AclDenied, AclGate, PlainAccessValidator, PlainAclService,
                          SessionCredentials, inner_client_signer, parse_plain_acl, plain_acl_path, sign_fields)
from rmqstore.acl.address import AddressPatternError, parse_address_pattern, peer_ip
from rmqstore.acl.signature import (RemotingSigner, grpc_authorization, parse_authorization, remoting_content,
                                    remoting_signature)
from rmqstore.acl.validator import grpc_resources, remoting_resources
from rmqstore.errors import ConfigError
from rmqstore.remoting import fastjson
from rmqstore.remoting.codes import RequestCode, ResponseCode
from rmqstore.remoting.command import RemotingCommand

R = RequestCode
ACL = """\
globalWhiteRemoteAddresses:
- 10.10.103.*
accounts:
- accessKey: aclAppUser1
  secretKey: aclAppSecret1
  defaultTopicPerm: DENY
  defaultGroupPerm: DENY
  topicPerms:
  - AclTopicMain=PUB|SUB
  groupPerms:
  - acl_cg_main=SUB
- accessKey: aclDenyUser4
  secretKey: aclDenySecret4
  defaultTopicPerm: PUB
  topicPerms:
  - AclTopicDenied=DENY
- accessKey: aclSubOnly5
  secretKey: aclSubSecret5
  defaultTopicPerm: DENY
  topicPerms:
  - AclTopicMain=SUB
  groupPerms:
  - acl_cg_sub=SUB
- accessKey: aclAdminUser7
  secretKey: aclAdminSecret7
  admin: true
- accessKey: aclLocalUser9
  secretKey: aclLocalSecret9
  whiteRemoteAddress: 192.168.7.*
  defaultTopicPerm: DENY
- accessKey: aclGrpcUser10
  secretKey: aclGrpcSecret10
  defaultTopicPerm: DENY
  topicPerms:
  - AclGrpcTopic=PUB|SUB
  - grpc_group_bare=SUB
  groupPerms:
  - grpc_group=SUB
"""
APP = SessionCredentials("aclAppUser1", "aclAppSecret1")
DENY4 = SessionCredentials("aclDenyUser4", "aclDenySecret4")
SUB5 = SessionCredentials("aclSubOnly5", "aclSubSecret5")
ADMIN = SessionCredentials("aclAdminUser7", "aclAdminSecret7")
SECRETS = ("aclAppSecret1", "aclDenySecret4", "aclSubSecret5", "aclAdminSecret7", "aclLocalSecret9")


@pytest.fixture(scope="module")
def validator() -> PlainAccessValidator:
    return PlainAccessValidator(parse_plain_acl(ACL))


def request(code, fields=None, body=None, creds=None) -> RemotingCommand:
    cmd = RemotingCommand(code, ext_fields=dict(fields) if fields is not None else None, body=body)
    if creds is not None:
        RemotingSigner(creds)(cmd)
    return cmd


def send(topic, creds=None, code=R.SEND_MESSAGE_V2, group="pg"):
    return request(code, {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0",
                          "g": "1700000000000", "h": "0", "i": "", "j": "0", "k": "false", "m": "false"},
                   b"hello", creds)


def refusal(v, cmd, ip="127.0.0.1") -> str | None:
    try:
        v.check_remoting(cmd, ip)
        return None
    except AclDenied as e:
        return e.message


# --- the signature ---------------------------------------------------------------------------------------
def test_signature_is_rocketmqs_own():
    """The SEND_MESSAGE_V2 AclTool `sign` printed with RocketMQ 4.4.0's own classes."""
    fields = {"a": "pg", "b": "AclTopicMain", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1700000000000",
              "h": "0", "i": "KEYS\x01k1\x02WAIT\x01true\x02", "j": "0", "k": "false", "m": "false"}
    signed = sign_fields(dict(fields), b"hello", APP)
    assert signed["AccessKey"] == "aclAppUser1"
    assert signed["Signature"] == "xGqiJN7ugUvXLMGcP0KXSNFMv7Y="
    content = remoting_content(signed, b"hello")
    assert content.startswith(b"aclAppUser1pgAclTopicMainTBW102") and content.endswith(b"falsefalsehello")


def test_hmac_with_precomputed_key_states_is_hmac_sha1():
    import hashlib
    import hmac
    from rmqstore.acl.signature import HmacSha1
    for n in (0, 1, 7, 63, 64, 65, 130):
        key = bytes(range(n % 256))[:n] if n < 256 else b"k" * n
        for data in (b"", b"x", bytes(1000)):
            assert HmacSha1(key).digest(data) == hmac.new(key, data, hashlib.sha1).digest()
    assert "zz" not in repr(HmacSha1(b"zzzzzzzz"))


def test_signature_orders_names_as_java_strings():
    """TreeMap order is UTF-16 code units: an astral character (a surrogate pair, 0xD8xx) sorts before U+FFFF."""
    fields = {"\uffff": "B", "\U0001F600": "A", "AccessKey": "k", "a": "x"}
    assert remoting_content(fields, None) == "kxAB".encode()
    assert remoting_content({"b": "2", "a": "1", "Signature": "s"}, b"!") == b"12!"


def test_every_field_and_the_body_are_signed(validator):
    cmd = send("AclTopicMain", APP)
    assert refusal(validator, cmd) is None
    for k in list(cmd.ext_fields):
        if k in ("Signature",):
            continue
        bad = request(cmd.code, {**cmd.ext_fields, k: cmd.ext_fields[k] + "x"}, cmd.body)
        assert refusal(validator, bad) in ("Check signature failed for accessKey=aclAppUser1",
                                           "No acl config for aclAppUser1x")
    assert refusal(validator, request(cmd.code, cmd.ext_fields, b"hellO")) == \
        "Check signature failed for accessKey=aclAppUser1"


def test_a_query_by_unique_key_is_accepted_signed_either_way(validator):
    """A 4.x Java client adds _UNIQUE_KEY_QUERY after signing (RocketMQ 5 leaves it out of the content for
    clients up to 4.9.3); rmqstore's client signs it with the rest (as RocketMQ 4.4.0's broker wants)."""
    query = {"topic": "AclTopicMain", "key": "0A0B", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": "1"}
    java = request(R.QUERY_MESSAGE, query, None, APP)
    java.ext_fields["_UNIQUE_KEY_QUERY"] = "true"
    ours = request(R.QUERY_MESSAGE, {**query, "_UNIQUE_KEY_QUERY": "true"}, None, APP)
    for cmd in (java, ours):
        assert refusal(validator, cmd) is None
    forged = request(R.QUERY_MESSAGE, {**query, "_UNIQUE_KEY_QUERY": "true"}, None, APP)
    forged.ext_fields["key"] = "0A0C"
    assert refusal(validator, forged) == "Check signature failed for accessKey=aclAppUser1"


def test_credentials_never_show_their_secret():
    c = SessionCredentials("aclAppUser1", "aclAppSecret1")
    assert "aclAppSecret1" not in repr(c) and "aclAppSecret1" not in repr(RemotingSigner(c))
    with pytest.raises(ValueError):
        SessionCredentials("aclAppUser1", "")


def test_grpc_authorization_round_trip():
    header = grpc_authorization(APP, "20261127T104500Z")
    assert header.startswith("MQv2-HMAC-SHA1 Credential=aclAppUser1, SignedHeaders=x-mq-date-time, Signature=")
    ak, sig = parse_authorization(header)
    assert ak == "aclAppUser1"
    assert sig == remoting_signature(b"aclAppSecret1", b"20261127T104500Z")
    for bad in ("MQv2-HMAC-SHA1", "MQv2-HMAC-SHA1 Credential", "MQv2-HMAC-SHA1 Credential=a, Signature=zz"):
        with pytest.raises(ValueError):
            parse_authorization(bad)


# --- plain_acl.yml -------------------------------------------------------------------------------------
def test_plain_acl_is_read_as_rocketmq_reads_it():
    cfg = parse_plain_acl(ACL)
    app = cfg.accounts["aclAppUser1"]
    assert dict(app.resource_perms) == {"AclTopicMain": 12, "%RETRY%acl_cg_main": 8}
    assert app.default_topic_perm == 1 and not app.admin
    assert cfg.accounts["aclAdminUser7"].admin
    assert cfg.accounts["aclDenyUser4"].default_group_perm == 1          # unset: DENY
    assert cfg.global_white[0].match("10.10.103.7") and not cfg.global_white[0].match("10.10.104.7")
    text = repr(cfg)
    assert not any(s in text for s in SECRETS)


@pytest.mark.parametrize("text, line, words", [
    ("accounts:\n- accessKey: aclAppUser1\n  secretKey: 'aclAppSecret1\n", 3, "not valid YAML"),
    ("accounts:\n- accessKey: short\n  secretKey: aclAppSecret1\n", 2, "accessKey must be longer than 6"),
    ("accounts:\n- accessKey: aclAppUser1\n  secretKey: abc\n", 3, "secretKey of 'aclAppUser1' must be longer"),
    ("accounts:\n- accessKey: aclAppUser1\n  secretKey: aclAppSecret1\n  topicPerms:\n  - TopicA\n", 5,
     "is not NAME=PERM"),
    ("accounts:\n- accessKey: aclAppUser1\n  secretKey: aclAppSecret1\n  whiteRemoteAddress: 10.1.300.1\n", 4,
     "whiteRemoteAddress"),
    ("accounts:\n- accessKey: aclAppUser1\n  secretKey: aclAppSecret1\n  admin: maybe\n", 4, "admin must be"),
    ("accounts: aclAppUser1\n", 1, "accounts must be a list"),
    ("globalWhiteRemoteAddresses:\n- 10.10.*-3.1\n", 2, "globalWhiteRemoteAddresses"),
    ("- a\n- b\n", 1, "must be a mapping"),
])
def test_a_bad_file_is_refused_naming_the_line(text, line, words):
    with pytest.raises(AclConfigError) as ei:
        parse_plain_acl(text, "/x/conf/plain_acl.yml")
    msg = str(ei.value)
    assert ei.value.line == line, msg
    assert msg.startswith(f"/x/conf/plain_acl.yml:{line}: ") and words in msg, msg
    assert not any(s in msg for s in SECRETS), msg


def test_an_empty_file_is_refused():
    for text in ("", "# nothing\n", "\n\n"):
        with pytest.raises(AclConfigError, match="no data"):
            parse_plain_acl(text, "p.yml")


def test_unknown_perms_and_keys_are_warned_and_deny():
    cfg = parse_plain_acl("dataVersion: [1]\nfoo: 1\naccounts:\n- accessKey: aclAppUser1\n  secretKey: aclAppSecret1\n"
                          "  topicPrems: [A=PUB]\n  topicPerms: [A=pub, B=ANY]\n", "p.yml")
    assert dict(cfg.accounts["aclAppUser1"].resource_perms) == {"A": 1, "B": 1}
    w = "\n".join(cfg.warnings)
    assert "p.yml:2: unknown key 'foo'" in w and "p.yml:6: unknown account key 'topicPrems'" in w
    assert "'pub' is not one of" in w and "'ANY' is not one of" in w and "dataVersion" not in w


@pytest.mark.parametrize("pattern, yes, no", [
    ("*", ["1.2.3.4", "::1"], []),
    ("", [], ["1.2.3.4"]),
    ("192.168.1.5", ["192.168.1.5"], ["192.168.1.50"]),
    ("192.168.1.{1,2}", ["192.168.1.1", "192.168.1.2"], ["192.168.1.3"]),
    ("10.0.0.1,10.0.0.2", ["10.0.0.2"], ["10.0.0.3"]),
    ("10.10.103.*", ["10.10.103.0", "10.10.103.255"], ["10.10.104.1", "10.10.1033.1", "::1"]),
    ("10.10.103.10-20", ["10.10.103.10", "10.10.103.20"], ["10.10.103.9", "10.10.103.21"]),
    ("10.10.*.*", ["10.10.0.1", "10.10.255.9"], ["10.11.0.1"]),
    ("10.10.3-5.*", ["10.10.4.77"], ["10.10.6.1"]),
])
def test_address_patterns(pattern, yes, no):
    p = parse_address_pattern(pattern)
    assert all(p.match(ip) for ip in yes) and not any(p.match(ip) for ip in no)


@pytest.mark.parametrize("pattern", ["10.1.2", "10.1.2.256", "10.1.-2.*", "10.1.5-2.*", "10.1.2.{a}", "a.b.c.d",
                                     "1.2.3.{4", "10.x.*.*"])
def test_bad_address_patterns(pattern):
    with pytest.raises(AddressPatternError):
        parse_address_pattern(pattern)


def test_peer_ip():
    assert peer_ip("127.0.0.1:5000") == "127.0.0.1"
    assert peer_ip("ipv4:10.0.0.1:5000") == "10.0.0.1"
    assert peer_ip("ipv6:[::1]:5000") == "::1" and peer_ip("[fe80::1]:1") == "fe80::1"


# --- decisions -------------------------------------------------------------------------------------------
def test_validation_order_and_rocketmq_messages(validator):
    assert refusal(validator, send("AclTopicMain")) == "No accessKey is configured"
    assert refusal(validator, request(R.GET_ALL_TOPIC_CONFIG)) == "No accessKey is configured"   # no ext fields
    assert refusal(validator, send("AclTopicMain", SessionCredentials("aclNobodyUser", "whatever1"))) == \
        "No acl config for aclNobodyUser"
    assert refusal(validator, send("AclTopicMain", SessionCredentials("aclAppUser1", "wrongSecret"))) == \
        "Check signature failed for accessKey=aclAppUser1"
    # a global white address is checked for nothing, an account's white address for no signature
    assert refusal(validator, send("AclTopicMain"), ip="10.10.103.9") is None
    unsigned = send("Anything")
    unsigned.ext_fields["AccessKey"] = "aclLocalUser9"
    assert refusal(validator, unsigned, ip="192.168.7.1") is None
    assert refusal(validator, unsigned, ip="192.168.8.1") == "Check signature failed for accessKey=aclLocalUser9"


def test_permissions(validator):
    assert refusal(validator, send("AclTopicMain", APP)) is None
    assert refusal(validator, send("AclTopicOther", APP)) == "No default permission for topic:AclTopicOther"
    assert refusal(validator, send("AclTopicDenied", DENY4)) == "No default permission for topic:AclTopicDenied"
    # RocketMQ 5: an unlisted topic takes the account's defaultTopicPerm (4.4.0 refused it)
    assert refusal(validator, send("AclTopicMain", DENY4)) is None
    assert refusal(validator, send("AclTopicMain", SUB5)) == "No default permission for topic:AclTopicMain"
    assert refusal(validator, send("AclTopicMain", SUB5, code=R.SEND_BATCH_MESSAGE)) == \
        "No default permission for topic:AclTopicMain"
    pull = {"consumerGroup": "acl_cg_sub", "topic": "AclTopicMain", "queueId": "0", "queueOffset": "0"}
    assert refusal(validator, request(R.PULL_MESSAGE, pull, None, SUB5)) is None
    assert refusal(validator, request(R.PULL_MESSAGE, {**pull, "consumerGroup": "acl_cg_main"}, None, SUB5)) == \
        "No default permission for group:acl_cg_main"


def test_admin_codes_and_admin_accounts(validator):
    for code in (R.UPDATE_AND_CREATE_TOPIC, R.UPDATE_BROKER_CONFIG, R.DELETE_TOPIC_IN_BROKER,
                 R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, R.DELETE_SUBSCRIPTIONGROUP):
        assert refusal(validator, request(code, {"topic": "T"}, None, APP)) == \
            f"Need admin permission for request code={int(code)}, but accessKey=aclAppUser1 is not"
        assert refusal(validator, request(code, {"topic": "T"}, None, ADMIN)) is None
    # RocketMQ 5: an admin account is not checked per resource (it lists none here)
    assert refusal(validator, send("AnyTopic", ADMIN)) is None
    # codes that name nothing need a known account's signature only
    assert refusal(validator, request(R.GET_BROKER_CONFIG, {}, None, SUB5)) is None


def test_what_each_remoting_request_names():
    assert remoting_resources(R.SEND_MESSAGE, {"topic": "T"}, None) == {"T": 4}
    assert remoting_resources(R.SEND_MESSAGE_V2, {"b": "%RETRY%g", "a": "g"}, None) == {"%RETRY%g": 8}
    assert remoting_resources(R.CONSUMER_SEND_MSG_BACK, {"group": "g", "originTopic": "T"}, None) == {"%RETRY%g": 8}
    assert remoting_resources(R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "T"}, None) == \
        {"%RETRY%g": 8, "T": 8}
    hb = fastjson.dumps_bytes({"clientID": "c", "producerDataSet": [{"groupName": "pg"}], "consumerDataSet": [
        {"groupName": "g", "subscriptionDataSet": [{"topic": "T"}, {"topic": "%RETRY%g"}]}]})
    assert remoting_resources(R.HEART_BEAT, {}, hb) == {"%RETRY%g": 8, "T": 8}
    assert remoting_resources(R.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "T"}, None) == {}


def test_grpc_requests(validator):
    from rocketmq.grpc_protocol import definition_pb2 as d, service_pb2 as s

    def meta(creds, dt="20261127T104500Z"):
        return {"authorization": grpc_authorization(creds, dt), "x-mq-date-time": dt}
    user = SessionCredentials("aclGrpcUser10", "aclGrpcSecret10")
    send_req = s.SendMessageRequest(messages=[d.Message(topic=d.Resource(name="AclGrpcTopic"), body=b"x")])
    recv = s.ReceiveMessageRequest(group=d.Resource(name="grpc_group"),
                                   message_queue=d.MessageQueue(topic=d.Resource(name="AclGrpcTopic")))
    assert grpc_resources(recv) == {"%RETRY%grpc_group": 8, "AclGrpcTopic": 8}
    assert validator.check_grpc(send_req, meta(user), "127.0.0.1").access_key == "aclGrpcUser10"
    assert validator.check_grpc(recv, meta(user), "127.0.0.1") is not None
    # a group RocketMQ 5.1.2 checks by its bare name in topicPerms is honoured too
    bare = s.AckMessageRequest(group=d.Resource(name="grpc_group_bare"), topic=d.Resource(name="AclGrpcTopic"))
    assert validator.check_grpc(bare, meta(user), "127.0.0.1") is not None
    cases = [
        (send_req, meta(SessionCredentials("aclGrpcUser10", "wrongSecret")), "Check signature failed"),
        (send_req, {}, "No accessKey is configured"),
        (send_req, {"authorization": "garbage"}, "authorization header is incorrect"),
        (send_req, {"authorization": grpc_authorization(user, "x")}, "Check signature failed"),   # no date-time
        (s.SendMessageRequest(messages=[d.Message(topic=d.Resource(name="Other"))]), meta(user),
         "No default permission for topic:Other"),
        (s.SendMessageRequest(), meta(user), "messageCount is zero"),
        (s.HeartbeatRequest(client_type=d.ClientType.SIMPLE_CONSUMER), meta(user), "doesn't have group"),
        (s.QueryRouteRequest(topic=d.Resource(name="Other")), meta(user), "No default permission for topic:Other"),
    ]
    for msg, md, words in cases:
        with pytest.raises(AclDenied, match=words):
            validator.check_grpc(msg, md, "127.0.0.1")
    assert validator.check_grpc(send_req, {}, "10.10.103.1") is None           # globally white


# --- hostile input ----------------------------------------------------------------------------------------
def test_hostile_requests_are_refused_not_crashed(validator):
    huge = "k" * (1 << 20)
    assert refusal(validator, request(R.SEND_MESSAGE_V2, {"AccessKey": huge, "Signature": "x"})).endswith("...")
    assert len(refusal(validator, request(R.SEND_MESSAGE_V2, {"AccessKey": huge}))) < 300
    lone = request(R.SEND_MESSAGE_V2, {"b": "\ud800", "AccessKey": "aclAppUser1", "Signature": "\udfff\u00e9"}, b"x")
    assert refusal(validator, lone) == "Check signature failed for accessKey=aclAppUser1"
    for body in (b"not json", b"[1,2]", b'{"consumerDataSet": 5}', b'{"consumerDataSet": [5]}',
                 b'{"consumerDataSet": [{"groupName": 7, "subscriptionDataSet": [{"topic": null}, 3]}]}',
                 b"[" * 100000):
        msg = refusal(validator, request(R.HEART_BEAT, {}, body, APP))
        assert msg is None or "HEART_BEAT" in msg or msg.startswith("No default permission"), msg
    # a captured request replayed verbatim is accepted (signatures carry no time or nonce, as in RocketMQ)
    cmd = send("AclTopicMain", APP)
    assert refusal(validator, cmd) is None and refusal(validator, cmd) is None


def test_mutated_requests_only_ever_refuse(validator):
    rnd = random.Random(37)
    base = send("AclTopicMain", APP)
    for _ in range(500):
        ext = dict(base.ext_fields)
        for _ in range(rnd.randint(1, 3)):
            k = rnd.choice(list(ext) + ["AccessKey", "Signature", "zz"])
            op = rnd.random()
            if op < 0.3:
                ext.pop(k, None)
            else:
                ext[k] = "".join(chr(rnd.randint(0, 0x2FFFF) if rnd.random() < 0.1 else rnd.randint(32, 126))
                                 for _ in range(rnd.randint(0, 40)))
        code = rnd.choice([R.SEND_MESSAGE_V2, R.PULL_MESSAGE, R.HEART_BEAT, R.UPDATE_CONSUMER_OFFSET, 9999])
        cmd = request(code, ext, bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 64))))
        try:
            validator.check_remoting(cmd, "127.0.0.1")
        except AclDenied:
            pass


# --- the reload service and the gate ----------------------------------------------------------------------
def write(path, text, mode=0o600):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def test_reload_keeps_the_rules_in_force_when_the_file_breaks(tmp_path, caplog):
    f = tmp_path / "conf" / "plain_acl.yml"
    f.parent.mkdir()
    write(f, ACL)
    svc = PlainAclService(f, interval=3600).start()      # looks only when asked: check()
    try:
        v1 = svc.validator
        assert svc.generation == 1 and not svc.check()
        write(f, ACL.replace("aclNobody", "x") + "- accessKey: aclNewUser8\n  secretKey: aclNewSecret8\n")
        assert svc.check() and svc.generation == 2
        assert refusal(svc.validator, send("X", SessionCredentials("aclNewUser8", "aclNewSecret8"))) == \
            "No default permission for topic:X"
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rmqstore.acl"):
            write(f, ACL + "- accessKey: aclBadUser9\n  secretKey: 'aclBadSecret9\n")
            assert not svc.check() and svc.generation == 2
            assert not svc.check()                       # the same bad content is not tried again
            f.unlink()
            assert not svc.check() and not svc.check()
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 2, errors
        assert f"{f}:" in errors[0] and "not valid YAML" in errors[0] and "rules in force stay" in errors[0]
        assert "cannot read" in errors[1]
        assert not any(s in m for m in errors for s in SECRETS + ("aclBadSecret9",))
        assert refusal(svc.validator, send("X", SessionCredentials("aclNewUser8", "aclNewSecret8"))) is not None
        assert svc.validator is not v1
        write(f, ACL)
        assert svc.check() and svc.generation == 3
        with pytest.raises(AclDenied, match="No acl config for aclNewUser8"):
            svc.validator.check_remoting(send("X", SessionCredentials("aclNewUser8", "aclNewSecret8")), "1.2.3.4")
    finally:
        svc.shutdown()


def test_the_watcher_thread_picks_up_a_change(tmp_path):
    f = tmp_path / "plain_acl.yml"
    write(f, ACL)
    svc = PlainAclService(f, interval=0.05).start()
    try:
        write(f, ACL.replace("aclAppSecret1", "aclAppSecret2"))
        assert svc.wait_for_generation(2, timeout=30)
        assert refusal(svc.validator, send("AclTopicMain", APP)) == "Check signature failed for accessKey=aclAppUser1"
    finally:
        svc.shutdown()


def test_start_refuses_a_missing_or_bad_file_and_warns_when_others_can_read_it(tmp_path, caplog):
    with pytest.raises(AclConfigError, match="cannot read the plain ACL file"):
        PlainAclService(tmp_path / "nope.yml").start()
    f = tmp_path / "plain_acl.yml"
    write(f, "accounts:\n- accessKey: aclAppUser1\n  secretKey: x\n")
    with pytest.raises(AclConfigError, match=r"plain_acl.yml:3: secretKey"):
        PlainAclService(f).start()
    write(f, ACL, mode=0o644)
    with caplog.at_level(logging.WARNING, logger="rmqstore.acl"):
        svc = PlainAclService(f, interval=3600).start()
    svc.shutdown()
    assert any("readable by other users (mode 644)" in r.getMessage() for r in caplog.records)


def test_where_the_file_is():
    assert str(plain_acl_path({"rocketmqHome": "/opt/rmq"}, {"ROCKETMQ_HOME": "/env"})) == "/opt/rmq/conf/plain_acl.yml"
    assert str(plain_acl_path({}, {"ROCKETMQ_HOME": "/env"})) == "/env/conf/plain_acl.yml"
    with pytest.raises(AclConfigError, match="rocketmqHome in broker.conf or ROCKETMQ_HOME"):
        plain_acl_path({}, {})


class _Ch:
    def __init__(self, remote):
        self.remote = remote


@pytest.fixture
def gate(tmp_path):
    f = tmp_path / "plain_acl.yml"
    write(f, ACL)
    g = AclGate(PlainAclService(f, interval=3600).start())
    yield g
    g.shutdown()


def test_gate_answers_rocketmqs_refusal_and_never_calls_the_processor(gate):
    seen = []
    handler = gate.remoting(lambda ch, req: seen.append(req.code) or "processed")
    r = handler(_Ch("127.0.0.1:5000"), send("AclTopicMain", SUB5))
    assert r.code == ResponseCode.SYSTEM_ERROR and r.is_response
    assert r.remark == ("org.apache.rocketmq.acl.common.AclException: No default permission for topic:AclTopicMain, "
                        "org.apache.rocketmq.acl.plain.PlainPermissionLoader.checkPerm(PlainPermissionLoader.java:141)")
    assert seen == []
    assert handler(_Ch("127.0.0.1:5000"), send("AclTopicMain", APP)) == "processed" and seen == [310]


def test_gate_fails_closed_on_a_checking_error(gate, caplog):
    class Broken:
        code, opaque, serialize_type, version = 310, 1, 0, 293

        @property
        def ext_fields(self):
            raise RuntimeError("boom")

        def make_response(self, code, remark):
            return (code, remark)
    with caplog.at_level(logging.ERROR, logger="rmqstore.acl"):
        code, remark = gate.check_remoting(Broken(), "1.2.3.4:5")
    assert code == ResponseCode.SYSTEM_ERROR and "could not be checked" in remark


def test_name_server_writes_need_a_trusted_peer(gate):
    handler = gate.namesrv(lambda ch, req: "served")
    reg = {"brokerName": "b", "brokerAddr": "10.0.0.1:10911", "clusterName": "c", "brokerId": "0"}
    here = _Ch("127.0.0.1:1")
    assert handler(here, request(R.REGISTER_BROKER, reg)).remark.endswith(
        "No accessKey is configured, org.apache.rocketmq.acl.plain.PlainPermissionLoader.validate("
        "PlainPermissionLoader.java:189)")
    assert "Need admin permission for request code=103, but accessKey=aclAppUser1" in \
        handler(here, request(R.REGISTER_BROKER, reg, None, APP)).remark
    assert handler(here, request(R.REGISTER_BROKER, reg, None, ADMIN)) == "served"
    assert handler(_Ch("10.10.103.4:1"), request(R.REGISTER_BROKER, reg)) == "served"
    for code in (R.UNREGISTER_BROKER, R.PUT_KV_CONFIG, R.DELETE_TOPIC_IN_NAMESRV):
        assert handler(here, request(code, reg)).code == ResponseCode.SYSTEM_ERROR
    assert handler(here, request(R.GET_ROUTEINTO_BY_TOPIC, {"topic": "T"})) == "served"     # routes stay open


def test_ha_peers_must_be_globally_white(gate):
    assert gate.trusted_peer("10.10.103.200:40000")
    assert not gate.trusted_peer("127.0.0.1:40000") and not gate.trusted_peer("192.168.7.1:1")


def test_inner_client_credentials():
    class Cfg:
        extra = {"innerClientAuthenticationCredentials": '{"accessKey":"aclAdminUser7","secretKey":"aclAdminSecret7"}'}
    signer = inner_client_signer(Cfg)
    cmd = request(R.GET_ALL_TOPIC_CONFIG)
    signer(cmd)
    v = PlainAccessValidator(parse_plain_acl(ACL))
    assert v.check_remoting(cmd, "1.2.3.4").access_key == "aclAdminUser7"
    Cfg.extra = {"innerClientAuthenticationCredentials": "aclAdminUser7:aclAdminSecret7"}
    with pytest.raises(ConfigError) as ei:
        inner_client_signer(Cfg)
    assert "aclAdminSecret7" not in str(ei.value)
    Cfg.extra = {}
    assert inner_client_signer(Cfg) is None
