"""SubscriptionData: a consumer's subscription to a topic, as RocketMQ's heartbeats and pulls carry it
(FilterAPI.buildSubscriptionData); the wire model both the broker and the network client use."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..store.format import codec

SUB_ALL = "*"


@dataclass
class SubscriptionData:
    topic: str
    sub_string: str = SUB_ALL
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"
    class_filter_mode: bool = False

    @classmethod
    def build(cls, topic: str, sub_string: str | None, expression_type: str | None = "TAG",
              sub_version: int | None = None) -> "SubscriptionData":
        """FilterAPI.buildSubscriptionData: "TagA || TagB" -> tags and their Java hash codes."""
        sd = cls(topic, sub_version=int(time.time() * 1000) if sub_version is None else sub_version,
                 expression_type=expression_type or "TAG")
        if sub_string is None or sub_string == "" or sub_string == SUB_ALL:
            sd.sub_string = SUB_ALL
            return sd
        sd.sub_string = sub_string
        if sd.expression_type == "TAG":
            for tag in sub_string.split("||"):
                t = tag.strip()
                if t:
                    sd.tags_set.append(t)
                    sd.code_set.append(codec.java_string_hash(t))
        return sd

    @classmethod
    def from_json(cls, d: dict) -> "SubscriptionData":
        return cls(str(d.get("topic", "")), str(d.get("subString") or SUB_ALL), [str(t) for t in d.get("tagsSet") or []],
                   [int(c) for c in d.get("codeSet") or []], int(d.get("subVersion") or 0),
                   str(d.get("expressionType") or "TAG"), bool(d.get("classFilterMode", False)))

    def to_json(self) -> dict:
        return {"classFilterMode": self.class_filter_mode, "codeSet": list(self.code_set),
                "expressionType": self.expression_type, "subString": self.sub_string,
                "subVersion": self.sub_version, "tagsSet": list(self.tags_set), "topic": self.topic}

    @property
    def matches_all(self) -> bool:
        return self.sub_string == SUB_ALL or self.class_filter_mode or self.expression_type != "TAG"
