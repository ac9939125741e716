"""The consume queues and the dispatcher that builds them from the commitlog.

Owns: consume_queue (ConsumeQueue, ConsumeQueueTable: one queue per topic and queue id), consume_queue_ext
(ConsumeQueueExt, enableConsumeQueueExt: tags codes, filter bit maps), dispatch (Dispatcher, RocketMQ's
ReputMessageService: reads the commitlog behind the writer with the record scanner and hands each record to
the consume queue and the index), queue_clean (deleteTopic, cleanUnusedTopic, cleanExpiredConsumerQueue),
deleted_queues (the record of deleted queues).

May import: format, conf, files, state, commitlog. (The index is handed to the dispatcher, never imported.)
Writes: `{store}/consumequeue/<topic>/<queueId>/<20-digit offset>`, 20-byte units (codec.CQ_UNIT: commitlog
offset int64, size int32, tags code int64, big-endian, in format/codec.py); `consumequeue_ext/...` (layout in
consume_queue_ext.py); `config/deletedQueues.json` (deleted_queues.py).
"""
