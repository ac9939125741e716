"""Seeded corruption fuzzer (issue 15, "In the suite"): at least 300 mutations of every kind of store file,
each opened three ways, none of which may crash, hang, die of a signal or lie.

Templates, built once per module: a small store written here and closed cleanly (three topics, four queues
each, keys, prepared transaction messages, delayed messages, topics.json, consumerOffset.json,
delayOffset.json and their .bak copies, every kind of file rolled over several times); a copy of it that
a writer appended to and was SIGKILLed (abort file, stale checkpoint, queues behind); and a copy of the
golden crash set RocketMQ 4.4.0 wrote itself. What each undamaged template answers (every queue offset:
commitlog offset, msgId, body crc) is recorded first.

Mutations (generated from the seed, each concrete and replayable from its JSON): bit flips (anywhere,
in written data, in record headers), zeroed ranges, truncations (to zero, mid-record, mid-unit),
deletions, a directory in place of a file, random bytes appended, consume queue units copied from another
queue, two queues' files swapped, files replaced by random bytes, malformed config JSON (wrong shapes,
non-numeric offsets, not UTF-8, deeply nested), over commitlog, consume queue, index, checkpoint, abort,
lock and config files (and their .bak copies).

A share of the mutations of the two built templates (VOUCHED_SHARE) are damage under an unchanged stat
(bit rot): the copy's verified-state record is rewritten to vouch for every file as it is after the
mutation, so the fast open reads none of them and only the read path's own checks and the background check
stand between the damage and a reader.

Each mutated copy goes through (tests/fuzz_child.py, in worker processes watched by a timeout):
MessageStore.open + LocalBroker.of, `rmqstore dump`, and `rmqstore check` when that command exists.
Allowed outcomes: an open (repaired and reported, or clean), or a refusal by an RmqStoreError
(CorruptStoreError, ...) / a one-line CLI error (exit 2) naming a file of the store, or check's exit 1.
Never: an uncaught exception, a hang, a signal; a read (get_message by queue offset, one at a time and
batched; view_message_by_id; dump's lines) returning a message other than the one that offset named in the
undamaged store; a PUT_OK after the open that is not readable where it was answered; check changing files.

RMQSTORE_FUZZ_SEED=N replays a run (the seed is printed, and named in every failure with the mutation's
JSON); RMQSTORE_FUZZ_MUTATIONS=N changes the count (default 300); RMQSTORE_FUZZ_ONLY=ID,ID runs only those
mutations of the seed.
"""
from __future__ import annotations

import json
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import pytest

from conftest import _make_writable, golden_store, run_cli
from rmqstore.store.conf.config import StoreConfig
from rmqstore.messaging.local_broker import LocalBroker
from rmqstore.store.format.message import Message, PutMessageStatus
from rmqstore.store.store import MessageStore
from store_checks import make_message, records_in_dir

pytestmark = pytest.mark.slow

# A fixed seed by default, so that `make test` is repeatable (the seeds that found defects are kept as
# the defaults); RMQSTORE_FUZZ_SEED=random draws a new one (printed), RMQSTORE_FUZZ_SEED=N replays one.
_SEED = os.environ.get("RMQSTORE_FUZZ_SEED", "605003459")
SEED = random.SystemRandom().randrange(1 << 30) if _SEED == "random" else int(_SEED)
N_MUTATIONS = int(os.environ.get("RMQSTORE_FUZZ_MUTATIONS", "300"))
ONLY = {int(i) for i in os.environ.get("RMQSTORE_FUZZ_ONLY", "").split(",") if i.strip()}
WORKERS = 2
PHASE_TIMEOUT_S = 40.0
CHILD = Path(__file__).resolve().parents[1] / "fuzz_child.py"
SMALL_CONF = {"mappedFileSizeCommitLog": 32768, "mappedFileSizeConsumeQueue": 200, "maxHashSlotNum": 16,
              "maxIndexNum": 64, "flushDiskType": "ASYNC_FLUSH"}     # every kind of file rolls over


