"""MQAdminImpl: the lookups producers, consumers and Admin share, each a function of the client instance.

Queue offsets (GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME, each
sent to the queue's broker on its VIP channel), the queues a consumer may read (from the topic's route),
messages by key (QUERY_MESSAGE on every broker of the topic) and by id (VIEW_MESSAGE_BY_ID).
"""
from __future__ import annotations

from ..remoting.codes import UNIQUE_MSG_QUERY_FLAG, RequestCode, ResponseCode
from ..remoting.command import RemotingCommand
from ..store.format import codec
from .instance import MQClientInstance, subscribe_info
from .message import MessageExt, MessageQueue, MQBrokerError, MQClientError, decode_messages

LONG_MAX = 2 ** 63 - 1


def query_message(mq: MQClientInstance, topic: str, key: str, max_num: int = 32, begin: int = 0, end: int = LONG_MAX,
                  unique_key: bool = False, timeout: float = 9.0) -> list[MessageExt]:
    """QUERY_MESSAGE on every broker of the topic; keeps the messages that really carry the key (the broker
    answers raw index matches)."""
    route = mq.update_route(topic)
    if route is None:
        raise MQClientError(f"The topic[{topic}] not matched route info")
    out: list[MessageExt] = []
    seen = set()
    for name, addrs in route.broker_addrs().items():
        addr = addrs.get(0) or next(iter(addrs.values()), None)
        if addr is None:
            continue
        cmd = mq.request(RequestCode.QUERY_MESSAGE, {"topic": topic, "key": key, "maxNum": max_num,
                                                     "beginTimestamp": begin, "endTimestamp": end})
        cmd.ext_fields[UNIQUE_MSG_QUERY_FLAG] = "true" if unique_key else "false"
        r = mq.invoke(mq.broker_channel(addr), cmd, timeout)
        if r.code == ResponseCode.QUERY_NOT_FOUND:
            continue
        if r.code != ResponseCode.SUCCESS:
            raise MQBrokerError(r.code, r.remark, addr)
        for m in decode_messages(r.body or b"", name):
            if m.topic != topic or m.offset_msg_id in seen:
                continue
            if (unique_key and m.msg_id == key) or (not unique_key and key in m.keys):
                seen.add(m.offset_msg_id)
                out.append(m)
    return out


def view_message(mq: MQClientInstance, msg_id: str, timeout: float = 3.0) -> MessageExt:
    """VIEW_MESSAGE_BY_ID: msg_id is an offset message id (the store's address + commitlog offset)."""
    try:
        addr, offset = codec.decode_message_id(msg_id)
    except ValueError as e:
        raise MQClientError(f"query message by id finished, but no message: {e}") from None
    try:
        r = mq.invoke(mq.broker_channel(addr), mq.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset}), timeout)
    except (OSError, TimeoutError) as e:
        raise MQClientError(f"view message {msg_id}: {e}") from None
    if r.code != ResponseCode.SUCCESS:
        raise MQBrokerError(r.code, r.remark, addr)
    msgs = decode_messages(r.body or b"")
    if not msgs:
        raise MQClientError("query message by id finished, but no message")
    return msgs[0]


def view_message_any(mq: MQClientInstance, topic: str, msg_id: str) -> MessageExt:
    """viewMessage(topic, msgId): an offset id first, else the producer's unique id (UNIQ_KEY) via the index."""
    try:
        return view_message(mq, msg_id)
    except (MQClientError, ValueError, OSError):
        pass
    found = query_message(mq, topic, msg_id, 32, 0, LONG_MAX, unique_key=True)
    if not found:
        raise MQClientError(f"query message by id finished, but no message: {msg_id}")
    return found[0]


def queue_call(mq: MQClientInstance, code: int, queue: MessageQueue, extra: dict | None = None) -> RemotingCommand:
    """A request about one queue (topic, queueId and extra as header fields) to its broker; the answer, or
    MQBrokerError when it is not SUCCESS."""
    addr = mq.broker_addr_of(queue)
    fields = {"topic": queue.topic, "queueId": queue.queue_id}
    fields.update(extra or {})
    r = mq.invoke(mq.broker_channel(addr), mq.request(code, fields))
    if r.code != ResponseCode.SUCCESS:
        raise MQBrokerError(r.code, r.remark, addr)
    return r


def max_offset(mq: MQClientInstance, queue: MessageQueue) -> int:
    return int(queue_call(mq, RequestCode.GET_MAX_OFFSET, queue).field("offset"))


def min_offset(mq: MQClientInstance, queue: MessageQueue) -> int:
    return int(queue_call(mq, RequestCode.GET_MIN_OFFSET, queue).field("offset"))


def search_offset(mq: MQClientInstance, queue: MessageQueue, timestamp: int) -> int:
    return int(queue_call(mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, queue, {"timestamp": timestamp}).field("offset"))


def earliest_msg_store_time(mq: MQClientInstance, queue: MessageQueue) -> int:
    return int(queue_call(mq, RequestCode.GET_EARLIEST_MSG_STORETIME, queue).field("timestamp"))


def fetch_subscribe_message_queues(mq: MQClientInstance, topic: str) -> set[MessageQueue]:
    route = mq.update_route(topic)
    if route is None:
        raise MQClientError(f"Can not find Message Queue for this topic, {topic}")
    return subscribe_info(topic, route)
