"""The one validation boundary: what a message must be to enter the store, and why one is refused.

Every way in goes through here: MessageStore.put_message / put_messages (lists and MessageBatch, the
columnar path too), the GroupCommitService (a put is checked in its own thread, before it joins a round),
Producer, `rmqstore load` (it calls the store), the broker's sends and the Spark writer.

Two rules:

- The store's rule (store_*/properties_* below): refuse exactly what can break the store or escape its
  directory, and accept everything RocketMQ's own store accepts (`订单Topic`, `%RETRY%g`, `%DLQ%g`,
  `SCHEDULE_TOPIC_XXXX`, `RMQ_SYS_TRANS_HALF_TOPIC`, `rmq_sys_*`). A topic is 1 to 127 bytes of UTF-8
  without control characters (< 0x20, 0x7f), '/' or '\\', and is not '.' or '..' (topics and queue ids
  become directory names under consumequeue/); a queue id is an int in 0..MAX_QUEUE_ID (in
  SCHEDULE_TOPIC_XXXX, a delay level's: scanner.queue_problem, checked by the put path's encoder, which
  knows messageDelayLevel; dispatch takes any other for a damaged header); property names are
  non-empty str, values str, neither holds the separators \\x01 / \\x02 (they would be read back as other
  properties: UNIQ_KEY, TAGS or KEYS could be injected); a body is bytes-like (a str is refused, not
  encoded: its bytes would be a guess); the record fits maxMessageSize and its properties 32767 bytes.
  Refusals answer MESSAGE_ILLEGAL or PROPERTIES_SIZE_EXCEEDED with a reason naming the argument.
- The client's and broker's stricter topic rule `^[%|a-zA-Z0-9_-]+$` (RocketMQ's Validators.checkTopic and
  AbstractSendMessageProcessor.msgCheck), applied to topic creation, sends over the network and the
  in-process Producer: check_client_topic raises InvalidMessageError naming the topic.

The checks are cheap where they run per message: a topic is checked once and then cached by the commitlog,
properties are checked by counting the separators of the joined string it builds anyway (one C scan each),
a MessageBatch's columns are checked a column at a time.
"""
from __future__ import annotations

import re

from . import codec

MAX_TOPIC_BYTES = codec.MAX_TOPIC_LENGTH        # 127: TOPICLENGTH is one byte in a v1 record
# The largest queue id the store takes. RocketMQ's broker allows at most 65535 read / write queues per topic
# (updateAndCreateTopic), so its queue ids are 0..65534; anything larger (or negative) is a bug of the caller,
# and would create consume queue directories RocketMQ would never read.
MAX_QUEUE_ID = 65535
MAX_PROPERTIES_BYTES = codec.MAX_PROPERTIES_LENGTH     # 32767: PROPERTIESLENGTH is a signed short

CLIENT_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")     # RocketMQ's Validators.VALID_PATTERN_STR
_TOPIC_BAD = re.compile(r"[\x00-\x1f\x7f/\\]")
_SEPARATORS = re.compile("[\x01\x02]")


class InvalidMessageError(ValueError):
    """A message (or one of its arguments) refused by the validation boundary; the message names the argument."""


def topic_problem(topic, max_bytes: int = MAX_TOPIC_BYTES) -> str | None:
    """Why the store refuses this topic, or None if it takes it (max_bytes: a v2 record's topic may be longer)."""
    if not isinstance(topic, str):
        return f"topic {topic!r} is a {type(topic).__name__}, not a str"
    if not topic:
        return "topic is empty"
    if topic == "." or topic == "..":
        return f"topic {topic!r} is not a valid directory name"
    m = _TOPIC_BAD.search(topic)
    if m is not None:
        return (f"topic {topic[:60]!r} contains {m.group()!r} at index {m.start()} "
                "(control characters, '/' and '\\' are refused)")
    try:
        n = len(topic.encode("utf-8"))
    except UnicodeEncodeError as e:
        return f"topic {topic[:60]!r} is not valid UTF-8 ({e.reason})"
    if n > max_bytes:
        return f"topic {topic[:60]!r}... is {n} bytes of UTF-8, at most {max_bytes} are allowed"
    return None


def queue_id_problem(queue_id) -> str | None:
    """Why the store refuses this queue id, or None."""
    if type(queue_id) is int and 0 <= queue_id <= MAX_QUEUE_ID:
        return None
    q = queue_id_or_problem(queue_id)
    return q if type(q) is str else None


def _is_int(v) -> bool:
    try:
        v.__index__()
    except (AttributeError, TypeError):
        return False
    return True


