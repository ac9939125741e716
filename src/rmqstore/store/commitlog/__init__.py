"""The commitlog and its put path: every message, in the order it was put.

Owns: commit_log (CommitLog: one put lock, batches, END_OF_FILE blanks, dispatch hints), put_encoder (a
message to its record bytes), columnar_append (a MessageBatch appended as columns), hooks (put-message
hooks and store extensions: delay, timer rewrites), damage (accepted commitlog damage, the ranges
`rmqstore check --repair` quarantined).

May import: format, conf, files.
Writes: `{store}/commitlog/<20-digit offset>` files of mappedFileSizeCommitLog bytes, records v1/v2 back to
back and an END_OF_FILE blank at a file's end (layouts in format/codec.py); `config/damagedRanges.json`
(damage.py).
"""