# ==== templates ==============================================================================================
def _fuzz_config(**extra) -> StoreConfig:
    return StoreConfig.from_dict({**SMALL_CONF, **extra})


def _put_some(store: MessageStore, rng: random.Random, tag: str, n: int) -> None:
    for i in range(0, n, 10):
        msgs = [make_message(f"{tag}-{j}", rng, prepared=rng.random() < 0.03) for j in range(i, i + 10)]
        assert all(r.status is PutMessageStatus.PUT_OK for r in store.put_messages(msgs))


def _build_clean(root: Path) -> None:
    rng = random.Random(1)
    with MessageStore.open(root, _fuzz_config()) as store:
        broker = LocalBroker.of(store)
        for t in ("TopicA", "TopicB", "TopicC"):
            broker.topics.create_topic(t, queue_nums=4)
        _put_some(store, rng, "c", 300)
        for j in range(8):         # delayed 2 h (level 18): they stay in SCHEDULE_TOPIC_XXXX, never due here
            r = store.put_message(Message("TopicA", b"later %d" % j, queue_id=j % 4,
                                          properties={"KEYS": f"d-{j}", "DELAY": "18"}))
            assert r.status is PutMessageStatus.PUT_OK
        store.wait_dispatched()
        for persist_round in range(2):          # twice: each file gets its .bak
            for q in range(4):
                broker.offsets.commit_offset("g1", "TopicA", q, 5 + persist_round + q)
                broker.offsets.commit_offset("g2", "TopicB", q, 7 + persist_round)
            broker.topics.create_topic(f"TopicX{persist_round}", queue_nums=2)
            broker.offsets.persist()
            broker.topics.persist()
            store.schedule_service._update_offset(18, persist_round)
            store.schedule_service.persist()


def _build_killed(clean: Path, root: Path) -> None:
    """A copy of `clean` taken while a store that appended to it is still open, as a SIGKILL leaves it:
    abort file, the checkpoint of the last flush, queues and index behind (a reader sees the page cache)."""
    work = root.with_suffix(".work")
    shutil.copytree(clean, work)
    store = MessageStore.open(work, _fuzz_config(flushIntervalCommitLog=50, flushIntervalConsumeQueue=100))
    try:
        rng = random.Random(2)
        _put_some(store, rng, "k", 150)
        time.sleep(0.3)                     # a flush or two: the checkpoint moves, not to the end
        _put_some(store, rng, "k2", 60)
        shutil.copytree(work, root)
    finally:
        store.close()
        shutil.rmtree(work)
    assert (root / "abort").exists()


def _expected(root: Path, config: StoreConfig, out: Path, rng: random.Random) -> int:
    """Record what the undamaged store answers (on a scratch copy: opening recovers)."""
    scratch = out.with_suffix(".scratch")
    shutil.copytree(root, scratch)
    queues: dict[str, dict[str, list]] = {}
    ids = []
    with MessageStore.open(scratch, config, start_services=False) as store:
        for cq in list(store.consume_queues):
            t, q = cq.topic, cq.queue_id
            d = queues.setdefault(f"{t}\t{q}", {})
            for off in range(store.get_min_offset_in_queue(t, q), store.get_max_offset_in_queue(t, q)):
                got = store.get_message("fuzz", t, q, off, 1)
                for m in got.messages:
                    assert m.queue_offset == off, f"{root}: the undamaged store answers {off} with {m}"
                    d[str(off)] = [m.commit_log_offset, m.msg_id, zlib.crc32(m.body or b"")]
                    ids.append([m.msg_id, t, q, off, zlib.crc32(m.body or b"")])
    shutil.rmtree(scratch)
    out.write_text(json.dumps({"queues": queues, "ids": rng.sample(ids, min(40, len(ids)))}))
    return sum(len(v) for v in queues.values())


