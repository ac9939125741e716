"""AllocateMessageQueueAveragely, the client's default queue allocation: queues and client ids sorted; with
q queues and c clients, client i gets a contiguous run of q/c queues, the first q%c clients one more."""
from __future__ import annotations

import logging
from typing import Sequence, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def allocate_averagely(consumer_group: str, current_cid: str, mq_all: Sequence[T], cid_all: Sequence[str]) -> list[T]:
    """AllocateMessageQueueAveragely.allocate (mq_all and cid_all already sorted)."""
    if not current_cid:
        raise ValueError("currentCID is empty")
    if not mq_all:
        return []
    if not cid_all:
        raise ValueError("cidAll is null or cidAll empty")
    if current_cid not in cid_all:
        log.info("[BUG] ConsumerGroup: %s The consumerId: %s not in cidAll: %s", consumer_group, current_cid, cid_all)
        return []
    index = list(cid_all).index(current_cid)
    n_mq, n_cid = len(mq_all), len(cid_all)
    mod = n_mq % n_cid
    average = (n_mq // n_cid + 1 if mod > 0 and index < mod else n_mq // n_cid) if n_mq > n_cid else 1
    start = index * average if (mod > 0 and index < mod) else index * average + mod
    return [mq_all[(start + i) % n_mq] for i in range(max(min(average, n_mq - start), 0))]
