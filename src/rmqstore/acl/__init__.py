"""Plain ACL: who may do what on `rmqstore serve`, as RocketMQ 4.4.0's plain ACL (remoting) and RocketMQ 5's
proxy (gRPC) decide it, with the same plain_acl.yml.

Turning it on: `aclEnable=true` in broker.conf; the rules are HOME/conf/plain_acl.yml, HOME being broker.conf's
`rocketmqHome` or else the environment's `ROCKETMQ_HOME` (where RocketMQ's broker looks). A missing or
unusable file stops the start with `FILE:LINE: reason`. The file is looked at every 500 ms (an MD5 of its
content, RocketMQ's FileWatchService) and new rules apply from the next request; a changed file that
cannot be used is logged (file:line) and the rules in force stay. A file readable by other users is
warned about. Format: plain_config.py.

Each request (validator.py), in order:
 1. a client IP in globalWhiteRemoteAddresses: allowed, nothing else checked;
 2. no AccessKey: refused `No accessKey is configured`; an unknown one: `No acl config for KEY`;
 3. a client IP in the account's whiteRemoteAddress: allowed unsigned, nothing else checked;
 4. a signature that is not HmacSHA1(secretKey, content): `Check signature failed for accessKey=KEY`
    (compared with hmac.compare_digest; content: signature.py);
 5. an `admin: true` account: allowed (RocketMQ 5; 4.4.0 checked an admin's resources too);
 6. UPDATE_AND_CREATE_TOPIC 17, UPDATE_BROKER_CONFIG 25, DELETE_TOPIC_IN_BROKER 215,
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP 200, DELETE_SUBSCRIPTIONGROUP 207 from a non-admin: `Need admin
    permission for request code=N, but accessKey=KEY is not`;
 7. every resource the request names, with the permission it needs; an unlisted resource takes the
    account's defaultTopicPerm / defaultGroupPerm (RocketMQ 5; 4.4.0 refuses every unlisted resource,
    a bug): `No default permission for topic:T` / `group:G`.

Resources (remoting, validator.remoting_resources; a group G is the resource %RETRY%G):
    SEND_MESSAGE 10, SEND_MESSAGE_V2 310, SEND_BATCH_MESSAGE 320   topic PUB (to a %RETRY% topic: group SUB)
    CONSUMER_SEND_MSG_BACK 36                                      group SUB
    PULL_MESSAGE 11                                                topic SUB, group SUB
    QUERY_MESSAGE 12                                               topic SUB
    HEART_BEAT 34                                                  each consumer: group SUB, each subscribed topic SUB
    UNREGISTER_CLIENT 35, GET_CONSUMER_LIST_BY_GROUP 38            group SUB
    UPDATE_CONSUMER_OFFSET 15                                      group SUB, topic SUB
    any other code                                                 a valid signature of a known account
(RocketMQ 5's table: 4.4.0 let SEND_BATCH_MESSAGE through unchecked and wanted PUB on the origin topic for
a send-back, which refused consumers their own retries.)

gRPC (RocketMQ 5.1.2's proxy, validator.grpc_resources): every request message is checked with the call's
`authorization: MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time, Signature=HEX` metadata, HEX
= hex HmacSHA1(secretKey, x-mq-date-time), through the same steps 1-7: SendMessage topic PUB;
ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue, QueryAssignment,
PullMessage, UpdateOffset, GetOffset: group SUB and topic SUB; a consumer's Heartbeat and
NotifyClientTermination: group SUB; QueryRoute: topic PUB or SUB; Telemetry settings: published topics
PUB, subscription group and topics SUB; EndTransaction: topic PUB. A group is looked up in groupPerms,
else by its bare name in topicPerms (how 5.1.2 checks it), else defaultGroupPerm. A refusal ends the
call with status PERMISSION_DENIED.

Name server and replication (gate.py): with ACL on, the embedded name server's writes (REGISTER_BROKER,
UNREGISTER_BROKER, PUT/DELETE_KV_CONFIG, DELETE_TOPIC_IN_NAMESRV, WIPE_WRITE_PERM_OF_BROKER) are accepted
from an IP of globalWhiteRemoteAddresses or signed by an admin account; route queries stay open. The HA
port carries no credentials: `AclGate.trusted_peer(addr)` accepts only IPs of globalWhiteRemoteAddresses.
A broker's own requests to other brokers and name servers (a slave's SlaveSynchronize requests to its
master: GET_ALL_TOPIC_CONFIG, GET_ALL_CONSUMER_OFFSET, GET_ALL_DELAY_OFFSET,
GET_ALL_SUBSCRIPTIONGROUP_CONFIG; REGISTER_BROKER to a remote name server) are signed by
`inner_client_signer(cfg)` with broker.conf's `innerClientAuthenticationCredentials`
(`{"accessKey":"...","secretKey":"..."}`, RocketMQ 5's key); RocketMQ 4.4.0's own brokers sign nothing,
so they have to be in globalWhiteRemoteAddresses.

Not checked: signatures are not bound to a time or a nonce (as in RocketMQ), so a captured request can be
replayed; `rmqstore serve` offers no TLS (RocketMQ's tlsMode): the traffic, signatures included, is
readable on the network. Secrets are never logged nor put in an error or a remark.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .gate import AclGate, acl_enabled
from .permission import ADMIN_CODES, Perm, check_permission, parse_perm
from .plain_config import AclConfigError, PlainAccount, PlainAclConfig, load_plain_acl, parse_plain_acl
from .service import PlainAclService, plain_acl_path
from .signature import RemotingSigner, SessionCredentials, grpc_authorization, sign_fields
from .validator import AclDenied, PlainAccessValidator

INNER_CREDENTIALS_KEY = "innerClientAuthenticationCredentials"


def inner_client_signer(cfg) -> RemotingSigner | None:
    """The signer of a broker's own outgoing requests, from broker.conf's innerClientAuthenticationCredentials
    (None when unset); ConfigError when it is not `{"accessKey": ..., "secretKey": ...}`."""
    from ..errors import ConfigError
    raw = str((getattr(cfg, "extra", None) or {}).get(INNER_CREDENTIALS_KEY, "")).strip()
    if not raw:
        return None
    try:
        d = json.loads(raw)
        creds = SessionCredentials(str(d["accessKey"]), str(d["secretKey"]))
    except (ValueError, KeyError, TypeError):
        raise ConfigError(INNER_CREDENTIALS_KEY, "(hidden)", 'must be {"accessKey":"...","secretKey":"..."}') \
            from None
    return RemotingSigner(creds)


ACCESS_KEY_ENV, SECRET_KEY_ENV = "ROCKETMQ_ACCESS_KEY", "ROCKETMQ_SECRET_KEY"


def tool_credentials(access_key: str | None = None, secret_key: str | None = None,
                     environ=None) -> SessionCredentials | None:
    """The keys a command-line tool signs with: the options given, else $ROCKETMQ_ACCESS_KEY and
    $ROCKETMQ_SECRET_KEY, else accessKey / secretKey of $ROCKETMQ_HOME/conf/tools.yml (mqadmin's file);
    None when none of them has both. ValueError when only one half is given (its value never shown)."""
    environ = os.environ if environ is None else environ
    sources = [("--accessKey/--secretKey", access_key, secret_key),
               (f"{ACCESS_KEY_ENV}/{SECRET_KEY_ENV}", environ.get(ACCESS_KEY_ENV), environ.get(SECRET_KEY_ENV))]
    home = environ.get("ROCKETMQ_HOME", "").strip()
    tools = Path(home) / "conf" / "tools.yml" if home else None
    if tools is not None and tools.is_file():
        import yaml
        try:
            d = yaml.safe_load(tools.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            raise ValueError(f"{tools} is not a YAML file of accessKey and secretKey") from None
        if isinstance(d, dict):
            ak, sk = d.get("accessKey"), d.get("secretKey")
            sources.append((str(tools), None if ak is None else str(ak), None if sk is None else str(sk)))
    for where, ak, sk in sources:
        if ak or sk:
            if not (ak and sk):
                raise ValueError(f"{where}: both an access key and a secret key are needed")
            return SessionCredentials(ak, sk)
    return None


__all__ = ["AclGate", "AclConfigError", "AclDenied", "PlainAclService", "PlainAccessValidator", "PlainAclConfig",
           "PlainAccount", "RemotingSigner", "SessionCredentials", "Perm", "ADMIN_CODES", "acl_enabled",
           "check_permission", "parse_perm", "parse_plain_acl", "load_plain_acl", "plain_acl_path", "sign_fields",
           "grpc_authorization", "inner_client_signer", "tool_credentials", "INNER_CREDENTIALS_KEY"]