@pytest.fixture(scope="module")
def templates(tmp_path_factory, golden):
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("fuzz-templates")
    rng = random.Random(SEED)
    conf = root / "small.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in SMALL_CONF.items()))
    clean = root / "built-clean"
    _build_clean(clean)
    killed = root / "built-killed"
    _build_killed(clean, killed)
    gold = root / "golden-crash"
    shutil.copytree(golden_store(golden, "rmq440-crash"), gold)
    _make_writable(gold)
    gold_conf = golden / "rmq440-crash" / "store.conf"
    out = {}
    for name, d, c in (("built-clean", clean, conf), ("built-killed", killed, conf), ("golden-crash", gold, gold_conf)):
        exp = root / f"{name}.expected.json"
        n = _expected(d, StoreConfig.load(c), exp, rng)
        assert n > 250, f"{name}: only {n} messages in queues"
        out[name] = {"dir": str(d), "conf": str(c), "expected": str(exp)}
    print(f"\nfuzz templates built in {time.monotonic() - t0:.1f} s")
    return out


# ==== mutations ==============================================================================================
def _kind(rel: str) -> str:
    head = rel.split("/", 1)[0]
    return {"consumequeue": "cq"}.get(head, head)


def _survey(root: Path) -> dict:
    """Files by kind, with what the mutations aim at: written extent, record starts, used units."""
    files: dict[str, list[dict]] = {}
    recs = records_in_dir(root / "commitlog")
    for dirpath, _, names in os.walk(root):
        for n in sorted(names):
            p = Path(dirpath) / n
            rel = str(p.relative_to(root))
            info = {"path": rel, "size": p.stat().st_size}
            k = _kind(rel)
            if k == "commitlog":
                base = int(n)
                mine = [r for r in recs if base <= r.offset < base + info["size"]]
                info["written"] = (mine[-1].offset + mine[-1].size - base) if mine else 0
                info["records"] = [r.offset - base for r in mine]
            elif k == "cq":
                data = p.read_bytes()
                used = len(data) // 20
                while used and data[(used - 1) * 20:used * 20] == b"\0" * 20:
                    used -= 1
                info["units"] = used
            files.setdefault(k, []).append(info)
    return files


_JSON_BAD = {
    "topics.json": ['{"topicConfigTable": []}', '{"topicConfigTable": {"TopicA": "x"}}',
                    '{"topicConfigTable": {"TopicA": {"topicName": "TopicA", "readQueueNums": "four"}}}',
                    '{"topicConfigTable": {"../../evil": {"topicName": "../../evil", "readQueueNums": 4, '
                    '"writeQueueNums": 4, "perm": 6}}}',
                    '{"topicConfigTable": {"T": {"topicName": "T", "readQueueNums": -1, "writeQueueNums": '
                    '99999999999, "perm": 6}}}', '[]', 'null', '{"dataVersion": 7}', '{"topicConfigTable": 3}'],
    "consumerOffset.json": ['{"offsetTable": {"TopicA@g1": {"0": "abc"}}}', '{"offsetTable": []}',
                            '{"offsetTable": {"TopicA@g1": [1, 2]}}', '{"offsetTable": {"noseparator": {"0": 1}}}',
                            '{"offsetTable": {"TopicA@g1": {"x": 1}}}', '{"offsetTable": {"TopicA@g1": {"0": 1e400}}}',
                            '{"offsetTable": {"TopicA@g1": {"0": -5}}}', '{"offsetTable":{"TopicA@g1":{0:12,1:3}}}',
                            '{"offsetTable": null}'],
    "delayOffset.json": ['{"offsetTable": {"1": "x"}}', '{"offsetTable": {"x": 1}}', '{"offsetTable": 7}',
                         '{"offsetTable": {"99": 1}}', '{"offsetTable": {"18": -3}}',
                         '{"offsetTable": {"18": 99999999999999999999}}', '{"offsetTable": {"18": 1.5}}'],
}
_JSON_ANY = ["", "{", '{"offsetTable":', "\ufeff{}", "[" * 50000, '"just a string"', "0"]


def _pick(rng, weights: dict):
    ops, w = zip(*weights.items())
    return rng.choices(ops, w)[0]


def _bits(rng, positions: list[int]) -> list[list[int]]:
    return [[p, rng.randrange(8)] for p in positions]


