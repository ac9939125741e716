"""The engine: RocketMQ's message store (DefaultMessageStore and its parts), byte-compatible with its files.

Data flows one way: puts are validated (validation) and appended to the CommitLog (commit_log over
mapped_file, byte layouts in codec); the dispatcher (dispatch, RocketMQ's ReputMessageService) reads the
commitlog behind the writer with the record scanner and builds the consume queues (consume_queue) and the
key index (index_file); reads go through the facade (store.MessageStore). Around it: flush policies (flush),
the checkpoint (checkpoint), the lock and abort files (lock), cleanup of old files (cleanup), recovery at
open (recovery), the failure channel every service reports to (failure), and the consistency check (check).
"""
