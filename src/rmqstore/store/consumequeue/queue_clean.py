"""deleteTopic, DefaultMessageStore.cleanUnusedTopic and cleanExpiredConsumerQueue: remove whole consume
queues (their files and directories, their entry in the commitlog's topic-queue offset table) of a deleted
topic, of topics the broker no longer has, or whose every unit points below the commitlog's min offset. The
delay topic (SCHEDULE_TOPIC_XXXX) is never removed, as in RocketMQ.

    removed = delete_topic(parts, "TopicA")                    # MessageStore.delete_topic
    removed = clean_unused_topic(parts, set(topic_configs))   # [(topic, queue_id), ...]
    removed = clean_expired_consumer_queue(parts)

`parts` is anything with the store's `path`, `commit_log`, `consume_queues` and `dispatcher` (StoreParts, or
the MessageStore). A queue is removed whether or not the dispatcher has built it yet: the queues of a topic
are those with a consume queue and those the commitlog's topic-queue table holds (messages put and not yet
dispatched). Every removal is recorded first (deleted_queues.py) and the dispatcher learns it under its
units lock, so neither the running dispatcher nor a later re-dispatch builds the queue again from its old
records. A queue written again after its removal starts over at queue offset 0 (RocketMQ's behaviour: the
offset table entry goes with the queue).
"""
from __future__ import annotations

import logging

from . import deleted_queues
from ..format import codec

log = logging.getLogger(__name__)


def _table_queues(parts) -> set[tuple[str, int]]:
    """The (topic, queue id) pairs of the commitlog's topic-queue offset table ("topic-queueId" keys)."""
    out = set()
    for key in list(parts.commit_log.topic_queue_table):
        topic, _, qid = key.rpartition("-")
        if topic and qid.isdigit():
            out.add((topic, int(qid)))
    return out


def remove_queues(parts, pick) -> list[tuple[str, int]]:
    """Remove every queue (built or not) for which pick(topic, queue id) is true, the delay topic aside.
    Under the put lock (no put takes an offset meanwhile) and the dispatcher's units lock (no unit is
    written meanwhile): the deletion is recorded (OSError, and nothing is removed, when it cannot be), the
    dispatcher told, the offset table entries and the queues dropped, and their files deleted
    (ConsumeQueue.destroy, CommitLog.removeQueueFromTopicQueueTable): a new generation's consume queue
    (the topic written again) is created only after, and never loses a file of the same name to the old
    one's deletion. Returns the removed (topic, queue id)."""
    table, dispatcher = parts.consume_queues, parts.dispatcher
    with parts.commit_log.put_lock, dispatcher.units_lock:
        built = {(cq.topic, cq.queue_id): cq for cq in table.sorted_queues()}
        keys = sorted(k for k in set(built) | _table_queues(parts)
                      if k[0] != codec.SCHEDULE_TOPIC and pick(*k))
        if not keys:
            return []
        below = parts.commit_log.get_max_offset()
        deleted_queues.record(parts.path, keys, below)
        for topic, qid in keys:
            dispatcher.deleted[(topic, qid)] = max(below, dispatcher.deleted.get((topic, qid), 0))
            parts.commit_log.topic_queue_table.pop(f"{topic}-{qid}", None)
            cq = built.get((topic, qid))
            if cq is not None:
                table.remove(cq)
                with cq.lock:
                    cq.destroy()
    for topic in {t for t, _ in keys}:
        try:
            (table.root / topic).rmdir()          # only when its last queue directory went
        except OSError:
            pass
    return keys


def delete_topic(parts, topic: str) -> list[tuple[str, int]]:
    """Remove every queue of one topic (deleteTopic), built or not yet dispatched."""
    removed = remove_queues(parts, lambda t, q: t == topic)
    for t, q in removed:
        log.info("deleteTopic: %s %d ConsumeQueue cleaned", t, q)
    return removed



def clean_unused_topic(parts, topics: set[str]) -> list[tuple[str, int]]:
    """Remove the queues of every topic not in topics (the broker's topic configs)."""
    removed = remove_queues(parts, lambda t, q: t not in topics)
    for t, q in removed:
        log.info("cleanUnusedTopic: %s %d ConsumeQueue cleaned", t, q)
    return removed


def clean_expired_consumer_queue(parts) -> list[tuple[str, int]]:
    """Remove every consume queue whose last unit's message ends below the commitlog's min offset (all its
    messages are gone); an empty queue (last offset -1) is kept, as in RocketMQ."""
    min_offset = parts.commit_log.get_min_offset()
    expired = set()
    for cq in parts.consume_queues.sorted_queues():
        if cq.topic == codec.SCHEDULE_TOPIC:
            continue
        last = cq.get_last_offset()
        if last == -1:
            log.warning("maybe ConsumeQueue was created just now. topic=%s queueId=%d", cq.topic, cq.queue_id)
        elif last < min_offset:
            log.info("cleanExpiredConsumerQueue: %s %d consumer queue destroyed, minCommitLogOffset: %d "
                     "maxCLOffsetInConsumeQueue: %d", cq.topic, cq.queue_id, min_offset, last)
            expired.add((cq.topic, cq.queue_id))
    return remove_queues(parts, lambda t, q: (t, q) in expired)