def _mut_commitlog(rng, f: dict, files: list[dict]) -> dict:
    size, written = f["size"], f["written"]
    op = _pick(rng, {"flip": 25, "header": 12, "zero": 15, "truncate": 14, "delete": 10, "dir": 4, "append": 8,
                     "junk": 4})
    inside = lambda: rng.randrange(written) if written and rng.random() < 0.85 else rng.randrange(size)  # noqa: E731
    if op == "flip":
        return {"op": "flip", "args": {"bits": _bits(rng, [inside() for _ in range(rng.choice((1, 1, 1, 2, 8)))])}}
    if op == "header":              # a bit of a record's header: size, magic, crc, ids, offsets, topic
        starts = f["records"] or [0]
        return {"op": "flip", "args": {"bits": _bits(rng, [rng.choice(starts) + rng.randrange(100)])},
                "what": "record header"}
    if op == "zero":
        return {"op": "zero", "args": {"start": inside(), "length": rng.choice((1, 4, 16, 200, 4096, 30000))}}
    if op == "truncate":
        cut = rng.choice((0, rng.randrange(size), written, max(0, written - rng.randint(1, 300))))
        return {"op": "truncate", "args": {"length": cut}}
    if op == "append":
        return {"op": "append", "args": {"seed": rng.randrange(1 << 30), "length": rng.choice((1, 100, 5000))}}
    if op == "junk":
        return {"op": "replace", "args": {"seed": rng.randrange(1 << 30), "length": rng.choice((size, 100))}}
    return {"op": op}


def _mut_cq(rng, f: dict, files: list[dict]) -> dict:
    units = max(f.get("units", 0), 1)
    op = _pick(rng, {"flip": 18, "zero": 15, "truncate": 12, "delete": 12, "dir": 4, "append": 6,
                     "foreign_unit": 17, "swap": 8, "junk": 3})
    if op == "flip":
        return {"op": "flip", "args": {"bits": _bits(rng, [rng.randrange(units * 20)
                                                           for _ in range(rng.choice((1, 1, 2, 6)))])}}
    if op == "zero":
        if rng.random() < 0.5:
            u = rng.randrange(units)
            return {"op": "zero", "args": {"start": u * 20, "length": 20 * rng.choice((1, 2, 10, units))}}
        return {"op": "zero", "args": {"start": rng.randrange(f["size"]), "length": rng.choice((1, 7, 100, 600))}}
    if op == "truncate":
        return {"op": "truncate", "args": {"length": rng.choice((0, rng.randrange(units) * 20,
                                                                   rng.randrange(f["size"])))}}
    if op == "append":
        return {"op": "append", "args": {"seed": rng.randrange(1 << 30), "length": rng.choice((7, 20, 400))}}
    others = [g for g in files if g["path"].rsplit("/", 1)[0] != f["path"].rsplit("/", 1)[0] and g.get("units")]
    if op == "foreign_unit" and others:
        src = rng.choice(others)
        return {"op": "foreign_unit", "args": {"unit": rng.randrange(units), "src": src["path"],
                                               "src_unit": rng.randrange(src["units"])}}
    if op == "swap" and others:
        return {"op": "swap", "args": {"other": rng.choice(others)["path"]}}
    if op == "junk":
        return {"op": "replace", "args": {"seed": rng.randrange(1 << 30), "length": f["size"]}}
    return {"op": rng.choice(("delete", "dir"))}


def _mut_generic(rng, f: dict, files: list[dict]) -> dict:
    size = max(f["size"], 1)
    op = _pick(rng, {"flip": 25, "zero": 15, "truncate": 15, "delete": 15, "dir": 8, "append": 10, "junk": 12})
    if op == "flip":
        head = rng.random() < 0.5
        return {"op": "flip", "args": {"bits": _bits(rng, [rng.randrange(min(size, 48) if head else size)
                                                           for _ in range(rng.choice((1, 1, 3)))])}}
    if op == "zero":
        return {"op": "zero", "args": {"start": rng.randrange(size), "length": rng.choice((1, 8, 64, 4096, size))}}
    if op == "truncate":
        return {"op": "truncate", "args": {"length": rng.choice((0, rng.randrange(size), 40, 8))}}
    if op == "append":
        return {"op": "append", "args": {"seed": rng.randrange(1 << 30), "length": rng.choice((1, 100, 5000))}}
    if op == "junk":
        return {"op": "replace", "args": {"seed": rng.randrange(1 << 30), "length": rng.choice((size, 3, 0))}}
    return {"op": op}


