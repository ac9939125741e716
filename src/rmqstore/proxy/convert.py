"""Pure conversions between RocketMQ 5's protocol Message and the store's messages, the way RocketMQ 5's
proxy maps them (GrpcConverter / MessageConverter):

    system_properties.tag            TAGS
    system_properties.keys           KEYS (space separated)
    system_properties.message_id     UNIQ_KEY
    system_properties.message_group  __SHARDINGKEY
    delivery_timestamp               TIMER_DELIVER_MS (milliseconds)
    TRANSACTION                      TRAN_MSG=true, PGROUP, sysFlag PREPARED
    user_properties                  the other properties, as they are
"""
from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

from ..messaging.pop import PROPERTY_SHARDING_KEY
from ..store.format import codec
from ..store.format.message import Message, MessageExt
from ..store.timer.timer import PROPERTY_START_DELIVER_TIME, PROPERTY_TIMER_DELIVER_MS
from .message_id import next_message_id
from .protocol import DigestType, MessageType, definition

PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRACE_CONTEXT = "TRACE_CONTEXT"
PROPERTY_BORN_HOST = "__BORNHOST"
# properties the protocol carries in system_properties: never copied into user_properties
SYSTEM_KEYS = frozenset({codec.PROPERTY_TAGS, codec.PROPERTY_KEYS, codec.PROPERTY_UNIQ_KEY, PROPERTY_SHARDING_KEY,
                         PROPERTY_TIMER_DELIVER_MS, codec.PROPERTY_TRAN_PREPARED, codec.PROPERTY_PRODUCER_GROUP,
                         PROPERTY_TRANSACTION_ID, PROPERTY_CHECK_IMMUNITY, PROPERTY_TRACE_CONTEXT,
                         codec.PROPERTY_REAL_TOPIC, codec.PROPERTY_REAL_QUEUE_ID, "MIN_OFFSET", "MAX_OFFSET",
                         "CONSUME_START_TIME", "WAIT", "CLUSTER", "MSG_REGION", "TRACE_ON", "RETRY_TOPIC",
                         "ORIGIN_MESSAGE_ID", "REAL_TOPIC", "POP_CK", "1ST_POP_TIME", codec.PROPERTY_DELAY,
                         "TIMER_OUT_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES",
                         "TIMER_DEL_UNIQKEY"})


