"""The small files' part of `rmqstore check`: the checkpoint against the records, config/*.json (each
parses and has the shape the store loads, else its `.bak` is looked at), and something other than a
regular file of the store where a store file belongs (a directory, or a symbolic link leading out of the
store: `--repair` never writes through one).
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable

from ..format import codec
from .check_commitlog import Records
from .check_report import CheckReport, queue_dirs
from ..files.mapped_file import half_made, half_made_name


def check_checkpoint(root: Path, recs: Records, report: CheckReport) -> None:
    p = root / "checkpoint"
    if not p.exists():
        if len(recs.offsets):
            report.add("checkpoint", p, 0, "missing (open recovers as if nothing was flushed)")
        return
    if not p.is_file():
        report.add("checkpoint", p, 0, "not a regular file")
        return
    raw = p.read_bytes()
    if len(raw) < codec.CHECKPOINT.size:
        report.add("checkpoint", p, len(raw), f"{len(raw)} bytes, too short for its three timestamps")
        return
    newest = int(recs.store_ts.max()) if len(recs.store_ts) else 0
    if report.live:     # the writer flushes on: its checkpoint may vouch for records the scan did not see
        return
    for name, v, at in zip(("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp"),
                           codec.CHECKPOINT.unpack_from(raw, 0), (0, 8, 16)):
        if v < 0:
            report.add("checkpoint", p, at, f"{name} {v} is negative")
        elif len(recs.store_ts) and v > newest:
            report.add("checkpoint", p, at, f"{name} {v} is after the newest record's store time {newest}: the "
                                            "commitlog lost data the checkpoint says was flushed")


def _config_decoders() -> dict[str, Callable]:
    """The decoder the store loads each known config file with (a wrong shape is a problem, as at open)."""
    from ..conf.config_tables import decode_delay_offsets, decode_offsets, decode_topics
    from ..consumequeue import deleted_queues
    from ..commitlog.damage import FILE_NAME, decode
    return {"topics.json": decode_topics, "consumerOffset.json": decode_offsets,
            "delayOffset.json": decode_delay_offsets, FILE_NAME: decode,
            deleted_queues.FILE_NAME: deleted_queues.decode}


def config_problem(path: Path, decode: Callable | None) -> str | None:
    """Why a config file is unusable (None: it is usable, or missing/empty: the defaults)."""
    if not path.exists():
        return None
    if not path.is_file():
        return "a directory (or not a regular file) where a config file belongs"
    try:
        raw = path.read_bytes()
    except OSError as e:
        return f"cannot read: {e.strerror}"
    if not raw.strip():
        return None
    from ..conf.config_file import _problem
    return _problem(raw, decode)


def check_config(root: Path, report: CheckReport) -> list[tuple[Path, bool]]:
    """config/*.json (and the known files): returns [(file, its .bak usable)] of the unusable ones."""
    d = root / "config"
    bad = []
    if not d.exists():
        return bad
    if not d.is_dir():
        report.add("config", d, 0, "not a directory")
        return bad
    decoders = _config_decoders()
    from ..consumequeue.deleted_queues import FILE_NAME as deleted_queues_name
    names = sorted(set(decoders) | {n for n in os.listdir(d) if n.endswith(".json")})
    for n in names:
        p = d / n
        why = config_problem(p, decoders.get(n))
        bak = p.with_name(n + ".bak")
        if why is None and n == deleted_queues_name and (p.is_file() or bak.is_file()) \
                and not (p.read_bytes().strip() if p.is_file() else b""):
            why = "missing or empty (deleteTopic never writes it empty: the record of deleted topics is lost)"
        if why is None:
            continue
        bak_ok = bak.is_file() and bak.stat().st_size > 0 and config_problem(bak, decoders.get(n)) is None
        if n == deleted_queues_name:        # its .bak may lack the last deletion: never restored as it is
            report.add("config", p, 0, why + ("; its .bak is the state before the last deleteTopic: --repair merges "
                                              "it with the deletions the commitlog shows" if bak_ok else
                                              "; no usable .bak: --repair derives the deletions from the commitlog"))
        else:
            report.add("config", p, 0, why + ("; its .bak is usable (open falls back to it, --repair restores it)"
                                              if bak_ok else "; no usable .bak"))
        bad.append((p, bak_ok))
    return bad


def quarantine(path: Path, stamp: str | None = None) -> Path:
    """Move path aside as PATH.corrupt-<time> (never deleted); returns the new name."""
    stamp = stamp or time.strftime("%Y%m%d%H%M%S")
    dst = path.with_name(f"{path.name}.corrupt-{stamp}")
    i = 1
    while dst.exists():
        dst = path.with_name(f"{path.name}.corrupt-{stamp}.{i}")
        i += 1
    os.replace(path, dst)
    return dst


def repair_config(bad: list[tuple[Path, bool]], out: list[str]) -> None:
    """Each malformed config file (check_config's list): moved aside, its .bak restored when usable; what
    was done appended to out."""
    for p, bak_ok in bad:
        aside = quarantine(p)
        if bak_ok:
            shutil.copy2(p.with_name(p.name + ".bak"), p)
            out.append(f"{p}: moved aside as {aside.name}; restored from {p.name}.bak")
        else:
            out.append(f"{p}: moved aside as {aside.name}; no usable backup: the store starts from defaults")


def store_file_dirs(root: Path) -> list[Path]:
    """The directories of the store's numbered files: commitlog, index, every consume queue."""
    return [root / "commitlog", root / "index"] + [d for _, _, d in queue_dirs(root)]


def check_file_kinds(root: Path, report: CheckReport) -> None:
    """Something else than a regular file where a store file belongs (a directory named like a commitlog,
    consume queue or index file; abort, lock), and the temporary of a file a crash left half made."""
    for d in store_file_dirs(root):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for n in names:
            if n.isdigit() and not (d / n).is_file():
                report.add("store", d / n, 0, "not a regular file where a store file belongs")
            elif half_made_name(n) and not half_made(d / n):
                if os.path.lexists(d / n):     # else renamed by its writer since the listing
                    report.add("store", d / n, 0, "not a regular file, named like a new store file being made: "
                                                  "RocketMQ cannot load the directory while it is there (never "
                                                  "removed by rmqstore)")
            elif half_made_name(n):
                if report.live:
                    report.notes.append(f"{d / n}: a new file its writer is making (renamed to {n[1:-4]} when whole)")
                else:
                    report.add("store", d / n, 0, f"a file a crash left half made (renamed to {n[1:-4]} only when "
                                                  "whole): RocketMQ cannot load the directory while it is there; "
                                                  "the next open for writing or `check --repair` removes it")
    for n in ("abort", "lock"):
        p = root / n
        if p.exists() and not p.is_file():
            report.add("store", p, 0, "not a regular file where the store's " + n + " file belongs")


# what a repair writes, moves or deletes (the commitlog is only read: a commitlog/ linked to another disk is fine)
WRITTEN_ENTRIES = ("consumequeue", "index", "config", "checkpoint", "abort", "lock")


def _outside(real_root: str, p: Path) -> str | None:
    target = os.path.realpath(p)
    return None if os.path.commonpath([real_root, target]) == real_root else target


def links_out_of_store(root: Path) -> list[tuple[Path, str]]:
    """(path, target) of every symbolic link among the files and directories a repair writes whose target
    is not inside the store (a repair rewrites, moves and deletes files there: never elsewhere)."""
    real_root = os.path.realpath(root)
    out = []
    for name in WRITTEN_ENTRIES:
        top = root / name
        if top.is_symlink():
            target = _outside(real_root, top)
            if target is not None:
                out.append((top, target))
            continue
        if not top.is_dir():
            continue
        for d, dirs, files in os.walk(top):                 # followlinks=False: links are not entered
            for n in sorted(dirs + files):
                p = Path(d) / n
                target = _outside(real_root, p) if p.is_symlink() else None
                if target is not None:
                    out.append((p, target))
    return out


def check_links(root: Path, report: CheckReport) -> None:
    for p, target in links_out_of_store(root):
        report.add("store", p, 0, f"a symbolic link to {target}, outside the store: --repair refuses to write "
                                  "through it (replace it by the file itself)")
