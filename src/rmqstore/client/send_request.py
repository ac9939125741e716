"""The requests a Producer sends: a message checked and encoded to SEND_MESSAGE_V2 (the one-letter header,
UNIQ_KEY, compressed bodies, the signed fields under ACL), the broker's answer read into a SendResult, the broker
address of a queue."""
from __future__ import annotations

import json
import time
import zlib

from ..remoting.body import UniqIdGenerator
from ..remoting.codes import (CURRENT_VERSION, PROPERTY_TRANSACTION_PREPARED, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
                              RETRY_GROUP_TOPIC_PREFIX, RequestCode, ResponseCode)
from ..remoting.command import RemotingCommand
from ..store.format import codec
from .message import Message, MessageQueue, MQBrokerError, MQClientError, SendResult, SendStatus

_SEND_OK = {ResponseCode.SUCCESS: SendStatus.SEND_OK, ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
            ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
            ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}
_UNIQ = UniqIdGenerator()
_enc = json.encoder.encode_basestring


class SendRequests:
    """Mixed into Producer (producer.py): uses its group, language, max_message_size, compression
    settings, signer and client instance."""

    # --- building requests ----------------------------------------------------------------------------
    def _check_message(self, msg: Message) -> None:
        if not isinstance(msg, Message):
            raise MQClientError("the message is not a Message")
        if not msg.topic or len(msg.topic) > 255:
            raise MQClientError(f"the specified topic {msg.topic!r} is invalid")
        if not msg.body:
            raise MQClientError("the message body is empty")
        if len(msg.body) > self.max_message_size:
            raise MQClientError(f"the message body size over max value, MAX: {self.max_message_size}")

    def _request(self, msg: Message, mq: MessageQueue, *, sys_flag_extra: int = 0, code: int = RequestCode.SEND_MESSAGE_V2,
                 body: bytes | None = None, batch: bool = False) -> RemotingCommand:
        cmd = RemotingCommand(code, language=self.language)
        if self._signer is not None:      # ext fields: the connection's RPC hook signs them
            cmd.ext_fields, cmd.body = self._send_fields(msg, mq, sys_flag_extra, body, batch)
        else:
            cmd.header, cmd.body = self._encode(msg, mq, cmd.opaque, sys_flag_extra, code, body, batch)
        return cmd

    def _body_and_flags(self, msg: Message, sys_flag: int, body: bytes | None, batch: bool) -> tuple[bytes, int, str]:
        """(body, sysFlag, properties string) of a send: the body compressed when large, the flags it needs."""
        body = msg.body if body is None else body
        if not batch and len(body) >= self.compress_msg_body_over:
            body = zlib.compress(body, 5)
            sys_flag |= codec.SYSFLAG_COMPRESSED
        props = msg.properties
        if props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
            sys_flag |= codec.TRANSACTION_PREPARED_TYPE
        try:
            p = "\x02".join(map("\x01".join, props.items())) + "\x02" if props else ""
        except TypeError:
            p = "".join([str(k) + "\x01" + str(v) + "\x02" for k, v in props.items()])
        return body, sys_flag, p

    def _send_fields(self, msg: Message, mq: MessageQueue, sys_flag: int, body: bytes | None,
                     batch: bool) -> tuple[dict[str, str], bytes]:
        """SendMessageRequestHeaderV2 as ext fields (what the encoded headers below write) and the body."""
        body, sys_flag, p = self._body_and_flags(msg, sys_flag, body, batch)
        retry = msg.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        fields = {"a": self.group, "b": msg.topic, "c": self.create_topic_key, "d": str(self.default_topic_queue_nums),
                  "e": str(mq.queue_id), "f": str(sys_flag), "g": str(time.time_ns() // 1_000_000),
                  "h": str(msg.flag), "i": p, "j": str(msg.properties.get("RECONSUME_TIME", "0")) if retry else "0",
                  "k": "false"}
        if retry and msg.properties.get("MAX_RECONSUME_TIMES") is not None:
            fields["l"] = str(msg.properties["MAX_RECONSUME_TIMES"])
        fields["m"] = "true" if batch else "false"
        return fields, body

    def _encode(self, msg: Message, mq: MessageQueue, opaque: int, sys_flag: int = 0,
                code: int = RequestCode.SEND_MESSAGE_V2, body: bytes | None = None,
                batch: bool = False) -> tuple[bytes, bytes]:
        """(header, body) of a send request: SendMessageRequestHeaderV2 as the Java client writes it,
        encoded here directly (the hot path); signed through ext fields when the producer has credentials."""
        if self._signer is not None:
            fields, body = self._send_fields(msg, mq, sys_flag, body, batch)
            cmd = RemotingCommand(code, opaque=opaque, ext_fields=fields, body=body, language=self.language)
            self._signer(cmd)
            return cmd.encode_header(), body
        body, sys_flag, p = self._body_and_flags(msg, sys_flag, body, batch)
        topic, props = msg.topic, msg.properties
        if not batch and topic[0] != "%":         # the usual send: one cached format, 6 values
            fmt = self._heads.get((topic, code))
            if fmt is None:
                fmt = self._heads[(topic, code)] = (
                    ('{"code":%d,"extFields":{"a":%s,"b":%s,"c":%s,"d":"%d","e":"' % (
                        code, self._enc_group, _enc(topic), self._enc_key, self.default_topic_queue_nums)).replace("%", "%%")
                    + '%d","f":"%d","g":"%d","h":"%d","i":%s,"j":"0","k":"false","m":"false"},"flag":0,"language":'
                    + self._enc_lang.replace("%", "%%") + ',"opaque":%d,"serializeTypeCurrentRPC":"JSON","version":'
                    + str(CURRENT_VERSION) + "}")
            header = (fmt % (mq.queue_id, sys_flag, time.time_ns() // 1_000_000, msg.flag, _enc(p), opaque)).encode()
            return header, body
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            j = _enc(props.get("RECONSUME_TIME", "0"))
            l_field = props.get("MAX_RECONSUME_TIMES")
            tail = ('"j":%s,"k":"false","l":%s,' % (j, _enc(l_field))) if l_field is not None else \
                '"j":%s,"k":"false",' % j
        else:
            tail = '"j":"0","k":"false",'
        head = '{"code":%d,"extFields":{"a":%s,"b":%s,"c":%s,"d":"%d","e":"' % (
            code, self._enc_group, _enc(topic), self._enc_key, self.default_topic_queue_nums)
        header = ('%s%d","f":"%d","g":"%d","h":"%d","i":%s,%s"m":"%s"},"flag":0,"language":%s,"opaque":%d,'
                  '"serializeTypeCurrentRPC":"JSON","version":%d}' % (
                      head, mq.queue_id, sys_flag, time.time_ns() // 1_000_000, msg.flag, _enc(p), tail,
                      "true" if batch else "false", self._enc_lang, opaque, CURRENT_VERSION)).encode("utf-8")
        return header, body

    @staticmethod
    def _result(resp: RemotingCommand, msg_id: str, mq: MessageQueue, addr: str) -> SendResult:
        status = _SEND_OK.get(resp.code)
        if status is None:
            raise MQBrokerError(resp.code, resp.remark, addr)
        f = resp.ext_fields or {}
        try:
            queue_id = int(f.get("queueId", mq.queue_id))
            offset = int(f.get("queueOffset", -1))
        except ValueError:
            raise MQClientError(f"bad send response from {addr}: {f}") from None
        return SendResult(status, msg_id, f.get("msgId", ""),
                          mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id), offset,
                          None, f.get("MSG_REGION"), f.get("TRACE_ON", "true") != "false")

    def _broker_addr(self, mq: MessageQueue) -> str:
        a = self._channels.get(mq.broker_name)
        if a is not None:
            return a
        m = self._check()
        addr = m.find_broker_addr(mq.broker_name)
        if addr is None:
            m.update_route(mq.topic)
            addr = m.find_broker_addr(mq.broker_name)
        if addr is None:
            raise MQClientError(f"The broker[{mq.broker_name}] not exist")
        a = self._channels[mq.broker_name] = m.broker_channel(addr)
        return a

    @staticmethod
    def _prepare(msg: Message) -> str:
        uid = msg.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if uid is None:
            uid = _UNIQ.new_id()
            msg.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uid
        return uid
