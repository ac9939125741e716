"""PlainAccessValidator: one request (remoting or gRPC) checked against one PlainAclConfig. Pure; raises
AclDenied with RocketMQ's message for a refusal.

Order (PlainPermissionLoader.validate): a client IP of globalWhiteRemoteAddresses passes; no access key ->
`No accessKey is configured`; an unknown key -> `No acl config for KEY`; a client IP of the account's
whiteRemoteAddress passes; a wrong signature -> `Check signature failed for accessKey=KEY`; an admin account
passes (RocketMQ 5); an admin request code from another account -> `Need admin permission for request
code=N, but accessKey=KEY is not`; then every resource the request names needs its permission: the
account's entry for it, else the account's defaultTopicPerm / defaultGroupPerm (RocketMQ 5; 4.4.0 takes the
defaults from the request and so refuses every unlisted resource) -> `No default permission for topic:T`
(`group:G`).
"""
from __future__ import annotations

from typing import Callable, Mapping

from ..remoting import fastjson
from ..remoting.codes import RETRY_GROUP_TOPIC_PREFIX, UNIQUE_MSG_QUERY_FLAG, RequestCode
from .permission import ADMIN_CODES, ANY, PUB, SUB, check_permission, describe, is_group, retry_topic
from .plain_config import PlainAccount, PlainAclConfig
from .signature import (ACCESS_KEY, AUTHORIZATION, DATE_TIME, SIGNATURE, AuthorizationError, parse_authorization,
                        remoting_fields_bytes, signature_equals)

ACL_EXCEPTION = "org.apache.rocketmq.acl.common.AclException"
_LOADER = "org.apache.rocketmq.acl.plain.PlainPermissionLoader"
# The first stack frame RocketMQ 4.4.0 puts in each refusal's remark (RemotingHelper.exceptionSimpleDesc)
FRAME_NO_KEY = f"{_LOADER}.validate(PlainPermissionLoader.java:189)"
FRAME_UNKNOWN_KEY = f"{_LOADER}.validate(PlainPermissionLoader.java:193)"
FRAME_SIGNATURE = f"{_LOADER}.validate(PlainPermissionLoader.java:205)"
FRAME_ADMIN = f"{_LOADER}.checkPerm(PlainPermissionLoader.java:116)"
FRAME_DEFAULT_PERM = f"{_LOADER}.checkPerm(PlainPermissionLoader.java:136)"
FRAME_LISTED_PERM = f"{_LOADER}.checkPerm(PlainPermissionLoader.java:141)"

# Clients up to V4_9_3 (MQVersion ordinal 399) add _UNIQUE_KEY_QUERY after signing (RocketMQ 5 leaves it out)
_V4_9_3 = 399
_SKIP_UNIQUE = frozenset({UNIQUE_MSG_QUERY_FLAG})
_MAX_REPORTED = 200          # longest resource name or key quoted in a refusal


class AclDenied(Exception):
    """A refusal: `message` is RocketMQ's AclException message (never a secret)."""

    def __init__(self, message: str, frame: str | None = None):
        super().__init__(message)
        self.message = message
        self.frame = frame

    @property
    def remark(self) -> str:
        """The remark RocketMQ 4.4.0 answers with (code SYSTEM_ERROR)."""
        return f"{ACL_EXCEPTION}: {self.message}" + (f", {self.frame}" if self.frame else "")


def _q(s: str) -> str:
    return s if len(s) <= _MAX_REPORTED else s[:_MAX_REPORTED] + "..."


# --- what a remoting request names ----------------------------------------------------------------------
_RETRY = RETRY_GROUP_TOPIC_PREFIX


def _send(topic_key: str, group_key: str):
    """A send: PUB on its topic; to a %RETRY% topic (a consumer's retry), SUB on the sending group."""
    def resources(ext, body):
        topic = ext.get(topic_key)
        if topic is not None and topic.startswith(_RETRY):
            g = ext.get(group_key)
            return {} if g is None else {_RETRY + g: SUB}
        return {} if topic is None else {topic: PUB}
    return resources


def _named(*items: tuple[str, int, bool]):
    """The resources named by header fields: (field, permission, is a group)."""
    def resources(ext, body):
        out = {}
        for key, perm, group in items:
            v = ext.get(key)
            if v is not None:
                out[_RETRY + v if group else v] = perm
        return out
    return resources


def _heartbeat(ext, body) -> dict[str, int]:
    """Each consumer of a HEART_BEAT body: SUB on its group and on every topic it subscribes."""
    try:
        data = fastjson.loads(body or b"{}")
    except (ValueError, RecursionError):
        raise AclDenied("the HEART_BEAT body is not JSON") from None
    consumers = data.get("consumerDataSet") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(consumers, (list, type(None))):
        raise AclDenied("the HEART_BEAT body is not a heartbeat")
    out: dict[str, int] = {}
    for c in consumers or ():
        subs = c.get("subscriptionDataSet") if isinstance(c, dict) else None
        if not isinstance(c, dict) or not isinstance(subs, (list, type(None))):
            raise AclDenied("the HEART_BEAT body has a consumer that is not one")
        name = c.get("groupName")
        if isinstance(name, str):
            out[_RETRY + name] = SUB
        for sd in subs or ():
            topic = sd.get("topic") if isinstance(sd, dict) else None
            if isinstance(topic, str):
                out[topic] = SUB
    return out