def body_problem(body) -> str | None:
    """Why the store refuses this body, or None (bytes, bytearray, a byte-wide contiguous memoryview, None)."""
    if body is None or type(body) is bytes or type(body) is bytearray:
        return None
    if isinstance(body, str):
        return "body is a str: pass bytes (encode it yourself; the store does not guess an encoding)"
    if isinstance(body, (bytes, bytearray)):
        return None
    if isinstance(body, memoryview):
        if body.c_contiguous and body.itemsize == 1:
            return None
        return f"body is a memoryview of format {body.format!r}: pass bytes"
    return f"body is a {type(body).__name__}, not bytes"


def properties_problem(props) -> str | None:
    """Why the store refuses these properties (before their size is known), or None."""
    if props is None:
        return None
    if not isinstance(props, dict):
        try:
            props = dict(props)
        except (TypeError, ValueError):
            return f"properties are a {type(props).__name__}, not a dict of str to str"
    for name, value in props.items():
        if not isinstance(name, str):
            return f"property name {name!r} is a {type(name).__name__}, not a str"
        if not name:
            return "a property name is empty"
        if not isinstance(value, str):
            return f"property {name[:60]!r} has a value of type {type(value).__name__}, not a str"
        for what, s in (("name", name), ("value", value)):
            m = _SEPARATORS.search(s)
            if m is not None:
                return (f"property {name[:60]!r}: its {what} contains the separator {m.group()!r} "
                        "(\\x01 and \\x02 separate properties)")
    return None


def encode_properties(props) -> bytes | str:
    """The PROPERTIES field (bytes) of a message's properties, or the reason (a str) they are refused.
    The fast path joins them as the record holds them and counts the separators in the result: each
    name-value pair adds exactly one \\x01 and one \\x02, so any other count means one was inside a name
    or value."""
    if not props:
        return b""
    try:
        s = "\x02".join(map("\x01".join, props.items())) + "\x02"
    except (TypeError, AttributeError):
        return properties_problem(props) or "properties cannot be encoded"
    n = len(props)
    if s.count("\x01") != n or s.count("\x02") != n or "" in props:
        return properties_problem(props) or "properties cannot be encoded"
    try:
        return s.encode()
    except UnicodeEncodeError as e:
        return f"properties are not valid UTF-8 ({e.reason})"


def message_problem(msg) -> str | None:
    """Why the store refuses a Message (what does not depend on sizes), or None. For callers that check a
    message before it is encoded (Producer, Spark writer); the commitlog checks the same as it encodes."""
    try:
        topic, queue_id, body, props = msg.topic, msg.queue_id, msg.body, msg.properties
    except AttributeError as e:
        return f"not a message: {e}"
    why = topic_problem(topic) or queue_id_problem(queue_id) or body_problem(body)
    if why:
        return why
    p = encode_properties(props)
    if type(p) is str:
        return p
    if len(p) > MAX_PROPERTIES_BYTES:
        return f"properties of {len(p)} bytes exceed {MAX_PROPERTIES_BYTES}"
    return None


def check_message(msg) -> None:
    """Raise InvalidMessageError naming the argument if the store would refuse msg."""
    why = message_problem(msg)
    if why:
        raise InvalidMessageError(why)


def client_topic_problem(topic) -> str | None:
    """Why RocketMQ's client / broker rule refuses a topic for a send or topic creation, or None."""
    why = topic_problem(topic)
    if why:
        return why
    if not CLIENT_TOPIC_RE.match(topic):
        return f"the topic[{topic[:200]}] is not a valid topic name: it must match {CLIENT_TOPIC_RE.pattern}"
    return None


def check_client_topic(topic) -> None:
    """Raise InvalidMessageError naming the topic if RocketMQ's client would refuse it."""
    why = client_topic_problem(topic)
    if why:
        raise InvalidMessageError(why)


def columns_problem(names, columns, n: int) -> str | None:
    """Why the store refuses a MessageBatch's property columns (names[j] -> one str or n str), or None; the
    separators of the joined values are counted column by column."""
    for name, col in zip(names, columns):
        if not isinstance(name, str) or not name or _SEPARATORS.search(name):
            return properties_problem({name: ""})
        if isinstance(col, str):
            if _SEPARATORS.search(col):
                return properties_problem({name: col})
            continue
        try:
            s = "".join(col)
        except TypeError:
            bad = next(v for v in col if not isinstance(v, str))
            return properties_problem({name: bad})
        if "\x01" in s or "\x02" in s:
            bad = next(v for v in col if "\x01" in v or "\x02" in v)
            return properties_problem({name: bad})
    return None


def queue_id_or_problem(queue_id) -> int | str:
    """queue_id as an int (numpy ints and other integers are taken) if the store takes it, else the reason (a str)."""
    if not _is_int(queue_id):
        return f"queue id {queue_id!r} is a {type(queue_id).__name__}, not an int"
    q = queue_id.__index__()
    if 0 <= q <= MAX_QUEUE_ID:
        return q
    return f"queue id {q} is out of range 0..{MAX_QUEUE_ID}"
