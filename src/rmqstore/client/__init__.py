"""A pure-Python RocketMQ 4.x client: Producer, PushConsumer, PullConsumer.

It speaks what RocketMQ 4.4.0's Java client speaks (frames, JSON headers, fastjson bodies, the VIP port
for sends and offset calls), so it works against rmqstore's server and against a real RocketMQ broker.
With `credentials=SessionCredentials(access_key, secret_key)` every request is signed for plain ACL.
"""
from ..acl.signature import SessionCredentials
from .admin import Admin
from .consumer import PullConsumer, PushConsumer, allocate_averagely
from .message import (ConsumeFromWhere, ConsumeStatus, LocalTransactionState, Message, MessageExt, MessageModel,
                      MessageQueue, MQBrokerError, MQClientError, PullResult, PullStatus, SendResult, SendStatus,
                      TransactionSendResult)
from .producer import Producer

__all__ = ["Admin", "Producer", "PushConsumer", "PullConsumer", "allocate_averagely", "Message", "MessageExt", "MessageQueue",
           "SendResult", "SendStatus", "PullResult", "PullStatus", "ConsumeStatus", "ConsumeFromWhere", "MessageModel",
           "LocalTransactionState", "TransactionSendResult", "MQClientError", "MQBrokerError", "SessionCredentials"]
