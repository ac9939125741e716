"""option("view", "queues"): one row per consume queue, from the consume queues and two store times each,
no message read: how far each queue goes, how many messages it serves and when they were stored. Counts and
consumer lag need no scan:

    spark.read.format("rocketmq").option("view", "queues").load(store)
      .select("topic", "queueId", "minOffset", "maxOffset", "messages")

maxOffset is RocketMQ's getMaxOffsetInQueue (the next offset to be written, exclusive); messages is
maxOffset - minOffset (the units in between, as a consumer counts them; for a store nobody has open, after
recovery as MessageStore.open would serve it). Store times are those of the first and last unit's message
(null when the queue is empty or the message cannot be read).
"""
from __future__ import annotations

import datetime as dt

from . import storeview as SV
from .options import ReadOptions

QUEUES_DDL = ("broker string, topic string, queueId int, minOffset long, maxOffset long, messages long, "
              "firstStoreTimestamp timestamp, lastStoreTimestamp timestamp")


def _time(view: SV.StoreView, qv: SV.QueueView, i: int, cache) -> dt.datetime | None:
    offs, sizes = qv.units(i, i + 1)
    if not len(offs) or sizes[0] <= 0 or sizes[0] == SV.BLANK_SIZE:
        return None
    try:
        ms = view.store_time(cache, int(offs[0]), int(sizes[0]))
    except OSError:
        return None
    if ms < 0:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def queue_rows(ro: ReadOptions) -> list[tuple]:
    """(broker, topic, queueId, minOffset, maxOffset, messages, first, last) of every selected queue."""
    from .plan import load_views, selected_queues
    out = []
    for view in load_views(ro, [], topics=ro.topics):
        cache = SV.FileCache()
        try:
            for qv in selected_queues(ro, [], view):
                lo, hi = qv.min_offset, qv.end
                first = _time(view, qv, lo, cache) if hi > lo else None
                last = _time(view, qv, hi - 1, cache) if hi > lo else None
                out.append((view.broker, qv.topic, qv.queue_id, lo, hi, hi - lo, first, last))
        finally:
            cache.close()
    return out
