"""The golden dump format (see ../shared/golden/README.md): what a store reads back, as JSON lines.

Works on anything with the store's read API (read_api.StoreReadAPI): an open MessageStore, or the
StoreReader `rmqstore dump` uses (the store recovered in memory, nothing written)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from ..store.reads.read_api import StoreReadAPI

DUMP_GROUP = "rmqstore-dump"
MAX_TIME = 2 ** 63 - 1


def java_sort_key(s: str) -> bytes:
    """Java's String.compareTo order (UTF-16 code units)."""
    return s.encode("utf-16-be")


def read_keys(path: str | Path) -> list[tuple[str, str]]:
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            topic, sep, key = line.partition("\t")
            if not sep:
                raise ValueError(f"{path} line {lineno}: expected topic<TAB>key")
            out.append((topic, key))
    return out


def queue_messages(store: StoreReadAPI, topic: str, queue_id: int, start: int, end: int, batch: int = 32):
    """Every message of a queue from start to end, as getMessage returns them."""
    offset = start
    while offset < end:
        r = store.get_message(DUMP_GROUP, topic, queue_id, offset, batch)
        yield from r.messages
        if r.next_begin_offset <= offset:
            break
        offset = r.next_begin_offset


def dump_lines(store: StoreReadAPI, keys: list[tuple[str, str]] | None = None) -> Iterator[dict]:
    yield {"minPhy": store.get_min_phy_offset(), "maxPhy": store.get_max_phy_offset()}
    table = store.consume_queues.table
    for topic in sorted(table, key=java_sort_key):
        for qid in sorted(table[topic]):
            cq = table[topic][qid]
            lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
            yield {"queue": topic, "queueId": qid, "min": lo, "max": hi}
            for msg in queue_messages(store, topic, qid, lo, hi):
                yield msg.to_json()
    for topic, key in keys or []:
        r = store.query_message(topic, key, 64, 0, MAX_TIME)
        yield {"query": topic, "key": key, "offsets": sorted(m.commit_log_offset for m in r.messages)}
