"""Reads: RocketMQ's getMessage, queryMessage and offsets over the structures, for MessageStore and the
read-only StoreReader; the offline readers.

Owns: read_api (the read API MessageStore and StoreReader share), store_reader (StoreReader: MessageStore's
read answers over the read-only view), reader (sequential reads of commitlog files: `rmqstore cat`),
batch_read (batched reads into columns).

May import: format, conf, files, consumequeue, recovery (the view).
Writes: nothing.
"""