def _mut_config(rng, f: dict | None, files: list[dict]) -> dict:
    names = list(_JSON_BAD)
    if f is None:       # the template has no config files: create one
        name = rng.choice(names)
        text = rng.choice(_JSON_BAD[name] + _JSON_ANY)
        return {"path": f"config/{name}", "op": "create", "args": {"hex": text.encode().hex()}}
    base = f["path"].rsplit("/", 1)[-1].removesuffix(".bak")
    op = _pick(rng, {"bad_json": 35, "bad_both": 12, "flip": 12, "truncate": 12, "delete": 8, "dir": 10,
                     "not_utf8": 8, "junk": 3})
    bad = lambda: rng.choice(_JSON_BAD.get(base, []) + _JSON_ANY).encode()  # noqa: E731
    if op == "bad_json":
        return {"op": "replace", "args": {"hex": bad().hex()}}
    if op == "bad_both":            # the file and its backup: nothing to fall back to
        main = f"config/{base}"
        return {"path": main, "op": "multi", "args": {"steps": [
            {"path": main, "op": "replace", "args": {"hex": bad().hex()}},
            {"path": main + ".bak", "op": rng.choice(("replace", "dir")), "args": {"hex": bad().hex()}}]}}
    if op == "not_utf8":
        return {"op": "replace", "args": {"hex": (b'{"offsetTable": {"\xff\xfe": 1}}').hex()}}
    if op == "flip":
        return {"op": "flip", "args": {"bits": _bits(rng, [rng.randrange(max(f["size"], 1))])}}
    if op == "truncate":
        return {"op": "truncate", "args": {"length": rng.randrange(max(f["size"], 1))}}
    if op == "junk":
        return {"op": "replace", "args": {"seed": rng.randrange(1 << 30), "length": 64}}
    return {"op": op}


VOUCHED_SHARE = 0.4      # of the built templates' mutations: damage under an unchanged stat (fuzz_child.vouch_all)
KIND_WEIGHTS = {"commitlog": 30, "cq": 24, "index": 12, "checkpoint": 8, "abort": 6, "lock": 5, "config": 15}