_R = RequestCode
_RESOURCES = {int(code): fn for code, fn in (
    (_R.SEND_MESSAGE, _send("topic", "producerGroup")),
    (_R.SEND_MESSAGE_V2, _send("b", "a")),
    (_R.SEND_BATCH_MESSAGE, _send("b", "a")),
    (_R.CONSUMER_SEND_MSG_BACK, _named(("group", SUB, True))),
    (_R.PULL_MESSAGE, _named(("topic", SUB, False), ("consumerGroup", SUB, True))),
    (_R.QUERY_MESSAGE, _named(("topic", SUB, False))),
    (_R.HEART_BEAT, _heartbeat),
    (_R.UNREGISTER_CLIENT, _named(("consumerGroup", SUB, True))),
    (_R.GET_CONSUMER_LIST_BY_GROUP, _named(("consumerGroup", SUB, True))),
    (_R.UPDATE_CONSUMER_OFFSET, _named(("consumerGroup", SUB, True), ("topic", SUB, False))))}


def remoting_resources(code: int, ext: Mapping[str, str], body: bytes | None) -> dict[str, int]:
    """The resources a remoting request needs and the permission for each (PlainAccessResource.parse of
    RocketMQ 5, which fixed 4.4.0: batches are checked, a send to a retry topic and a send-back need the
    group's SUB); none for any other code."""
    fn = _RESOURCES.get(code)
    return fn(ext, body) if fn is not None else {}


# --- what a gRPC request names ----------------------------------------------------------------------
_CONSUMER_TYPES = frozenset({"PUSH_CONSUMER", "SIMPLE_CONSUMER", "PULL_CONSUMER", "LITE_PUSH_CONSUMER",
                             "LITE_SIMPLE_CONSUMER"})


def _name(msg, field: str) -> str | None:
    """A Resource field's name (None when unset or empty)."""
    try:
        if not msg.HasField(field):
            return None
    except ValueError:
        return None
    n = getattr(msg, field).name
    return n or None


def grpc_resources(message) -> dict[str, int]:
    """The resources a RocketMQ 5 request message needs (PlainAccessResource.parse(GeneratedMessageV3) of
    RocketMQ 5.1.2); groups as %RETRY%GROUP (see PlainAccessValidator.authorize for the bare-name
    fallback)."""
    kind = message.DESCRIPTOR.name
    out: dict[str, int] = {}

    def add(resource, perm):
        if resource:
            out[resource] = perm

    def group(msg):
        g = _name(msg, "group")
        return retry_topic(g) if g else None
    fields = message.DESCRIPTOR.fields_by_name
    if kind == "SendMessageRequest":
        if not message.messages:
            raise AclDenied("SendMessageRequest, messageCount is zero")
        topic = message.messages[0].topic.name
        if any(m.topic.name != topic for m in message.messages):
            raise AclDenied("SendMessageRequest, messages' topic is not consistent")
        add(topic, PUB)
    elif kind == "HeartbeatRequest":
        f = fields["client_type"]
        v = f.enum_type.values_by_number.get(message.client_type)
        if v is not None and v.name in _CONSUMER_TYPES:
            g = group(message)
            if g is None:
                raise AclDenied("Consumer heartbeat doesn't have group")
            add(g, SUB)
    elif kind == "TelemetryCommand":
        if message.HasField("settings"):
            s = message.settings
            if not s.HasField("publishing") and not s.HasField("subscription"):
                raise AclDenied("settings command doesn't have publishing or subscription")
            if s.HasField("publishing"):
                for t in s.publishing.topics:
                    add(t.name, PUB)
            if s.HasField("subscription"):
                add(group(s.subscription), SUB)
                for e in s.subscription.subscriptions:
                    add(e.topic.name, SUB)
    elif kind == "QueryRouteRequest":
        add(_name(message, "topic"), ANY)
    elif kind in ("EndTransactionRequest", "RecallMessageRequest"):
        add(_name(message, "topic"), PUB)
    else:
        if "group" in fields:
            add(group(message), SUB)
        if "topic" in fields:
            add(_name(message, "topic"), SUB)
        if "message_queue" in fields and message.HasField("message_queue"):
            add(_name(message.message_queue, "topic"), SUB)
    return out


