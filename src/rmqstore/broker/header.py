"""Typed access to a request's extFields, RocketMQ's decodeCommandCustomHeader rules."""
from __future__ import annotations

FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
LONG_MAX = 2 ** 63 - 1
INT_MIN, INT_MAX = -2 ** 31, 2 ** 31 - 1
# SendMessageRequestHeaderV2's one-letter names.
V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
            "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
            "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch"}
V2_ALIAS = {v: k for k, v in V2_NAMES.items()}


class HeaderError(Exception):
    """A custom header field is missing or malformed (RocketMQ answers SYSTEM_ERROR)."""


class Header:
    """Typed access to extFields, RocketMQ's decodeCommandCustomHeader rules."""

    __slots__ = ("f", "alias")

    def __init__(self, fields: dict | None, alias: dict | None = None):
        self.f = fields or {}
        self.alias = alias

    def get(self, name: str):
        a = self.alias
        return self.f.get(a.get(name, name) if a else name)

    def str(self, name: str, required: bool = True) -> str | None:
        v = self.get(name)
        if v is None and required:
            raise HeaderError(f"the custom field <{name}> is null")
        return v

    def int(self, name: str, required: bool = True, default: int | None = None, bits: int = 32) -> int | None:
        v = self.get(name)
        if v is None:
            if required:
                raise HeaderError(f"the custom field <{name}> is null")
            return default
        try:
            n = int(v)
        except ValueError:
            raise HeaderError(f"the custom field <{name}> is not a number: {v[:40]!r}") from None
        lim = 1 << (bits - 1)
        if not -lim <= n < lim:
            raise HeaderError(f"the custom field <{name}> is out of range: {v[:40]!r}")
        return n

    def long(self, name: str, required: bool = True, default: int | None = None) -> int | None:
        return self.int(name, required, default, 64)

    def bool(self, name: str, default: bool = False) -> bool:
        v = self.get(name)
        return default if v is None else v.lower() == "true"
