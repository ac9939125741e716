"""`rmqstore check --repair` and the offline rebuild: the one room above the facade (it opens a MessageStore to
rebuild consume queues and index from the commitlog).

Owns: check_repair (repair_store: quarantine what is not derived, rebuild what is, check again), rebuild
(rebuild_store: derived data from the commitlog, skipping accepted and CRC-damaged ranges).

May import: every room below and store.store (MessageStore). Nothing in the store imports it.
Writes: what the rooms below write; quarantined commitlog ranges under `{store}/quarantine/`, recorded in
`config/damagedRanges.json` (commitlog/damage.py).
"""