class PlainAccessValidator:
    """The checks of one plain_acl.yml (immutable; a reload makes a new one)."""

    def __init__(self, config: PlainAclConfig):
        self.config = config
        self._white = config.global_white
        self._accounts = config.accounts

    def globally_trusted(self, ip: str) -> bool:
        """A client IP of globalWhiteRemoteAddresses (checked for nothing else)."""
        for w in self._white:
            if w.match(ip):
                return True
        return False

    def authenticate(self, ip: str, access_key: str | None, signature: str | None,
                     contents: Callable[[], tuple[tuple[bytes, ...], ...]]) -> PlainAccount | None:
        """The account a request is signed by, or comes from the whiteRemoteAddress of (then unsigned);
        None for an IP of globalWhiteRemoteAddresses. contents() gives what a right signature may cover,
        each as the parts of one byte string (the first is RocketMQ's)."""
        if self.globally_trusted(ip):
            return None
        if access_key is None:
            raise AclDenied("No accessKey is configured", FRAME_NO_KEY)
        account = self._accounts.get(access_key)
        if account is None:
            raise AclDenied(f"No acl config for {_q(access_key)}", FRAME_UNKNOWN_KEY)
        if account.white_remote_address.match(ip):
            return account
        if signature is not None:
            for content in contents():
                if signature_equals(account.mac.base64(*content), signature):
                    return account
        raise AclDenied(f"Check signature failed for accessKey={_q(access_key)}", FRAME_SIGNATURE)

    @staticmethod
    def authorize(account: PlainAccount, code: int | None, resources: Mapping[str, int],
                  bare_groups: bool = False) -> None:
        """checkPerm of RocketMQ 5 (see the module doc). bare_groups: a group not in groupPerms may be
        listed by its bare name in topicPerms (how RocketMQ 5.1.2's proxy checks gRPC groups)."""
        if account.admin:
            return
        if code is not None and code in ADMIN_CODES:
            raise AclDenied(f"Need admin permission for request code={code}, but accessKey={account.access_key} "
                            "is not", FRAME_ADMIN)
        owned = account.resource_perms
        for resource, needed in resources.items():
            perm = owned.get(resource)
            if perm is None and bare_groups and is_group(resource):
                perm = owned.get(resource[len(RETRY_GROUP_TOPIC_PREFIX):])
            if perm is None:
                default = account.default_group_perm if is_group(resource) else account.default_topic_perm
                if not check_permission(needed, default):
                    raise AclDenied(f"No default permission for {_q(describe(resource))}", FRAME_DEFAULT_PERM)
            elif not check_permission(needed, perm):
                raise AclDenied(f"No default permission for {_q(describe(resource))}", FRAME_LISTED_PERM)

    # --- the two protocols ----------------------------------------------------------------------------
    def check_remoting(self, cmd, ip: str) -> PlainAccount | None:
        """A RemotingCommand from a client IP: its account (None: globally white-listed), or AclDenied."""
        ext = cmd.ext_fields or {}
        body = cmd.body
        tail = body or b""

        def contents():
            if UNIQUE_MSG_QUERY_FLAG in ext:
                # a 4.x Java client signs without it, rmqstore's client and RocketMQ 4.4.0 with it
                without = (remoting_fields_bytes(ext, _SKIP_UNIQUE), tail)
                whole = (remoting_fields_bytes(ext), tail)
                return (without, whole) if cmd.version <= _V4_9_3 else (whole, without)
            return ((remoting_fields_bytes(ext), tail),)
        account = self.authenticate(ip, ext.get(ACCESS_KEY), ext.get(SIGNATURE), contents)
        if account is not None and not account.white_remote_address.match(ip):
            self.authorize(account, cmd.code, remoting_resources(cmd.code, ext, body))
        return account

    def check_admin_request(self, cmd, ip: str) -> PlainAccount | None:
        """A request only a trusted peer may make (the name server's writes): an IP of
        globalWhiteRemoteAddresses, or an admin account's (signed, or from its whiteRemoteAddress)."""
        account = self.check_remoting(cmd, ip)
        if account is not None and not account.admin:
            raise AclDenied(f"Need admin permission for request code={cmd.code}, but accessKey="
                            f"{account.access_key} is not", FRAME_ADMIN)
        return account

    def check_grpc(self, message, metadata: Mapping[str, str], ip: str) -> PlainAccount | None:
        """A RocketMQ 5 request message with its call's metadata (lower-case keys), or AclDenied."""
        if self.globally_trusted(ip):
            return None
        header = metadata.get(AUTHORIZATION)
        access_key = signature = None
        if header is not None:
            try:
                access_key, signature = parse_authorization(header)
            except AuthorizationError as e:
                raise AclDenied(str(e)) from None
        date_time = metadata.get(DATE_TIME)
        account = self.authenticate(ip, access_key, signature,
                                    lambda: ((date_time.encode("utf-8", "replace"),),) if date_time is not None else ())
        if account is not None and not account.white_remote_address.match(ip):
            self.authorize(account, None, grpc_resources(message), bare_groups=True)
        return account


__all__ = ["AclDenied", "PlainAccessValidator", "remoting_resources", "grpc_resources"]
