"""Tests of the engine (src/rmqstore/store/): files, put path, dispatch, index, recovery, check and repair, timers, replication."""
