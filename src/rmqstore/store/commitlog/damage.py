"""Accepted commitlog damage: byte ranges `rmqstore check --repair` quarantined and the store lives with.

A commitlog range that fails its checks is not derived data: nothing can rebuild it, and a repair never
deletes a message. `check --repair` therefore

1. copies the damaged bytes to `{store}/quarantine/{commitlog offset:020d}` and appends one JSON line
   (file, offset, length, reason, time) to `{store}/quarantine/quarantine.jsonl` (quarantine_range);
2. records the range as accepted damage in `{store}/config/damagedRanges.json` (record_ranges; written
   atomically with its `.bak`, as RocketMQ's ConfigManager writes its files: config_file.string_to_file).

The bytes stay in the commitlog as well. Whoever reads or dispatches the commitlog honours the record:
`check` reports an accepted range as one note (exit 0), `rebuild` and the dispatcher skip it, reads never
answer it (accepted_ranges() gives the merged `[start, end)` list; Dispatcher.add_skip_range takes them).

    {"version": 1, "ranges": [{"file": "commitlog/00000000000000000000", "offset": 1234, "length": 200,
                               "reason": "body CRC ...", "time": "2026-11-24T04:40:00Z",
                               "quarantined": "quarantine/00000000000000001234"}]}

decode/encode/covered/merged are pure; load_ranges, record_ranges and quarantine_range do the I/O.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FILE_NAME = "damagedRanges.json"
QUARANTINE_DIR = "quarantine"
QUARANTINE_LOG = "quarantine.jsonl"
VERSION = 1


@dataclass(frozen=True)
class DamagedRange:
    """One accepted damaged commitlog range [offset, offset + length)."""
    file: str              # the commitlog file holding it, relative to the store ("commitlog/000...")
    offset: int            # commitlog (physical) offset where the damage starts
    length: int
    reason: str
    time: str              # when it was accepted (UTC, ISO 8601)
    quarantined: str | None = None     # the copy of its bytes, relative to the store

    @property
    def end(self) -> int:
        return self.offset + self.length


def damage_file(root: str | os.PathLike) -> Path:
    return Path(root) / "config" / FILE_NAME


# --- pure -------------------------------------------------------------------------------------------
def decode(data: Any) -> list[DamagedRange]:
    """The JSON of damagedRanges.json to ranges (sorted by offset); ValueError naming what is wrong."""
    if data is None:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("ranges", []), list):
        raise ValueError(f"{FILE_NAME}: expected an object with a 'ranges' list")
    out = []
    for i, r in enumerate(data.get("ranges", [])):
        if not isinstance(r, dict):
            raise ValueError(f"{FILE_NAME}: ranges[{i}] is not an object")
        off, length = r.get("offset"), r.get("length")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (off, length)):
            raise ValueError(f"{FILE_NAME}: ranges[{i}]: offset and length must be non-negative integers")
        q = r.get("quarantined")
        out.append(DamagedRange(str(r.get("file", "")), off, length, str(r.get("reason", "")),
                                str(r.get("time", "")), None if q is None else str(q)))
    return sorted(out, key=lambda r: r.offset)


def encode(ranges: list[DamagedRange]) -> str:
    return json.dumps({"version": VERSION, "ranges": [asdict(r) for r in sorted(ranges, key=lambda r: r.offset)]},
                      indent=2, ensure_ascii=False) + "\n"


def merged(ranges: list[DamagedRange]) -> list[tuple[int, int]]:
    """The ranges as sorted, non-overlapping [start, end) pairs (touching ones joined)."""
    out: list[list[int]] = []
    for r in sorted(ranges, key=lambda r: r.offset):
        if r.length <= 0:
            continue
        if out and r.offset <= out[-1][1]:
            out[-1][1] = max(out[-1][1], r.end)
        else:
            out.append([r.offset, r.end])
    return [(a, b) for a, b in out]


def covered(pairs: list[tuple[int, int]], start: int, end: int) -> bool:
    """[start, end) lies wholly inside one of the merged pairs."""
    import bisect
    i = bisect.bisect_right(pairs, (start, float("inf"))) - 1
    return i >= 0 and pairs[i][0] <= start and end <= pairs[i][1]


def overlapping(pairs: list[tuple[int, int]], start: int, end: int) -> bool:
    """[start, end) meets one of the merged pairs."""
    return any(a < end and start < b for a, b in pairs)


# --- I/O --------------------------------------------------------------------------------------------
def load_ranges(root: str | os.PathLike) -> list[DamagedRange]:
    """The accepted ranges of the store at root ([] when none were recorded); falls back to the .bak copy,
    else CorruptStoreError naming the file (config_file.load_config_file)."""
    from ..conf.config_file import load_config_file
    return load_config_file(damage_file(root), decode) or []


def accepted_ranges(root: str | os.PathLike) -> list[tuple[int, int]]:
    """Merged [start, end) commitlog ranges not to dispatch nor read (what the dispatcher's skip list takes)."""
    return merged(load_ranges(root))


def record_ranges(root: str | os.PathLike, new: list[DamagedRange]) -> None:
    """Add ranges to damagedRanges.json (atomic write, previous content kept as .bak)."""
    from ..conf.config_file import string_to_file
    have = load_ranges(root)
    known = {(r.offset, r.length) for r in have}
    all_ranges = have + [r for r in new if (r.offset, r.length) not in known]
    string_to_file(encode(all_ranges), damage_file(root), decode)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def quarantine_range(root: str | os.PathLike, commitlog_file: Path, file_from_offset: int, pos: int,
                     length: int, reason: str) -> DamagedRange:
    """Copy bytes [pos, pos + length) of one commitlog file to quarantine/{offset:020d} and log it in
    quarantine/quarantine.jsonl (both fsynced); returns the DamagedRange to record. Read with pread: the
    file is never mapped here (a hole read through a mapping can SIGBUS)."""
    root = Path(root)
    qdir = root / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    offset = file_from_offset + pos
    dst = qdir / f"{offset:020d}"
    fd = os.open(commitlog_file, os.O_RDONLY)
    try:
        data = os.pread(fd, length, pos)
    finally:
        os.close(fd)
    tmp = dst.with_name(dst.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dst)
    rng = DamagedRange(str(Path(commitlog_file).resolve().relative_to(root.resolve())), offset, len(data),
                       reason, _now(), str(dst.relative_to(root)))
    with open(qdir / QUARANTINE_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({"file": rng.file, "offset": rng.offset, "length": rng.length, "reason": reason,
                            "time": rng.time, "copy": rng.quarantined}, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return rng
