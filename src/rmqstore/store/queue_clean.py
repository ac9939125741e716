"""DefaultMessageStore.cleanUnusedTopic and cleanExpiredConsumerQueue: remove whole consume queues (their
files and directories, their entry in the commitlog's topic-queue offset table) of topics the broker no
longer has, or whose every unit points below the commitlog's min offset. The delay topic
(SCHEDULE_TOPIC_XXXX) is never removed, as in RocketMQ.

    removed = clean_unused_topic(store, set(topic_configs))   # [(topic, queue_id), ...]
    removed = clean_expired_consumer_queue(store)

A queue written again after its removal starts over at queue offset 0 (RocketMQ's behaviour: the offset
table entry goes with the queue).
"""
from __future__ import annotations

import logging

from . import codec
from .consume_queue import ConsumeQueue

log = logging.getLogger(__name__)


def _remove_queue(store, cq: ConsumeQueue) -> None:
    """Drop one queue from the table and the offset table, then delete its files (ConsumeQueue.destroy and
    CommitLog.removeQueueFromTopicQueueTable), under the put lock so no put takes an offset meanwhile. The
    deletion is recorded first (deleted_queues.py: no re-dispatch builds the queue again from its old
    records); when that record cannot be written, OSError and nothing is removed."""
    from . import deleted_queues
    table = store.consume_queues
    with store.commit_log.put_lock:
        below = store.commit_log.get_max_offset()
        deleted_queues.record(store.path, cq.topic, cq.queue_id, below)
        store.dispatcher.deleted[(cq.topic, cq.queue_id)] = below
        store.commit_log.topic_queue_table.pop(f"{cq.topic}-{cq.queue_id}", None)
        table.remove(cq)
    with cq.lock:
        cq.destroy()
    topic_dir = table.root / cq.topic
    try:
        topic_dir.rmdir()             # only when its last queue directory went
    except OSError:
        pass


def remove_topic_queues(store, topic: str) -> list[tuple[str, int]]:
    """Remove every consume queue of one topic (deleteTopic's part of cleanUnusedTopic)."""
    removed = []
    for cq in store.consume_queues.sorted_queues():
        if cq.topic == topic and topic != codec.SCHEDULE_TOPIC:
            _remove_queue(store, cq)
            log.info("deleteTopic: %s %d ConsumeQueue cleaned", cq.topic, cq.queue_id)
            removed.append((cq.topic, cq.queue_id))
    return removed


def clean_unused_topic(store, topics: set[str]) -> list[tuple[str, int]]:
    """Remove the consume queues of every topic not in topics (the broker's topic configs)."""
    removed = []
    for cq in store.consume_queues.sorted_queues():
        if cq.topic in topics or cq.topic == codec.SCHEDULE_TOPIC:
            continue
        _remove_queue(store, cq)
        log.info("cleanUnusedTopic: %s %d ConsumeQueue cleaned", cq.topic, cq.queue_id)
        removed.append((cq.topic, cq.queue_id))
    return removed


def clean_expired_consumer_queue(store) -> list[tuple[str, int]]:
    """Remove every consume queue whose last unit's message ends below the commitlog's min offset (all its
    messages are gone); an empty queue (last offset -1) is kept, as in RocketMQ."""
    min_offset = store.commit_log.get_min_offset()
    removed = []
    for cq in store.consume_queues.sorted_queues():
        if cq.topic == codec.SCHEDULE_TOPIC:
            continue
        last = cq.get_last_offset()
        if last == -1:
            log.warning("maybe ConsumeQueue was created just now. topic=%s queueId=%d", cq.topic, cq.queue_id)
            continue
        if last < min_offset:
            _remove_queue(store, cq)
            log.info("cleanExpiredConsumerQueue: %s %d consumer queue destroyed, minCommitLogOffset: %d "
                     "maxCLOffsetInConsumeQueue: %d", cq.topic, cq.queue_id, min_offset, last)
            removed.append((cq.topic, cq.queue_id))
    return removed
