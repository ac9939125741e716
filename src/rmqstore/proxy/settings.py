"""The Settings the server answers on a client's Telemetry stream (RocketMQ 5's proxy: GrpcClientSettingsManager):
the client's own settings completed with the server's backoff policy, request timeout, publishing limits or
subscription parameters, and metrics off. The Python client blocks its start until it gets them."""
from __future__ import annotations

from dataclasses import dataclass

from .protocol import ClientType, definition

PRODUCER_MAX_ATTEMPTS = 3
CONSUMER_MAX_ATTEMPTS = 17          # maxReconsumeTimes (16) + 1
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_TIMEOUT_S = 30


@dataclass(frozen=True, slots=True)
class ServerSettings:
    max_body_size: int = 4 * 1024 * 1024
    request_timeout_s: int = 3
    validate_message_type: bool = False
    max_reconsume_times: int = 16


def answer_settings(client: "definition.Settings", server: ServerSettings, fifo: bool = False) -> "definition.Settings":
    """The client's settings as the server fixes them (a new message; `client` is not changed)."""
    s = definition.Settings()
    s.CopyFrom(client)
    s.request_timeout.seconds = server.request_timeout_s
    s.metric.on = False
    s.metric.ClearField("endpoints")
    backoff = s.backoff_policy
    backoff.Clear()
    if client.client_type == ClientType.PRODUCER or client.WhichOneof("pub_sub") == "publishing":
        backoff.max_attempts = PRODUCER_MAX_ATTEMPTS
        backoff.exponential_backoff.initial.FromMilliseconds(10)
        backoff.exponential_backoff.max.FromMilliseconds(1000)
        backoff.exponential_backoff.multiplier = 2.0
        s.publishing.max_body_size = server.max_body_size
        s.publishing.validate_message_type = server.validate_message_type
    else:
        backoff.max_attempts = server.max_reconsume_times + 1
        backoff.customized_backoff.next.add().FromSeconds(1)
        for secs in (5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200):
            backoff.customized_backoff.next.add().FromSeconds(secs)
        sub = s.subscription
        sub.fifo = fifo
        if not sub.receive_batch_size:
            sub.receive_batch_size = RECEIVE_BATCH_SIZE
        if not sub.long_polling_timeout.seconds and not sub.long_polling_timeout.nanos:
            sub.long_polling_timeout.seconds = LONG_POLLING_TIMEOUT_S
    return s
