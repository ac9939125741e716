"""The writer that tests/store/test_kill_loop.py SIGKILLs and tests/store/test_power_loss.py cuts, and the zygote that forks it.

    python tests/kill_child.py            # a zygote: one job a line on stdin, answers on stdout

The zygote imports rmqstore once, then for `RUN STORE FLUSH RUN_ID SEED MAX_SECONDS SIDE_FILE` forks a
writer and answers `PID n`; for `CRASH STORE FLUSH RUN_ID SEED MAX_SECONDS SIDE_FILE` it forks
tests/crash_child.py's main() instead (the single-threaded writer of tests/store/test_crash.py, unchanged: its
stdout, the READY and PUT_OK lines, goes to SIDE_FILE opened O_APPEND, its stderr to SIDE_FILE.err) and
answers `PID n`; for `WAIT n` it reaps writer n and answers `EXIT n code` (code as
os.waitstatus_to_exitcode: -9 after a SIGKILL). Forking an interpreter that has imported everything
(and has no threads) starts a writer in milliseconds instead of a second, so the loops afford many kills.

A writer opens the store (store_checks.small_config: every kind of file rolls over often), appends
`READY <recovery summary>` to SIDE_FILE, then runs THREADS threads doing single puts (put_message; under
SYNC_FLUSH they meet in the group commit) and one thread putting batches (alternately a list of Messages
and a MessageBatch) until MAX_SECONDS, then closes the store and appends `DONE`. Only after the store
answered does a thread append one line per message of the answer to SIDE_FILE with one os.write on an
O_APPEND descriptor (store_checks.Acked.line for PUT_OK, `PUT_FAIL status key` otherwise): a line is in
the file whole (or torn last, by the kill) and never before its answer. Every message is dispatchable (no
transactions) and carries a unique key; its body is store_checks.body_for(key, length).
"""
from __future__ import annotations

import os
import random
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rmqstore.store.format.message import GetMessageStatus, Message, PutMessageStatus  # noqa: E402
from rmqstore.store.format.message_batch import MessageBatch  # noqa: E402
from rmqstore.store.store import MessageStore  # noqa: E402
from store_checks import (  # noqa: E402
    FULL_RANGE_LOOKUPS, QUEUES, TOPICS, Acked, body_for, find_by_key, make_message, small_config)

THREADS = 3
HERE = Path(__file__).resolve()