class BadMessageError(ValueError):
    """A protocol message the server refuses; `code` is the protocol's status code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def timestamp_ms(ts) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def set_timestamp_ms(ts, ms: int) -> None:
    ts.seconds, rem = divmod(int(ms), 1000)
    ts.nanos = rem * 1_000_000


def crc32_hex(body: bytes) -> str:
    """A CRC32 body digest as 8 upper-case hex characters."""
    return format(zlib.crc32(body) & 0xFFFFFFFF, "08X")


def md5_hex(body: bytes) -> str:
    """The body digest sent with every received message: MD5, upper-case hex, as RocketMQ 5's proxy sends it
    (GrpcConverter). The clients check it each their own way, and agree on this one: the Node client
    compares a CRC32 as a decimal string and the Java client as unpadded hex, so a CRC32 digest is
    `corrupted` for them (the Node FIFO consumer discards such messages)."""
    return hashlib.md5(body).hexdigest().upper()


def digest_problem(digest_type: int, checksum: str, body: bytes) -> str | None:
    """Why a sent message's body digest does not match its body, or None. The clients spell digests their
    own way: CRC32 as hex (padded or not, either case) or decimal; MD5 and SHA1 as hex in either case.
    An unknown digest type is not checked."""
    c = checksum.strip()
    if digest_type == DigestType.CRC32:
        crc = zlib.crc32(body) & 0xFFFFFFFF
        try:
            ok = int(c, 16) == crc or (c.isdigit() and int(c) == crc)
        except ValueError:
            ok = False
        return None if ok else f"body digest {checksum} does not match the body's CRC32 {crc32_hex(body)}"
    for kind, fn in ((DigestType.MD5, hashlib.md5), (DigestType.SHA1, hashlib.sha1)):
        if digest_type == kind:
            want = fn(body).hexdigest()
            return None if c.lower() == want else f"body digest {checksum} does not match the body's " \
                                                   f"{DigestType.Name(kind)} {want.upper()}"
    return None


@dataclass(slots=True)
class IncomingMessage:
    """A protocol message turned into a store message, with what the server does with it."""
    message: Message
    message_id: str
    message_type: int
    deliver_ms: int | None          # a timer message's delivery time (ms), else None
    transactional: bool


def peer_address(peer: str) -> str:
    """grpc's peer ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000") as the store's born host "ip:port"; the
    address RocketMQ's proxy stores as the born host (the client's own born_host goes to __BORNHOST)."""
    kind, _, addr = peer.partition(":")
    if kind == "ipv4" and addr:
        return addr
    if kind == "ipv6" and addr.startswith("["):
        host, _, port = addr[1:].partition("]:")
        return f"{host}:{port or 0}"
    return "127.0.0.1:0"


def from_protocol(m, *, born_host: str, producer_group: str, max_body_size: int) -> IncomingMessage:
    """A SendMessageRequest's message to a store message (queue id left to the caller; born_host the
    connection's "ip:port", see peer_address). Raises
    BadMessageError with the protocol's code for what RocketMQ's proxy refuses."""
    topic = m.topic.name
    sp = m.system_properties
    body = bytes(m.body)
    if not body:
        raise BadMessageError(definition.Code.MESSAGE_BODY_EMPTY, f"message body of topic {topic} is empty")
    if len(body) > max_body_size:
        raise BadMessageError(definition.Code.MESSAGE_BODY_TOO_LARGE,
                              f"message body of {len(body)} bytes exceeds the limit of {max_body_size} bytes")
    why = digest_problem(sp.body_digest.type, sp.body_digest.checksum, body) \
        if sp.HasField("body_digest") and sp.body_digest.checksum else None
    if why is not None:
        raise BadMessageError(definition.Code.MESSAGE_CORRUPTED, why)
    props: dict[str, str] = {}
    for k, v in m.user_properties.items():
        if k in SYSTEM_KEYS:
            raise BadMessageError(definition.Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property key {k!r} is reserved")
        props[k] = v
    if sp.HasField("tag"):
        if not sp.tag.strip() or "|" in sp.tag:
            raise BadMessageError(definition.Code.ILLEGAL_MESSAGE_TAG, f"illegal tag {sp.tag!r}")
        props[codec.PROPERTY_TAGS] = sp.tag
    keys = [k for k in sp.keys if k]
    if keys:
        props[codec.PROPERTY_KEYS] = codec.KEY_SEPARATOR.join(keys)
    msg_id = sp.message_id or next_message_id()
    props[codec.PROPERTY_UNIQ_KEY] = msg_id
    mtype = sp.message_type or MessageType.NORMAL
    if sp.HasField("message_group"):
        if not sp.message_group:
            raise BadMessageError(definition.Code.ILLEGAL_MESSAGE_GROUP, "empty message group")
        props[PROPERTY_SHARDING_KEY] = sp.message_group
    deliver_ms = None
    if sp.HasField("delivery_timestamp"):
        deliver_ms = timestamp_ms(sp.delivery_timestamp)
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_ms)
    if sp.HasField("trace_context") and sp.trace_context:
        props[PROPERTY_TRACE_CONTEXT] = sp.trace_context
    transactional = mtype == MessageType.TRANSACTION
    sys_flag = 0
    if transactional:
        props[codec.PROPERTY_TRAN_PREPARED] = "true"
        props[codec.PROPERTY_PRODUCER_GROUP] = producer_group
        props[PROPERTY_TRANSACTION_ID] = msg_id
        if sp.HasField("orphaned_transaction_recovery_duration"):
            props[PROPERTY_CHECK_IMMUNITY] = str(max(1, sp.orphaned_transaction_recovery_duration.seconds))
        sys_flag = codec.TRANSACTION_PREPARED_TYPE
    born = timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else 0
    if sp.born_host:
        props[PROPERTY_BORN_HOST] = sp.born_host      # the client's own name for itself (a host name, an IP)
    msg = Message(topic=topic, body=body, sys_flag=sys_flag, born_timestamp=born, born_host=born_host,
                  properties=props)
    return IncomingMessage(msg, msg_id, mtype, deliver_ms, transactional)


def message_id_of(m: MessageExt) -> str:
    """The id a client sees: UNIQ_KEY (a 5.x client's id, or a 4.x client's unique key), else the
    offset message id."""
    return m.properties.get(codec.PROPERTY_UNIQ_KEY) or m.msg_id


def message_type_of(props: dict[str, str]) -> int:
    if PROPERTY_SHARDING_KEY in props:
        return MessageType.FIFO
    if PROPERTY_TIMER_DELIVER_MS in props or codec.PROPERTY_DELAY in props or PROPERTY_START_DELIVER_TIME in props:
        return MessageType.DELAY
    if props.get(codec.PROPERTY_TRAN_PREPARED) == "true":
        return MessageType.TRANSACTION
    return MessageType.NORMAL


def body_of(m: MessageExt) -> bytes:
    """The body as the producer sent it (a 4.x producer's compressed body inflated)."""
    body = m.body or b""
    if m.sys_flag & codec.SYSFLAG_COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error:
            pass        # left as stored; the digest matches what is sent
    return body


def to_protocol(m: MessageExt, *, topic: str | None = None, receipt_handle: str | None = None,
                invisible_ms: int | None = None, delivery_attempt: int | None = None,
                broker_addr: str = "") -> "definition.Message":
    """A stored message as a ReceiveMessageResponse's message (topic: the name the consumer asked for)."""
    out = definition.Message()
    out.topic.name = topic or m.topic
    props = m.properties
    for k, v in props.items():
        if k not in SYSTEM_KEYS:
            out.user_properties[k] = v
    body = body_of(m)
    out.body = body
    sp = out.system_properties
    tag = props.get(codec.PROPERTY_TAGS)
    if tag is not None:
        sp.tag = tag
    sp.keys.extend(m.keys)
    sp.message_id = message_id_of(m)
    sp.body_digest.type = DigestType.MD5
    sp.body_digest.checksum = md5_hex(body)
    sp.body_encoding = definition.Encoding.IDENTITY
    sp.message_type = message_type_of(props)
    set_timestamp_ms(sp.born_timestamp, m.born_timestamp)
    sp.born_host = props.get(PROPERTY_BORN_HOST) or m.born_host.rsplit(":", 1)[0]
    set_timestamp_ms(sp.store_timestamp, m.store_timestamp)
    sp.store_host = broker_addr or m.store_host
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    if PROPERTY_SHARDING_KEY in props:
        sp.message_group = props[PROPERTY_SHARDING_KEY]
    if PROPERTY_TIMER_DELIVER_MS in props:
        try:
            set_timestamp_ms(sp.delivery_timestamp, int(props[PROPERTY_TIMER_DELIVER_MS]))
        except ValueError:
            pass
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_ms is not None:
        sp.invisible_duration.seconds, rem = divmod(invisible_ms, 1000)
        sp.invisible_duration.nanos = rem * 1_000_000
    sp.delivery_attempt = delivery_attempt if delivery_attempt is not None else m.reconsume_times + 1
    if PROPERTY_TRACE_CONTEXT in props:
        sp.trace_context = props[PROPERTY_TRACE_CONTEXT]
    return out
