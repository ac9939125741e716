"""The store's state on disk beside its data: what was flushed, who holds the store, whether it closed cleanly.

Owns: checkpoint (StoreCheckpoint: the three timestamps the flush vouches for), lock (the `lock` file held by
the open process, the `abort` file of an unclean close), running_flags (RunningFlags: disk full, write
errors), failure (the failure channel every service reports to).

May import: format, conf.
Writes: `{store}/checkpoint` (codec.CHECKPOINT: physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp,
big-endian int64, in format/codec.py), `{store}/lock`, `{store}/abort` (empty: its presence is the flag).
"""