def generate(rng: random.Random, template: str, survey: dict, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        kind = _pick(rng, KIND_WEIGHTS)
        files = survey.get(kind, [])
        f = None
        if kind == "config":
            f = rng.choice(files) if files else None
            m = _mut_config(rng, f, files)
        elif not files:         # abort (a clean store), lock or checkpoint missing: create one
            m = {"path": kind, **rng.choice([
                {"op": "create", "args": {"seed": rng.randrange(1 << 30), "length": rng.choice((0, 8, 4096))}},
                {"op": "dir"}])}
        elif kind == "commitlog":
            with_data = [g for g in files if g["written"]]
            f = rng.choice([with_data[-1], with_data[0], rng.choice(files)]) if with_data else rng.choice(files)
            m = _mut_commitlog(rng, f, files)
        elif kind == "cq":
            f = rng.choice(files)
            m = _mut_cq(rng, f, files)
        else:
            f = rng.choice(files)
            m = _mut_generic(rng, f, files)
        m.setdefault("path", f["path"] if f else kind)
        m["template"] = template
        m["kind"] = kind
        out.append(m)
    return out


# ==== running the workers ====================================================================================
def _reader(stream, q: queue.Queue) -> None:
    for line in stream:
        q.put(line)
    q.put(None)


def _run_worker(job: dict, workdir: Path, results: dict, failures: list) -> None:
    """Run fuzz_child.py over job's mutations; a silence of PHASE_TIMEOUT_S is a hang, a death is a signal:
    both are charged to the mutation and phase in progress, and a new worker goes on after it."""
    jobfile = workdir / "job.json"
    jobfile.write_text(json.dumps(job))
    muts = job["mutations"]
    start, deaths = 0, 0
    while start < len(muts):
        err_path = workdir / f"stderr-{start}.txt"
        with open(err_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, str(CHILD), str(jobfile), str(start)], stdout=subprocess.PIPE,
                                    stderr=err, text=True, cwd=str(CHILD.parent))
        q: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
        current, phase = None, None
        while True:
            try:
                line = q.get(timeout=PHASE_TIMEOUT_S)
            except queue.Empty:
                proc.kill()
                proc.wait()
                failures.append((muts[current] if current is not None else None, phase,
                                 f"HANG: no progress for {PHASE_TIMEOUT_S} s"))
                start = (current + 1) if current is not None else len(muts)
                break
            if line is None:
                rc = proc.wait()
                tail = err_path.read_text(errors="replace")[-1500:]
                if current is not None:
                    what = f"SIGNAL {-rc}" if rc < 0 else f"worker exited {rc}"
                    failures.append((muts[current], phase, f"{what}: {tail}"))
                    start = current + 1
                elif rc != 0 or start < len(muts):
                    deaths += 1
                    failures.append((None, None, f"worker exited {rc} between mutations: {tail}"))
                    if deaths > 3:
                        start = len(muts)
                break
            p = line.split(" ", 2)
            if p[0] == "BEGIN":
                current, phase = int(p[1]), None
            elif p[0] == "PHASE":
                phase = p[2].strip()
            elif p[0] == "END":
                results[muts[int(p[1])]["id"]] = json.loads(p[2])
                current, phase, start = None, None, int(p[1]) + 1


def _scratch_dir() -> str | None:
    """Where the workers make their mutated copies (one per mutation, ~1 MB, deleted after it): a tmpfs when
    there is one (RMQSTORE_FUZZ_SCRATCH=DIR chooses another, =0 the pytest tmp dir). What is tested is the
    same on any filesystem; on a disk shared with a busy test suite each copy's mkdirs, unlinks and rmdirs
    (and the store's fsyncs) cost milliseconds apiece, a third of the worker's time."""
    where = os.environ.get("RMQSTORE_FUZZ_SCRATCH", "/dev/shm")
    if where == "0" or not os.path.isdir(where) or not os.access(where, os.W_OK):
        return None
    try:
        st = os.statvfs(where)
        # room to spare (a container's 64 MB /dev/shm may be nearly full): the store's disk-usage checks
        # (cleanup.py: statvfs of the store's filesystem) must see the mostly empty disk they see in tmp
        if st.f_bavail * st.f_frsize < (1 << 30) or st.f_bavail < st.f_blocks // 2:
            return None
        return tempfile.mkdtemp(prefix="rmqstore-fuzz-", dir=where)
    except OSError:
        return None


