"""The decoders of the broker's tables the store keeps in `{store}/config/` and reads back itself (its check,
its repair, a slave's sync): topics.json (TopicConfig), consumerOffset.json and delayOffset.json. Pure
functions from parsed JSON to typed tables, a ValueError naming the entry for a wrong shape; the managers
that own and write these files (messaging/topic_config.py, messaging/offset_store.py,
messaging/schedule.py) load them with these decoders.

    topics.json          {"dataVersion": {...}, "topicConfigTable": {"T": {"perm": 6, "readQueueNums": 4, ...}}}
    consumerOffset.json  {"offsetTable": {"TopicA@groupX": {"0": 12, "1": 7}}}
    delayOffset.json     {"offsetTable": {"1": 12, ...}}        (delay level -> offset in its schedule queue)
"""
from __future__ import annotations

from dataclasses import dataclass

from .config_file import as_int, as_object

PERM_PRIORITY = 0x1 << 3
PERM_READ = 0x1 << 2
PERM_WRITE = 0x1 << 1
PERM_INHERIT = 0x1 << 0
DEFAULT_READ_QUEUE_NUMS = 16
DEFAULT_WRITE_QUEUE_NUMS = 16


@dataclass
class TopicConfig:
    topic_name: str
    read_queue_nums: int = DEFAULT_READ_QUEUE_NUMS
    write_queue_nums: int = DEFAULT_WRITE_QUEUE_NUMS
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writeable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    def to_json(self) -> dict:
        # fastjson writes a bean's fields sorted by name
        return {"order": self.order, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicFilterType": self.topic_filter_type, "topicName": self.topic_name,
                "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, name: str, d: dict) -> "TopicConfig":
        """One entry of topicConfigTable; ValueError naming the topic and field for a wrong shape."""
        d = as_object(d, f"topicConfigTable[{name!r}]")
        where = f"topicConfigTable[{name!r}]."
        topic_name = d.get("topicName", name)
        if not isinstance(topic_name, str) or not topic_name:
            raise ValueError(f"{where}topicName {topic_name!r} is not a topic name")
        order = d.get("order", False)
        if not isinstance(order, bool):
            raise ValueError(f"{where}order {order!r} is not a boolean")
        return cls(topic_name=topic_name,
                   read_queue_nums=as_int(d.get("readQueueNums", DEFAULT_READ_QUEUE_NUMS), where + "readQueueNums"),
                   write_queue_nums=as_int(d.get("writeQueueNums", DEFAULT_WRITE_QUEUE_NUMS),
                                           where + "writeQueueNums"),
                   perm=as_int(d.get("perm", PERM_READ | PERM_WRITE), where + "perm"),
                   topic_filter_type=str(d.get("topicFilterType", "SINGLE_TAG")),
                   topic_sys_flag=as_int(d.get("topicSysFlag", 0), where + "topicSysFlag"), order=order)


def decode_topics(data) -> tuple[dict[str, TopicConfig], dict | None]:
    """topics.json's parsed JSON to (table, dataVersion or None); ValueError for a wrong shape."""
    data = as_object(data, "topics.json")
    table = {name: TopicConfig.from_json(name, d)
             for name, d in as_object(data.get("topicConfigTable"), "topicConfigTable").items()}
    dv = data.get("dataVersion")
    version = None
    if dv is not None:
        dv = as_object(dv, "dataVersion")
        version = {"counter": as_int(dv.get("counter", 0), "dataVersion.counter"),
                   "timestamp": as_int(dv.get("timestamp", 0), "dataVersion.timestamp")}
    return table, version


def decode_offsets(data) -> dict[str, dict[int, int]]:
    """consumerOffset.json's parsed JSON to {"topic@group": {queueId: offset}}; ValueError naming the entry
    for a wrong shape (a table that is not an object, a non-numeric queue id or offset)."""
    table = as_object(as_object(data, "consumerOffset.json").get("offsetTable"), "offsetTable")
    out: dict[str, dict[int, int]] = {}
    for key, m in table.items():
        where = f"offsetTable[{key!r}]"
        out[key] = {as_int(q, f"{where} queue id"): as_int(o, f"{where}[{q!r}]")
                    for q, o in as_object(m, where).items()}
    return out


def decode_delay_offsets(data) -> dict[int, int]:
    """delayOffset.json's parsed JSON to {delay level: offset}; ValueError naming the entry if malformed."""
    table = as_object(as_object(data, "delayOffset.json").get("offsetTable"), "offsetTable")
    return {as_int(k, "offsetTable level"): as_int(v, f"offsetTable[{k!r}]") for k, v in table.items()}
