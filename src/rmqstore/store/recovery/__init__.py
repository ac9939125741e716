"""Recovery at open, the read-only view that applies the same plan in memory, and the fast open.

Owns: recovery (plan_recovery, pure, over what the files hold; each owner applies its part: RocketMQ's
recoverNormally/recoverAbnormally), queue_check (the units of a consume queue against their records), view
(RecoveredStore, load_view: the plan applied in memory for every read-only reader, local or at a URI),
verified_state (the record a clean close writes: what was verified, with each file's stat), open_trust (what
the next open may skip because of it).

May import: format, conf, files, state, commitlog, consumequeue, index, ha (a slave's truncation).
Writes: truncates and repairs the files of the rooms below as the plan says; `{store}/verified` (text, one line per
verified file with its stat; layout in verified_state.py).
"""