@pytest.fixture(scope="module")
def fuzz_run(templates, tmp_path_factory):
    rng = random.Random(SEED)
    check = run_cli("check", "--help", timeout=120).returncode == 0
    shares = {"built-clean": 0.48, "built-killed": 0.48, "golden-crash": 0.04}
    muts: list[dict] = []
    for name, share in shares.items():
        survey = _survey(Path(templates[name]["dir"]))
        muts += generate(rng, name, survey, round(N_MUTATIONS * share))
    vouch = random.Random(SEED ^ 39)       # its own draws: the mutations of a seed stay what they were
    for i, m in enumerate(muts):
        m["id"] = i
        if m["template"] != "golden-crash" and vouch.random() < VOUCHED_SHARE:
            m["vouched"] = True         # the record vouches for the damaged file: the fast open trusts it
    if ONLY:        # replay some mutations of a seed (the templates are rebuilt: a killed writer's may differ)
        muts = [m for m in muts if m["id"] in ONLY]
    root = tmp_path_factory.mktemp("fuzz-run")
    scratch = _scratch_dir()
    results: dict[int, list] = {}
    failures: list = []
    t0 = time.monotonic()
    threads = []
    try:
        for w in range(WORKERS):
            workdir = root / f"w{w}"
            workdir.mkdir()
            job = {"workdir": str(workdir), "scratch": str(Path(scratch or workdir) / f"w{w}"), "check": check,
                   "templates": templates, "mutations": muts[w::WORKERS]}
            threads.append(threading.Thread(target=_run_worker, args=(job, workdir, results, failures)))
            threads[-1].start()
        for t in threads:
            t.join()
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    secs = time.monotonic() - t0
    summary, secs_by = Counter(), Counter()
    for m in muts:
        for o in results.get(m["id"], []):
            summary[(o["phase"], m["kind"] + ("/vouched" if m.get("vouched") else ""), o["result"].split(":")[0])] += 1
            secs_by[(m["template"], o["phase"])] += o.get("secs", 0)
    print(f"\nRMQSTORE_FUZZ_SEED={SEED}: {len(muts)} mutations in {secs:.1f} s, check {'on' if check else 'off'}")
    for k, v in sorted(summary.items()):
        print(f"  {k[0]:6} {k[1]:10} {k[2]:40} {v}")
    print("  seconds per template and phase:", {f"{a}/{b}": round(v, 1) for (a, b), v in sorted(secs_by.items())})
    return {"mutations": muts, "results": results, "failures": failures, "check": check, "seconds": secs}


def _problems(run: dict, phases: tuple[str, ...]) -> list[str]:
    out = []
    for m, phase, what in run["failures"]:
        if phase in phases or phase is None:
            out.append(f"{what[:600]}\n    phase {phase}, mutation {json.dumps(m)[:400]}")
    for m in run["mutations"]:
        for o in run["results"].get(m["id"], []):
            if o["phase"] in phases and o["problems"]:
                out.append(f"{o['problems'][:3]}\n    phase {o['phase']} ({o['result']}), mutation "
                           f"{json.dumps(m)[:400]}")
    return out


def _report(run: dict, phases: tuple[str, ...]) -> None:
    problems = _problems(run, phases)
    assert not problems, (f"RMQSTORE_FUZZ_SEED={SEED}: {len(problems)} mutations broke the contract "
                          f"({'/'.join(phases)}):\n" + "\n".join(problems[:25]))


def test_fuzz_ran_every_mutation(fuzz_run):
    """At least 300 mutations of every file kind ran to the end (or were charged a failure)."""
    muts = fuzz_run["mutations"]
    kinds = Counter(m["kind"] for m in muts)
    assert len(muts) >= min(N_MUTATIONS, 300), len(muts)
    assert N_MUTATIONS < 100 or set(kinds) == set(KIND_WEIGHTS), kinds
    done = len(fuzz_run["results"]) + sum(1 for m, _, _ in fuzz_run["failures"] if m is not None)
    assert done >= len(muts), f"seed {SEED}: only {done} of {len(muts)} mutations ran"


def test_fuzz_open_never_crashes_hangs_or_lies(fuzz_run):
    """MessageStore.open on every mutation: an open (repaired and reported, or clean) or an RmqStoreError
    naming a file; reads return the message their offset names or nothing; a PUT_OK is readable."""
    _report(fuzz_run, ("open",))


def test_fuzz_dump_never_crashes_hangs_or_lies(fuzz_run):
    """`rmqstore dump` on every mutation: exit 0 with true lines, or exit 2 with one line naming a file."""
    _report(fuzz_run, ("dump",))


def test_fuzz_check_never_crashes_or_writes(fuzz_run):
    """`rmqstore check` on every mutation: exit 0/1 (or 2 with one line naming a file), files unchanged."""
    if not fuzz_run["check"]:
        pytest.skip("`rmqstore check --help` does not work yet: the check phase of the fuzzer did not run")
    _report(fuzz_run, ("check",))
