"""The process the crash tests kill: open a store, put messages until killed, report every acknowledged put.

    python tests/crash_child.py STORE_DIR SYNC_FLUSH|ASYNC_FLUSH RUN_ID SEED [MAX_SECONDS]

Prints `READY <recovery summary>` once the store is open, then one `PUT_OK ...` line per acknowledged put
(store_checks.Acked.line: offset, queue offset, msgId, topic, queue, key, body length, sysFlag), flushed
line by line, so that the parent knows exactly what a client was told before the SIGKILL. Puts that the
store refused are printed as `PUT_FAIL status key`. Exits by itself after MAX_SECONDS (default 30) so a
lost parent never leaves it running.
"""
from __future__ import annotations

import random
import sys
import time

from rmqstore.store.format.message import PutMessageStatus
from rmqstore.store.store import MessageStore
from store_checks import Acked, make_message, small_config


def main() -> int:
    store_dir, flush, run_id, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    max_seconds = float(sys.argv[5]) if len(sys.argv) > 5 else 30.0
    rng = random.Random(seed)
    # thorough flushes every 300 ms: the checkpoint moves during a run, so recoveries start at various files
    store = MessageStore.open(store_dir, small_config(flush, flushConsumeQueueThoroughInterval=300,
                                                      flushCommitLogThoroughInterval=300))
    out = sys.stdout
    out.write(f"READY {store.recovery_report.summary()}\n")
    out.flush()
    deadline = time.monotonic() + max_seconds
    i = 0
    while time.monotonic() < deadline:
        n = 1 if rng.random() < 0.7 else rng.randint(2, 6)
        keys = [f"{run_id}-{i + j}" for j in range(n)]
        msgs = [make_message(k, rng, prepared=rng.random() < 0.05) for k in keys]
        i += n
        # one message: put_message (under SYNC_FLUSH the flusher appends it with others: GroupCommitService.put)
        results = [store.put_message(msgs[0])] if n == 1 else store.put_messages(msgs)
        lines = []
        for k, m, r in zip(keys, msgs, results):
            if r.status is PutMessageStatus.PUT_OK:
                a = r.append_result
                lines.append(Acked(a.wrote_offset, a.logics_offset, a.msg_id, m.topic, m.queue_id, k,
                                   len(m.body), m.sys_flag).line())
            else:
                lines.append(f"PUT_FAIL {r.status.value} {k}")
        out.write("\n".join(lines) + "\n")
        out.flush()
    store.close()
    out.write("DONE\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
