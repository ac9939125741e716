"""The command line, run as a subprocess: load, cat, errors, --help."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import golden_store, read_jsonl, run_cli
from rmqstore.store.format import codec
from rmqstore.store.format import scanner
from rmqstore.errors import CorruptStoreError
from rmqstore.store.reads.reader import CommitLogReader


def lines(b: bytes) -> list[dict]:
    return [json.loads(x) for x in b.decode("utf-8").splitlines() if x.strip()]


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> str:
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err


# --- load --------------------------------------------------------------------------------------------
def test_load_prints_golden_puts(golden, compare_tools, tmp_path):
    gset = golden / "rmq440-clean"
    res = run_cli("load", "-c", gset / "store.conf", tmp_path / "store",
                  input=(gset / "messages.jsonl").read_bytes())
    assert res.returncode == 0, res.stderr
    assert res.stderr == b""
    assert res.stdout == (gset / "puts.jsonl").read_bytes()
    cmp = subprocess.run([sys.executable, compare_tools / "compare_commitlog.py",
                          golden_store(golden, "rmq440-clean") / "commitlog", tmp_path / "store" / "commitlog"],
                         capture_output=True, text=True)
    assert cmp.returncode == 0, cmp.stdout


def test_load_console_script_and_append_in_two_runs(golden, compare_tools, tmp_path):
    """The installed `rmqstore` script; a second load appends after what the first one stored."""
    gset = golden / "rmq440-clean"
    script = Path(sys.executable).parent / "rmqstore"
    assert script.exists(), f"console script missing: {script}"
    msgs = (gset / "messages.jsonl").read_bytes().splitlines(keepends=True)
    out = []
    for part, flush in ((msgs[:1234], "sync"), (msgs[1234:], "async")):
        res = subprocess.run([script, "load", "--flush", flush, "-c", gset / "store.conf", tmp_path / "s"],
                             input=b"".join(part), capture_output=True)
        assert res.returncode == 0, res.stderr
        out += lines(res.stdout)
    strip = lambda d: {k: v for k, v in d.items() if k != "i"}   # noqa: E731  (i restarts at 0 per run)
    assert [strip(d) for d in out] == [strip(d) for d in read_jsonl(gset / "puts.jsonl")]
    cmp = subprocess.run([sys.executable, compare_tools / "compare_commitlog.py",
                          golden_store(golden, "rmq440-clean") / "commitlog", tmp_path / "s" / "commitlog"],
                         capture_output=True, text=True)
    assert cmp.returncode == 0, cmp.stdout


def test_load_malformed_line_names_the_line(golden, tmp_path):
    good = (golden / "rmq440-clean" / "messages.jsonl").read_bytes().splitlines(keepends=True)[:3]
    for bad, why in [(b'{"topic": "T", "body": "zz"}\n', "hex"), (b"{not json\n", "not JSON"),
                     (b"[1, 2]\n", "JSON object"), (b'{"body": ""}\n', "topic"),
                     (b'{"topic": "T", "queueId": "x"}\n', "queueId"), (b'\xff\xfe\n', "UTF-8")]:
        store = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        res = run_cli("load", store, input=good[0] + b"\n" + good[1] + bad + good[2])
        assert_one_line_error(res, "line 4", why)
        assert [d["i"] for d in lines(res.stdout)] == [0, 1]        # what came before is stored
        assert len(list(CommitLogReader(store).messages())) == 2


def test_load_reports_refused_messages(tmp_path):
    inp = (json.dumps({"topic": "T" * 128, "body": ""}) + "\n" + json.dumps({"topic": "T", "body": "00"}) + "\n")
    res = run_cli("load", tmp_path / "s", input=inp.encode())
    assert res.returncode == 1
    out = lines(res.stdout)
    assert out[0] == {"i": 0, "status": "MESSAGE_ILLEGAL", "msgId": None, "wroteOffset": None, "logicsOffset": None}
    assert out[1]["status"] == "PUT_OK" and out[1]["wroteOffset"] == 0
    assert b"1 of 2" in res.stderr


# --- cat ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rmq440-clean", "rmq440-crash"])
def test_cat_golden_matches_dump(golden, name):
    store = golden_store(golden, name)
    res = run_cli("cat", store)                          # the read-only original
    assert res.returncode == 0, res.stderr
    recs = lines(res.stdout)
    puts = read_jsonl(golden / name / "puts.jsonl")
    assert [r["commitLogOffset"] for r in recs] == [p["wroteOffset"] for p in puts]
    assert [r["msgId"] for r in recs] == [p["msgId"] for p in puts]
    by_offset = {r["commitLogOffset"]: r for r in recs}
    dumped = [d for d in read_jsonl(golden / name / "dump.jsonl") if "commitLogOffset" in d]
    assert dumped
    for d in dumped:
        assert by_offset[d["commitLogOffset"]] == d
        assert list(by_offset[d["commitLogOffset"]]) == list(d)      # same fields, same order
    # every message of messages.jsonl is in the commitlog as it was put
    for m, r in zip(read_jsonl(golden / name / "messages.jsonl"), recs):
        assert (r["topic"], r["queueId"], r["sysFlag"], r["body"]) == (m["topic"], m["queueId"], m["sysFlag"], m["body"])
        assert r["properties"] == codec.sorted_properties_string(m["properties"])


def test_cat_from_and_limit(golden):
    store = golden_store(golden, "rmq440-clean")
    puts = read_jsonl(golden / "rmq440-clean" / "puts.jsonl")
    offs = [p["wroteOffset"] for p in puts]
    for start, limit in [(offs[100], 5), (offs[100] + 1, 3), (262144, 2), (262143, 2), (0, 0), (offs[-1], 10),
                         (offs[-1] + 1, 10), (10 ** 12, 1)]:
        res = run_cli("cat", "--from", str(start), "--limit", str(limit), store)
        assert res.returncode == 0, res.stderr
        want = [o for o in offs if o >= start][:limit]
        assert [r["commitLogOffset"] for r in lines(res.stdout)] == want, (start, limit)
    res = run_cli("cat", "--from", hex(offs[7]), "--limit", "1", store)
    assert [r["commitLogOffset"] for r in lines(res.stdout)] == [offs[7]]


def test_cat_sample_commitlog(golden):
    """The field sample: 48 whole records = 47 messages, then the END_OF_FILE record that fills the
    8,192-byte file; its directory is the commitlog dir itself."""
    sample = golden / "rocketmq-sample-commitlog"
    res = run_cli("cat", "--check-crc", sample)
    assert res.returncode == 0, res.stderr
    recs = lines(res.stdout)
    assert len(recs) == 47
    assert [r["queueOffset"] for r in recs] == list(range(47))
    assert {r["topic"] for r in recs} == {"abc"}
    assert all("KEYS\x01" in r["properties"] and "TAGS\x01" in r["properties"] for r in recs)
    assert recs[0]["commitLogOffset"] == 0 and recs[0]["storeHost"] == "192.168.71.1:8123"
    assert bytes.fromhex(recs[0]["body"]) == b"Once, there was a chance for me!"
    all_recs = list(CommitLogReader(sample).records(check_crc=True))
    assert len(all_recs) == 48
    assert (all_recs[-1].kind, all_recs[-1].offset, all_recs[-1].size) == (scanner.Outcome.END_OF_FILE, 8084, 108)


def test_cat_writes_nothing(golden, tmp_path):
    store = shutil.copytree(golden_store(golden, "rmq440-crash"), tmp_path / "ro")
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in store.rglob("*")}
    res = run_cli("cat", "--check-crc", store)
    assert res.returncode == 0 and len(lines(res.stdout)) == 8008
    assert {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in store.rglob("*")} == before


# --- corrupt stores ------------------------------------------------------------------------------------
FILE1 = f"{262144:020d}"


def _record_in_file1(store: Path, k: int) -> tuple[int, int]:
    """(position in file 1, size) of its k-th record."""
    recs = [r for r in CommitLogReader(store).records() if r.file.path.name == FILE1]
    return recs[k].position, recs[k].size


def _patch(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def test_cat_bad_magic(golden_copy):
    store = golden_copy("rmq440-clean")
    pos, _ = _record_in_file1(store, 10)
    _patch(store / "commitlog" / FILE1, pos + 4, b"\x12\x34\x56\x78")
    res = run_cli("cat", store)
    err = assert_one_line_error(res, FILE1, f"offset {pos}", "magic", f"commitlog offset {262144 + pos}")
    assert "0x12345678" in err
    out = lines(res.stdout)                              # the records before it were printed
    assert out[-1]["commitLogOffset"] + out[-1]["storeSize"] == 262144 + pos
    assert sum(1 for r in out if r["commitLogOffset"] >= 262144) == 10


def test_cat_flipped_body_byte_needs_check_crc(golden_copy):
    store = golden_copy("rmq440-clean")
    pos, size = _record_in_file1(store, 3)
    path = store / "commitlog" / FILE1
    body_at = pos + codec.HEADER_V4.size
    assert struct.unpack_from(">i", path.read_bytes(), pos + codec.HEADER_V4.size - 4)[0] > 0
    b = path.read_bytes()[body_at]
    _patch(path, body_at, bytes([b ^ 0x40]))
    assert run_cli("cat", store).returncode == 0         # without --check-crc the flip goes unseen
    res = run_cli("cat", "--check-crc", store)
    assert_one_line_error(res, FILE1, f"offset {pos}", "CRC")
    assert len(lines(res.stdout)) == len([r for r in CommitLogReader(store).records() if r.kind == 0
                                         and r.offset < 262144 + pos])


def test_cat_total_size_past_file_end(golden_copy):
    store = golden_copy("rmq440-clean")
    pos, _ = _record_in_file1(store, 5)
    _patch(store / "commitlog" / FILE1, pos, struct.pack(">i", 262144 - pos + 1))
    res = run_cli("cat", store)
    assert_one_line_error(res, FILE1, f"offset {pos}", "total size")


def test_cat_file_truncated_mid_record(golden_copy):
    store = golden_copy("rmq440-crash")
    last = sorted((store / "commitlog").iterdir())[2]    # the last file with data (the 4th is empty)
    recs = [r for r in CommitLogReader(store).records() if r.file.path == last]
    victim = recs[-20]
    os.truncate(last, victim.position + victim.size // 2)
    res = run_cli("cat", store)
    assert_one_line_error(res, last.name, f"offset {victim.position}")
    assert lines(res.stdout)[-1]["commitLogOffset"] == recs[-21].offset


def test_cat_truncated_inside_a_header(golden_copy):
    store = golden_copy("rocketmq-sample-commitlog")
    f = store / f"{0:020d}"
    os.truncate(f, 172 + 5)                              # the second record keeps 5 bytes
    res = run_cli("cat", store)
    assert_one_line_error(res, f.name, "offset 172")
    assert len(lines(res.stdout)) == 1


# --- errors and help ---------------------------------------------------------------------------------
def test_errors_are_one_line(tmp_path, golden):
    assert_one_line_error(run_cli("cat", tmp_path / "nope"), str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_cli("cat", tmp_path / "empty"), "empty", "no commitlog")
    assert_one_line_error(run_cli("cat", "-c", tmp_path / "missing.conf", tmp_path), "missing.conf")
    bad_conf = tmp_path / "bad.conf"
    bad_conf.write_text("mapedFileSizeCommitLog=lots\n")
    assert_one_line_error(run_cli("load", "-c", bad_conf, tmp_path / "s", input=b""), "mapedFileSizeCommitLog",
                          "bad.conf")
    # a store whose files do not have the configured size
    store = golden_store(golden, "rmq440-clean")
    copy = shutil.copytree(store / "commitlog", tmp_path / "wrong" / "commitlog")
    for p in copy.iterdir():
        p.chmod(0o644)
    assert_one_line_error(run_cli("load", tmp_path / "wrong", input=b""), "00000000000000000000", "size")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert_one_line_error(run_cli("load", a_file / "sub", input=b""), str(a_file))
    res = run_cli("cat", "--from", "-5", tmp_path)
    assert res.returncode == 2 and b"Traceback" not in res.stderr


@pytest.mark.parametrize("args", [["--help"], ["load", "--help"], ["cat", "--help"]])
def test_help(args):
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    text = res.stdout.decode()
    assert "usage: rmqstore" in text
    if args[0] != "--help":
        assert "-c FILE, --config FILE" in text and "STORE" in text


def test_no_command_prints_usage():
    res = run_cli()
    assert res.returncode == 2 and b"usage: rmqstore" in res.stderr


def test_python_dash_m_and_entry_point_agree(tmp_path):
    a = run_cli("--help").stdout
    b = subprocess.run([Path(sys.executable).parent / "rmqstore", "--help"], capture_output=True).stdout
    assert a == b


def test_cat_blank_record_of_a_truncated_copy(golden_copy, tmp_path):
    """A file cut inside its END_OF_FILE record ends there if the blank would have fit the configured
    file size (RocketMQ's default: 1 GiB); it is corrupt if not, or if the size is not known."""
    store = golden_copy("rocketmq-sample-commitlog")
    os.truncate(store / f"{0:020d}", 8100)
    for size in (None, 8192):
        conf = ["-c", tmp_path / "ok.conf"] if size else []
        (tmp_path / "ok.conf").write_text(f"mapedFileSizeCommitLog={size}\n")
        res = run_cli("cat", *conf, store)
        assert res.returncode == 0, res.stderr
        assert len(lines(res.stdout)) == 47
    (tmp_path / "small.conf").write_text("mapedFileSizeCommitLog=8150\n")
    assert_one_line_error(run_cli("cat", "-c", tmp_path / "small.conf", store), "00000000000000000000",
                          "offset 8084", "blank")
    with pytest.raises(CorruptStoreError, match="offset 8084"):
        list(CommitLogReader(store).records())           # no configured size: nothing to go by