class SideFile:
    """Lines appended with one write each (O_APPEND), from any thread."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def lines(self, lines: list[str]) -> None:
        if lines:
            os.write(self.fd, ("\n".join(lines) + "\n").encode())


def _answer_lines(msgs: list[Message], keys: list[str], results) -> list[str]:
    out = []
    for k, m, r in zip(keys, msgs, results):
        if r.status is PutMessageStatus.PUT_OK:
            a = r.append_result
            out.append(Acked(a.wrote_offset, a.logics_offset, a.msg_id, m.topic, m.queue_id, k, len(m.body),
                             m.sys_flag).line())
        else:
            out.append(f"PUT_FAIL {r.status.value} {k}")
    return out


def _single_puts(store, side: SideFile, run_id: str, t: int, seed: int, stop: float) -> None:
    rng = random.Random(seed * 100 + t)
    i = 0
    while time.monotonic() < stop:
        key = f"{run_id}-s{t}-{i}"
        i += 1
        m = make_message(key, rng)
        side.lines(_answer_lines([m], [key], [store.put_message(m)]))


def _batch_puts(store, side: SideFile, run_id: str, seed: int, stop: float) -> None:
    rng = random.Random(seed * 100 + 99)
    i = 0
    while time.monotonic() < stop:
        n = rng.randint(2, 40)
        keys = [f"{run_id}-b{i + j}" for j in range(n)]
        i += n
        if rng.random() < 0.5:
            msgs = [make_message(k, rng) for k in keys]
            results = store.put_messages(msgs)
        else:
            topic = rng.choice(TOPICS)
            lens = [rng.choice((10, 100, 300, 1000)) for _ in keys]
            qids = [rng.randrange(QUEUES) for _ in keys]
            batch = MessageBatch(topic, [body_for(k, n_) for k, n_ in zip(keys, lens)], queue_ids=qids,
                                 tags="tagb", keys=keys, born_timestamp=1700000000000)
            msgs = [Message(topic, body_for(k, n_), queue_id=q) for k, n_, q in zip(keys, lens, qids)]
            results = store.put_messages(batch)
        side.lines(_answer_lines(msgs, keys, results))


def writer(store_dir: str, flush: str, run_id: str, seed: int, max_seconds: float, side_path: str) -> int:
    side = SideFile(side_path)
    try:
        store = MessageStore.open(store_dir, small_config(flush, flushConsumeQueueThoroughInterval=300,
                                                          flushCommitLogThoroughInterval=300))
        side.lines([f"READY {store.recovery_report.summary()}"])
        stop = time.monotonic() + max_seconds
        errors: list[str] = []

        def guarded(fn, *args):
            try:
                fn(*args)
            except BaseException:
                errors.append(traceback.format_exc())

        ts = [threading.Thread(target=guarded, args=(_single_puts, store, side, run_id, t, seed, stop))
              for t in range(THREADS)]
        ts.append(threading.Thread(target=guarded, args=(_batch_puts, store, side, run_id, seed, stop)))
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        store.close()
        for e in errors:
            side.lines(["ERROR " + " | ".join(e.splitlines())])
        side.lines(["DONE"])
        return 1 if errors else 0
    except BaseException:
        side.lines(["ERROR " + " | ".join(traceback.format_exc().splitlines())])
        return 1


def _crash_child(args: list[str]) -> int:
    """In a forked child: crash_child.main() with argv STORE FLUSH RUN_ID SEED MAX_SECONDS, stdout to the
    side file (O_APPEND; main writes and flushes its lines batch by batch, as to the pipe it has when run as a
    script), stderr to SIDE_FILE.err."""
    import crash_child
    side = args[5]
    out = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    err = os.open(side + ".err", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.argv = ["crash_child.py"] + args[:5]
    try:
        return crash_child.main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        return 1


def zygote() -> int:
    import crash_child  # noqa: F401 - imported once here, so that a CRASH fork starts at once
    for line in sys.stdin:
        p = line.split()
        if not p:
            continue
        if p[0] == "RUN":
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    sys.stdin.close()
                    code = writer(p[1], p[2], p[3], int(p[4]), float(p[5]), p[6])
                finally:
                    os._exit(code)
            print(f"PID {pid}", flush=True)
        elif p[0] == "CRASH":
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    sys.stdin.close()
                    code = _crash_child(p[1:7])
                finally:
                    os._exit(code)
            print(f"PID {pid}", flush=True)
        elif p[0] == "WAIT":
            pid = int(p[1])
            _, status = os.waitpid(pid, 0)
            print(f"EXIT {pid} {os.waitstatus_to_exitcode(status)}", flush=True)
    return 0


# --- the parent's side ---------------------------------------------------------------------------------------
class Zygote:
    """The zygote process, driven from a test: run() forks a writer, wait() reaps it."""

    def __init__(self, stderr_path: Path):
        import subprocess
        self.stderr_path = stderr_path
        self._err = open(stderr_path, "wb")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, str(HERE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._err, env=env, text=True, bufsize=1)

    def _ask(self, line: str) -> list[str]:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"zygote died: {self.stderr_path.read_text()[-2000:]}")
        return answer.split()

    def run(self, store: Path, flush: str, run_id: str, seed: int, max_seconds: float, side: Path) -> int:
        return int(self._ask(f"RUN {store} {flush} {run_id} {seed} {max_seconds} {side}")[1])

    def crash(self, store: Path, flush: str, run_id: str, seed: int, max_seconds: float, side: Path) -> int:
        """Fork tests/crash_child.py's writer (see the module docstring); returns its pid."""
        return int(self._ask(f"CRASH {store} {flush} {run_id} {seed} {max_seconds} {side}")[1])

    def wait(self, pid: int) -> int:
        return int(self._ask(f"WAIT {pid}")[2])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self._err.close()

    def __enter__(self) -> "Zygote":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_side(path: Path) -> tuple[list[Acked], list[str], list[str], bool]:
    """(acknowledged puts, PUT_FAIL lines, ERROR lines, READY seen) from whole lines of a side file."""
    acked, fails, errors, ready = [], [], [], False
    data = path.read_bytes() if path.exists() else b""
    for raw in data.split(b"\n")[:-1]:          # the last piece is empty or a torn line
        line = raw.decode(errors="replace")
        if line.startswith("PUT_OK"):
            a = Acked.parse(line)
            if a is not None:
                acked.append(a)
        elif line.startswith("PUT_FAIL"):
            fails.append(line)
        elif line.startswith("ERROR"):
            errors.append(line)
        elif line.startswith("READY"):
            ready = True
    return acked, fails, errors, ready


def check_acked(store: MessageStore, acked: list[Acked], where: str) -> None:
    """Each acknowledged put by queue offset, by msgId and by key (store_checks.find_by_key: in the
    message's own second after the first FULL_RANGE_LOOKUPS): that message, whole."""
    for i, a in enumerate(acked):
        got = store.get_message("kill-loop", a.topic, a.queue_id, a.queue_offset, 1)
        assert got.status is GetMessageStatus.FOUND and len(got.messages) == 1, \
            f"{where}: {a} by queue offset: {got.status.name}"
        m = got.messages[0]
        body = body_for(a.key, a.body_len)
        assert (m.topic, m.queue_id, m.queue_offset, m.commit_log_offset, m.msg_id, m.body) == \
            (a.topic, a.queue_id, a.queue_offset, a.offset, a.msg_id, body), \
            f"{where}: {a} by queue offset reads {m.topic}/{m.queue_id}/{m.queue_offset}@{m.commit_log_offset} {m.msg_id}"
        v = store.view_message_by_id(a.msg_id)
        assert v is not None and (v.commit_log_offset, v.topic, v.queue_offset, v.body) == \
            (a.offset, a.topic, a.queue_offset, body), f"{where}: {a} by msgId reads {v}"
        by_key = find_by_key(store, a.topic, a.key, m.store_timestamp if i >= FULL_RANGE_LOOKUPS else None)
        assert [x.commit_log_offset for x in by_key] == [a.offset], \
            f"{where}: {a} by key finds {[x.commit_log_offset for x in by_key]}"


def wait_ready(path: Path, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        acked, fails, errors, ready = read_side(path)
        if ready or errors:
            return ready
        time.sleep(0.005)
    return False


def wait_acked(path: Path, n: int, timeout: float = 30) -> int:
    """Wait until the side file holds n acknowledged puts (or timeout); returns how many it holds."""
    deadline = time.monotonic() + timeout
    have = 0
    while time.monotonic() < deadline:
        have = path.read_bytes().count(b"PUT_OK") if path.exists() else 0
        if have >= n:
            break
        time.sleep(0.005)
    return have


if __name__ == "__main__":
    sys.exit(zygote())
