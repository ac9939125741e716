"""The Spark modules' name for the read-only store view, which lives in rmqstore.store.recovery.view (it is not
Spark-specific: `rmqstore dump` and the other read commands use it too)."""
from ..store.recovery.view import *  # noqa: F401,F403
from ..store.recovery.view import (  # noqa: F401 - names the Spark modules use
    BLANK_SIZE, CQ_NP, UNIT, FileCache, QueueView, RecoveredStore, StoreError, StoreView, _recover_index,
    broker_name, commitlog_dir, index_candidates, index_geometry, list_topics, load_view, lock_held_elsewhere,
    map_read_only, offset_by_time, resolve_paths)
