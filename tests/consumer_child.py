"""A consumer process for test_consumer's SIGKILL test.

    python consumer_child.py STORE GROUP TOPIC LOG [SLEEP_MS]

Opens the store, starts a PushConsumer of GROUP on TOPIC (from the first offset, one consume thread,
consumerOffset.json written every 100 ms) and, for every message it consumes, appends
"queueId queueOffset body" to LOG (unbuffered, fsynced) before acknowledging it. Prints READY once
started, then runs until killed.
"""
from __future__ import annotations

import os
import sys
import time

from rmqstore.store.conf.config import StoreConfig
from rmqstore.messaging.consumer import CONSUME_SUCCESS, ConsumeFromWhere, PushConsumer
from rmqstore.store.store import MessageStore


def main() -> None:
    store_path, group, topic, log_path = sys.argv[1:5]
    sleep_s = (int(sys.argv[5]) if len(sys.argv) > 5 else 5) / 1000.0
    cfg = StoreConfig(mapped_file_size_commit_log=4 << 20, mapped_file_size_consume_queue=60000,
                      extra={"flushConsumerOffsetInterval": "100"})
    store = MessageStore.open(store_path, cfg)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def on_messages(msgs):
        for m in msgs:
            os.write(fd, f"{m.queue_id} {m.queue_offset} {m.body.decode()}\n".encode())
            os.fsync(fd)
            time.sleep(sleep_s)
        return CONSUME_SUCCESS

    consumer = PushConsumer(store, group, on_messages, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                            consume_thread_nums=1)
    consumer.subscribe(topic, "*")
    consumer.start()
    print("READY", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
