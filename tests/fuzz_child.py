"""The worker of the corruption fuzzer (tests/store/test_fuzz_corruption.py), and the mutations it applies.

    python tests/fuzz_child.py JOB.json START

JOB.json holds the templates (store directory, broker.conf-style config file, the reads the undamaged
store answers) and the list of mutations, each fully concrete (file, operation, positions, bytes), so
that a mutation is replayed exactly from its JSON. For every mutation from START on, the worker applies it
to a fresh copy of its template and runs the three ways in, each on exactly that freshly mutated copy (the
read-only ones first, sharing it while its fingerprint proves it unchanged; see PHASE_ORDER):

- open:  MessageStore.open (services started) and LocalBroker.of (topics.json, consumerOffset.json),
         then every read is checked against what the undamaged store answered (check_reads), then one
         put must be readable where it was answered, then close();
- dump:  `rmqstore dump` (cli.main in this process), its output checked like the reads;
- check: `rmqstore check` (when the job says it exists): exit 0 or 1, never a change to the files.

Protocol on stdout (flushed): `BEGIN i`, `PHASE i NAME` before each path, `END i JSON` (a list of
phase outcomes: {"phase", "result", "problems": [...], ...}). The parent's watchdog turns a silence into
a hang and a death into a signal, naming the mutation and the phase.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import shutil
import sys
import time
import traceback
import zlib
from pathlib import Path

CQ_UNIT = 20
PHASE_SLOW_S = 15.0       # a phase this slow is reported (close() blocking, a wait_dispatched timeout)


# ==== mutations ==============================================================================================
def _rand_bytes(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def apply_mutation(m: dict, root: Path) -> None:
    """Apply mutation m (see gen in test_fuzz_corruption) to the store copy at root."""
    p = root / m["path"]
    op, a = m["op"], m.get("args", {})
    if op == "flip":
        with open(p, "r+b") as f:
            for pos, bit in a["bits"]:
                f.seek(pos)
                b = f.read(1)
                if b:
                    f.seek(pos)
                    f.write(bytes([b[0] ^ (1 << bit)]))
    elif op == "zero":
        size = p.stat().st_size
        start = min(a["start"], size)
        with open(p, "r+b") as f:
            f.seek(start)
            f.write(b"\0" * max(0, min(a["length"], size - start)))
    elif op == "truncate":
        os.truncate(p, a["length"])
    elif op == "delete":
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    elif op == "dir":
        if p.exists():
            p.unlink()
        p.mkdir(parents=True)
    elif op == "append":
        with open(p, "ab") as f:
            f.write(_rand_bytes(a["seed"], a["length"]))
    elif op in ("replace", "create"):
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir():
            shutil.rmtree(p)
        p.write_bytes(bytes.fromhex(a["hex"]) if "hex" in a else _rand_bytes(a["seed"], a["length"]))
    elif op == "foreign_unit":          # a consume queue unit copied from another queue's file
        unit = (root / a["src"]).read_bytes()[a["src_unit"] * CQ_UNIT:(a["src_unit"] + 1) * CQ_UNIT]
        with open(p, "r+b") as f:
            f.seek(a["unit"] * CQ_UNIT)
            f.write(unit)
    elif op == "multi":                 # several steps (a config file and its .bak)
        for step in a["steps"]:
            apply_mutation(step, root)
    elif op == "swap":                  # two files trade places (e.g. two queues' consume queue files)
        q = root / a["other"]
        tmp = p.with_name(p.name + ".swap")
        os.replace(p, tmp)
        os.replace(q, p)
        os.replace(tmp, q)
    else:
        raise ValueError(f"unknown mutation op {op}")


# ==== the checks =============================================================================================
class Expected:
    """What the undamaged template answers: (topic, queue) -> {queue offset: (commitlog offset, msgId,
    body crc32)}, and a sample of msgIds."""

    def __init__(self, path: str):
        raw = json.loads(Path(path).read_text())
        self.queues: dict[tuple[str, int], dict[int, tuple[int, str, int]]] = {}
        for k, v in raw["queues"].items():
            topic, qid = k.rsplit("\t", 1)
            self.queues[(topic, int(qid))] = {int(o): tuple(x) for o, x in v.items()}
        self.ids = raw["ids"]        # [msgId, topic, queueId, queueOffset, crc]


def _crc(body: bytes | None) -> int:
    return zlib.crc32(body or b"")


def _same(m, topic: str, qid: int, exp) -> str | None:
    """None when message m (returned for queue topic/qid) is the message its own queue offset named in the
    undamaged store (same commitlog offset and body: msgId is left out, it is derived from header fields no
    checksum covers); else what is wrong."""
    if (m.topic, m.queue_id) != (topic, qid):
        return f"asked {topic}/{qid}, got {m.topic}/{m.queue_id}/{m.queue_offset} at {m.commit_log_offset}"
    if exp is not None and (m.commit_log_offset, _crc(m.body)) != (exp[0], exp[2]):
        return (f"{topic}/{qid}/{m.queue_offset}: got the record at {m.commit_log_offset} (body crc "
                f"{_crc(m.body)}), the undamaged store held {exp[0]} (body crc {exp[2]})")
    return None


def _batch_problems(got, topic: str, qid: int, off: int, known: dict) -> list[str]:
    """get_message from off: messages of that queue in increasing queue offsets from off (missing ones are
    skipped, as RocketMQ's getMessage does), each the one its queue offset names, and nextBeginOffset past
    the last (else the next read returns it again: the unit at an earlier offset pointed at it)."""
    prev = off - 1
    for m in got.messages:
        why = _same(m, topic, qid, known.get(m.queue_offset))
        if why:
            return [f"LIE get_message({topic}, {qid}, {off}): " + why]
        if m.queue_offset <= prev:
            return [f"LIE get_message({topic}, {qid}, {off}): queue offsets {[x.queue_offset for x in got.messages]}"]
        prev = m.queue_offset
    if got.messages and got.next_begin_offset <= prev:
        return [f"LIE get_message({topic}, {qid}, {off}): returned queue offset {prev} but nextBeginOffset "
                f"{got.next_begin_offset} (a unit before it points at that record)"]
    return []


def check_reads(store, exp: Expected, limit: int = 10, per_offset_max: int = 400) -> list[str]:
    """Every queue offset the store or the template knows (a seeded sample of per_offset_max when there are
    more), one get_message each; batched reads of every queue; view_message_by_id: a message returned is
    the one its offset names, or nothing is returned."""
    problems: list[str] = []
    queues = set(exp.queues) | {(cq.topic, cq.queue_id) for cq in list(store.consume_queues)}
    total = sum(len(v) for v in exp.queues.values())
    keep = min(1.0, per_offset_max / max(total, 1))
    rng = random.Random(total)
    for topic, qid in sorted(queues):
        known = exp.queues.get((topic, qid), {})
        lo = max(store.get_min_offset_in_queue(topic, qid), 0)
        hi = min(store.get_max_offset_in_queue(topic, qid), lo + len(known) + 64)
        offsets = set(known) | set(range(lo, hi))
        if keep < 1.0:
            offsets = {o for o in offsets if rng.random() < keep}
        for off in sorted(offsets):
            problems += _batch_problems(store.get_message("fuzz", topic, qid, off, 1), topic, qid, off, known)
            if len(problems) >= limit:
                return problems
        off = lo
        while off < hi:                      # batched reads, walking nextBeginOffset as a consumer does
            got = store.get_message("fuzz", topic, qid, off, 32)
            problems += _batch_problems(got, topic, qid, off, known)
            off = max(got.next_begin_offset, off + 1)
            if len(problems) >= limit:
                return problems
    for msg_id, topic, qid, qoff, crc in exp.ids:
        m = store.view_message_by_id(msg_id)
        if m is not None and (m.topic, m.queue_id, m.queue_offset, _crc(m.body)) != (topic, qid, qoff, crc):
            problems.append(f"LIE view_message_by_id {msg_id}: got {m.topic}/{m.queue_id}/{m.queue_offset} "
                            f"body crc {_crc(m.body)}, the store held {topic}/{qid}/{qoff} crc {crc}")
    return problems


def check_put(store, exp: Expected) -> list[str]:
    """One put after the open: PUT_OK means readable at the answered queue offset, promptly."""
    from rmqstore.store.format.message import Message, PutMessageStatus
    topic, qid = sorted(exp.queues)[0] if exp.queues else ("FuzzTopic", 0)
    body = b"after-the-damage"
    r = store.put_message(Message(topic, body, queue_id=qid, properties={"KEYS": "fuzz-put"}))
    if r.status is not PutMessageStatus.PUT_OK:
        return []
    a = r.append_result
    store.wait_dispatched(timeout=5)
    got = store.get_message("fuzz", topic, qid, a.logics_offset, 1)
    if not got.messages or got.messages[0].msg_id != a.msg_id or got.messages[0].body != body:
        return [f"LIE put answered PUT_OK at {topic}/{qid}/{a.logics_offset} ({a.msg_id}) but get_message "
                f"gives {got.status.name} {[(m.msg_id, m.commit_log_offset) for m in got.messages]}"]
    return []


def _names_store_file(text: str, root: Path) -> bool:
    return str(root) in text


def phase_open(root: Path, conf: str, exp: Expected) -> dict:
    from rmqstore.store.conf.config import StoreConfig
    from rmqstore.errors import RmqStoreError
    from rmqstore.messaging.local_broker import LocalBroker
    from rmqstore.store.store import MessageStore
    out: dict = {"phase": "open", "problems": []}
    try:
        store = MessageStore.open(root, StoreConfig.load(conf))
    except RmqStoreError as e:
        out["result"] = f"refused: {type(e).__name__}"
        out["detail"] = str(e)[:400]
        if not _names_store_file(str(e), root):
            out["problems"].append(f"refusal names no file of the store: {type(e).__name__}: {e}")
        return out
    except Exception as e:
        out["result"] = f"raised {type(e).__name__}"
        out["problems"].append("UNCAUGHT at open: " + " | ".join(traceback.format_exc().splitlines()[-6:]))
        return out
    try:
        rep = store.recovery_report
        out["result"] = "opened, repaired" if rep.damaged else "opened"
        out["detail"] = rep.summary()[:400]
        try:
            LocalBroker.of(store)
        except RmqStoreError as e:
            out["result"] += f", broker refused: {type(e).__name__}"
            if not _names_store_file(str(e), root):
                out["problems"].append(f"broker refusal names no file: {e}")
        out["problems"] += check_reads(store, exp)
        out["problems"] += check_put(store, exp)
    except Exception:
        out["problems"].append("UNCAUGHT after open: " + " | ".join(traceback.format_exc().splitlines()[-6:]))
    finally:
        try:
            store.close()
        except Exception:
            out["problems"].append("UNCAUGHT at close: " + " | ".join(traceback.format_exc().splitlines()[-6:]))
    return out


def run_cli(argv: list[str]) -> tuple[int | None, str, str, str | None]:
    """cli.main(argv) in this process: (exit status, stdout, stderr, traceback of an uncaught exception)."""
    from rmqstore.tools import cli
    out, err = io.StringIO(), io.StringIO()
    rc, tb = None, None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        except BaseException:
            tb = " | ".join(traceback.format_exc().splitlines()[-6:])
    return rc, out.getvalue(), err.getvalue(), tb


def _cli_error_ok(name: str, err: str, root: Path) -> list[str]:
    lines = [x for x in err.splitlines() if x.strip()]
    if len(lines) != 1 or not lines[0].startswith(f"rmqstore {name}:"):
        return [f"{name} exit 2 without one error line: {lines[:4]}"]
    if not _names_store_file(lines[0], root):
        return [f"{name} error names no file of the store: {lines[0]}"]
    return []


def check_dump_lines(text: str, exp: Expected, limit: int = 10) -> list[str]:
    problems: list[str] = []
    queue = None
    for line in text.splitlines():
        o = json.loads(line)
        if "queue" in o:
            queue = (o["queue"], o["queueId"])
        elif "queueOffset" in o:
            topic, qid = queue
            if (o["topic"], o["queueId"]) != queue:
                problems.append(f"LIE dump: {o['topic']}/{o['queueId']}/{o['queueOffset']} under queue {queue}")
            else:
                known = exp.queues.get(queue, {}).get(o["queueOffset"])
                got = (o["commitLogOffset"], zlib.crc32(bytes.fromhex(o["body"])))
                if known is not None and got != (known[0], known[2]):
                    problems.append(f"LIE dump: {topic}/{qid}/{o['queueOffset']} is {got}, the store held {known}")
        if len(problems) >= limit:
            break
    return problems


def phase_dump(root: Path, conf: str, exp: Expected) -> dict:
    out: dict = {"phase": "dump", "problems": []}
    rc, stdout, err, tb = run_cli(["dump", "-c", conf, str(root)])
    out["result"] = f"exit {rc}" if tb is None else "traceback"
    if tb is not None:
        out["problems"].append("UNCAUGHT in rmqstore dump: " + tb)
    elif rc == 0:
        out["problems"] += check_dump_lines(stdout, exp)
    elif rc == 2:
        out["detail"] = err.strip()[:400]
        out["problems"] += _cli_error_ok("dump", err, root)
    else:
        out["problems"].append(f"rmqstore dump exit {rc}: {err.strip()[:300]}")
    return out


def _fingerprint(root: Path) -> dict[str, tuple]:
    """Every directory and file under root: kind, content crc32, size, mtime and mode."""
    snap = {}
    top = os.fspath(root)
    cut = len(top) + 1
    for dirpath, dirs, files in os.walk(top):
        for n in dirs:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            snap[p[cut:]] = ("dir", 0, 0, st.st_mtime_ns, st.st_mode)
        for n in files:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                st = os.fstat(f.fileno())
                snap[p[cut:]] = ("file", zlib.crc32(f.read()), st.st_size, st.st_mtime_ns, st.st_mode)
    return snap


def _contents(snap: dict[str, tuple]) -> dict[str, tuple[str, int]]:
    """What check must not change: the set of directories and files, and every file's content."""
    return {k: v[:2] for k, v in snap.items()}


def phase_check(root: Path, conf: str, exp: Expected, before: dict[str, tuple] | None = None,
                after_out: dict | None = None) -> dict:
    """before: root's _fingerprint taken just before (else taken here); after_out: receives the one after."""
    out: dict = {"phase": "check", "problems": []}
    before = _contents(before if before is not None else _fingerprint(root))
    rc, stdout, err, tb = run_cli(["check", "-c", conf, str(root)])
    out["result"] = f"exit {rc}" if tb is None else "traceback"
    if tb is not None:
        out["problems"].append("UNCAUGHT in rmqstore check: " + tb)
    elif rc == 2:
        out["detail"] = err.strip()[:400]
        out["problems"] += _cli_error_ok("check", err, root)
    elif rc in (0, 1):
        out["detail"] = (stdout.strip().splitlines() or [""])[0][:300]
    else:
        out["problems"].append(f"rmqstore check exit {rc}: {err.strip()[:300]}")
    full_after = _fingerprint(root)
    if after_out is not None:
        after_out.update(full_after)
    after = _contents(full_after)
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        out["problems"].append(f"rmqstore check (no --repair) changed the store: {changed[:5]}")
    return out


PHASES = {"open": phase_open, "dump": phase_dump, "check": phase_check}


def _scratch_copy(template: str, root: Path, m: dict) -> str | None:
    """A fresh copy of template at root with mutation m applied; None, or why m could not be applied.
    A mutation marked `vouched` is damage under an unchanged stat (bit rot): the copy's verified-state
    record then vouches for every file as it is after the mutation (the fast open reads none of them)."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(template, root, symlinks=True)
    try:
        apply_mutation(m, root)
        if m.get("vouched"):
            vouch_all(root)
    except OSError as e:
        shutil.rmtree(root, ignore_errors=True)
        return str(e)
    return None


def vouch_all(root: Path) -> None:
    """Rewrite the record of the store at root (if it has one) with every file's stat as it is now."""
    from rmqstore.store.recovery import verified_state as vs
    state = vs.load(root)
    files = {}
    for rel, e in state.files.items():
        try:
            st = os.stat(root / rel)
        except OSError:
            continue
        end = min(e.end, st.st_size)
        if end >= e.begin:
            files[rel] = vs.FileEntry(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, e.begin, end, e.crc)
    if files:
        vs.save(root, vs.VerifiedState(files))


# The read-only ways in go first, on one mutated copy: `rmqstore check` must not change it (the phase
# proves that: a fingerprint before and after, which check's contract needs anyway) and `rmqstore dump`
# recovers in memory only; before each later phase the copy's fingerprint (every file's content, size,
# mtime and mode, the directory tree) is compared with the one taken right after the mutation, and a copy
# that differs in anything is thrown away and made again. So every phase sees exactly the freshly mutated
# copy it saw when each had its own (three copies, three rmtrees per mutation), at a third of the cost.
# open, which writes (recovery, repairs, the put), goes last.
PHASE_ORDER = ("check", "dump", "open")


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    start = int(sys.argv[2])
    proto = sys.stdout
    logging.basicConfig(level=logging.WARNING, handlers=[logging.NullHandler()])   # cli.main's basicConfig: no-op
    expected = {name: Expected(t["expected"]) for name, t in job["templates"].items()}
    work = Path(job.get("scratch") or job["workdir"])
    work.mkdir(parents=True, exist_ok=True)
    phases = [p for p in PHASE_ORDER if p != "check" or job["check"]]
    for i in range(start, len(job["mutations"])):
        m = job["mutations"][i]
        t = job["templates"][m["template"]]
        print(f"BEGIN {i}", file=proto, flush=True)
        outcomes = []
        root = work / f"m{i}"
        fresh: dict | None = None      # root's fingerprint right after the mutation; None: no copy yet
        now: dict | None = None        # root's fingerprint after the previous phase, when it took one
        for name in phases:
            print(f"PHASE {i} {name}", file=proto, flush=True)
            t0 = time.monotonic()
            if fresh is not None and (now if now is not None else _fingerprint(root)) != fresh:
                fresh = None            # the previous phase changed the copy: a new one
            now = None
            if fresh is None:
                why = _scratch_copy(t["dir"], root, m)
                if why is not None:
                    outcomes.append({"phase": name, "result": f"not applied: {why}", "problems": []})
                    continue
                fresh = _fingerprint(root)
            if name == "check":
                now = {}
                o = phase_check(root, t["conf"], expected[m["template"]], before=fresh, after_out=now)
            else:
                o = PHASES[name](root, t["conf"], expected[m["template"]])
            o["secs"] = round(time.monotonic() - t0, 3)
            if o["secs"] > PHASE_SLOW_S:
                o["problems"].append(f"SLOW: {name} took {o['secs']} s (a blocked close or dispatch?)")
            outcomes.append(o)
        shutil.rmtree(root, ignore_errors=True)
        print(f"END {i} {json.dumps(outcomes)}", file=proto, flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
