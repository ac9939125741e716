"""The durability services: what reaches the disk when, and what is deleted when it is old.

Owns: flush (the flush and commit services of the commitlog, consume queues and index: SYNC_FLUSH group
commit, ASYNC_FLUSH intervals, the checkpoint written behind them), cleanup (CleanCommitLogService,
CleanConsumeQueueService: expired files, disk-full watermarks), parts (StoreParts: the files and flags the
services are given instead of the MessageStore facade).

May import: format, conf, state, commitlog, consumequeue, index.
Writes: no format of its own: it flushes the rooms' files and writes `{store}/checkpoint` (state/).
"""
