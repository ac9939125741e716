"""Message properties as RocketMQ's broker re-serialises them: parsed into a java.util.HashMap, then
written back in that map's iteration order.

Whenever the broker rewrites a message (the delay rewrite in CommitLog.putMessage, the schedule
service's messageTimeup, consumerSendMsgBack, EndTransactionProcessor) it decodes the properties string
with MessageDecoder.string2messageProperties into a `new HashMap<String, String>()`, changes entries and
serialises with messageProperties2String, which iterates the map. The bytes of such a record therefore
follow HashMap's iteration order:

- the table starts with 16 buckets and doubles when the size passes 0.75 of it (and when a bucket gets a
  9th entry while the table has fewer than 64 buckets: treeifyBin resizes instead of treeifying);
- a key's bucket is `(h ^ (h >>> 16)) & (n - 1)` with h = String.hashCode;
- iteration walks the buckets in order; inside a bucket, entries keep their insertion order (a resize
  splits a bucket into two without reordering); putting an existing key replaces its value in place.

Tree bins (64+ buckets and 9+ keys in one bucket, i.e. 49+ properties with 9 colliding) are not modelled.
"""
from __future__ import annotations

from .codec import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, java_string_hash

_INITIAL_CAPACITY = 16
_LOAD_FACTOR = 0.75
_TREEIFY_THRESHOLD = 8
_MIN_TREEIFY_CAPACITY = 64


def _spread(key: str) -> int:
    h = java_string_hash(key) & 0xFFFFFFFF
    return h ^ (h >> 16)


class JavaHashMap:
    """The iteration order of a java.util.HashMap<String, String> (default capacity) under puts/removes."""

    __slots__ = ("_table", "_size", "_threshold")

    def __init__(self, items=None):
        self._table: list[list[list]] = [[] for _ in range(_INITIAL_CAPACITY)]
        self._size = 0
        self._threshold = int(_INITIAL_CAPACITY * _LOAD_FACTOR)
        if items:
            for k, v in (items.items() if isinstance(items, dict) else items):
                self.put(k, v)

    def _resize(self) -> None:
        old = self._table
        n = len(old) * 2
        table: list[list[list]] = [[] for _ in range(n)]
        for bucket in old:          # split keeps the relative order of each bucket's entries
            for node in bucket:
                table[node[0] & (n - 1)].append(node)
        self._table = table
        self._threshold *= 2

    def put(self, key: str, value: str) -> None:
        h = _spread(key)
        bucket = self._table[h & (len(self._table) - 1)]
        for node in bucket:
            if node[0] == h and node[1] == key:
                node[2] = value
                return
        before = len(bucket)
        bucket.append([h, key, value])
        if before >= _TREEIFY_THRESHOLD and len(self._table) < _MIN_TREEIFY_CAPACITY:
            self._resize()      # treeifyBin on a small table resizes instead
        self._size += 1
        if self._size > self._threshold:
            self._resize()

    def remove(self, key: str) -> None:
        h = _spread(key)
        bucket = self._table[h & (len(self._table) - 1)]
        for i, node in enumerate(bucket):
            if node[0] == h and node[1] == key:
                del bucket[i]
                self._size -= 1
                return

    def get(self, key: str, default=None):
        h = _spread(key)
        for node in self._table[h & (len(self._table) - 1)]:
            if node[0] == h and node[1] == key:
                return node[2]
        return default

    def __contains__(self, key: str) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def __len__(self) -> int:
        return self._size

    def items(self):
        for bucket in self._table:
            for node in bucket:
                yield node[1], node[2]

    def to_dict(self) -> dict[str, str]:
        """A dict in the map's iteration order (what messageProperties2String writes)."""
        return dict(self.items())


_MISSING = object()


def java_split(s: str, sep: str) -> list[str]:
    """String.split with a one-character literal: trailing empty strings are removed."""
    parts = s.split(sep)
    while len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return parts


def string_to_hashmap(props: str) -> JavaHashMap:
    """MessageDecoder.string2messageProperties: pairs with exactly one name/value split are kept."""
    m = JavaHashMap()
    if not props:
        return m
    for item in props.split(PROPERTY_SEPARATOR):
        nv = java_split(item, NAME_VALUE_SEPARATOR)
        if len(nv) == 2:
            m.put(nv[0], nv[1])
    return m


def properties_to_string(props: dict[str, str]) -> str:
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items())


def as_broker_map(props: dict[str, str] | None) -> JavaHashMap:
    """The HashMap the broker holds after decoding the serialised form of `props`."""
    return string_to_hashmap(properties_to_string(props or {}))


def hashmap_order(props: dict[str, str]) -> dict[str, str]:
    """`props` (inserted in its own order) re-ordered as a HashMap iterates them; nothing dropped."""
    return JavaHashMap(props).to_dict()
