"""The engine: RocketMQ's message store (DefaultMessageStore and its parts), byte-compatible with its files.

Data flows one way: puts are validated (format/validation) and appended to the CommitLog (commitlog/, over
files/mapped_file, byte layouts in format/codec); the dispatcher (consumequeue/dispatch, RocketMQ's
ReputMessageService) reads the commitlog behind the writer with the record scanner (format/scanner) and builds
the consume queues (consumequeue/) and the key index (index/); reads go through the facade
(store.MessageStore, reads/read_api). One folder per structure or service, each saying in its docstring what
it owns, what it may import and the files it writes. Imports point down this list, never up:

    repair/        `rmqstore check --repair`, offline rebuild (opens a MessageStore)
    store.py       MessageStore, the facade: opens the rooms below, starts and stops their services
    check/         `rmqstore check`, the background check          reads/   read API, StoreReader, cat
    recovery/      plan and apply at open, the read-only view, the fast open (verified state)
    durability/    flush, cleanup                                  ha/      replication (master and slave)
    consumequeue/  consume queues, their ext, the dispatcher, deleted queues
    commitlog/     the commitlog and its put path, accepted damage  index/   IndexFile, IndexService
    state/         checkpoint, lock and abort, running flags, failure channel      timer/   timer messages
    format/ conf/ files/   byte layouts, messages, the scanner; StoreConfig and config/*.json; mapped files

The engine never imports the layers built on it (messaging/, broker/, proxy/, spark/, client/, tools/):
tests/test_architecture.py checks both rules.
"""
