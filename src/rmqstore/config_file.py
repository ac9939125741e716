"""RocketMQ's ConfigManager file handling, for the JSON files under `{store}/config/`.

Writing (MixAll.string2File): the new content goes to `NAME.tmp`, the previous content is copied to
`NAME.bak`, then the temp file replaces `NAME`. Here the temp file is fsynced and the replace is atomic
(os.replace), so a crash leaves either the old or the new file, never a torn one.

Reading (ConfigManager.load): `NAME`; if it is missing, empty or unreadable, `NAME.bak`.

RocketMQ writes these files with fastjson, which writes integer map keys unquoted (`{0:12,1:3}`): the
reader accepts that as well as standard JSON. The writer emits standard JSON (quoted keys), which
fastjson reads back into its Integer-keyed maps.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

_STRING = re.compile(r'"(?:\\.|[^"\\])*"', re.S)
_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def config_dir(store_path: str | Path) -> Path:
    return Path(store_path) / "config"


def loads_lenient(text: str) -> Any:
    """json.loads that also accepts fastjson's unquoted integer keys."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    out, pos = [], 0
    for m in _STRING.finditer(text):
        out.append(_BARE_KEY.sub(r'\1"\2"\3', text[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_BARE_KEY.sub(r'\1"\2"\3', text[pos:]))
    return json.loads("".join(out))


def dumps_pretty(obj: Any) -> str:
    """Pretty JSON as fastjson's prettyFormat lays it out (tab indentation, no space after ':')."""
    return json.dumps(obj, indent="\t", separators=(",", ":"), ensure_ascii=False)


def string_to_file(text: str, path: str | Path) -> None:
    """MixAll.string2File: write NAME.tmp, keep the previous content as NAME.bak, move NAME.tmp to NAME."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    bak = path.with_name(path.name + ".bak")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    try:
        prev = path.read_bytes()
    except FileNotFoundError:
        prev = None
    if prev is not None:
        with open(bak, "wb") as f:
            f.write(prev)
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - directories that cannot be fsynced
        pass


def load_json_file(path: str | Path) -> Any | None:
    """ConfigManager.load: the file, else its .bak; None when neither holds usable JSON."""
    path = Path(path)
    for p in (path, path.with_name(path.name + ".bak")):
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except OSError as e:
            log.error("cannot read %s: %s", p, e)
            continue
        if not text.strip():
            continue
        try:
            return loads_lenient(text)
        except (json.JSONDecodeError, ValueError) as e:
            log.error("%s is not valid JSON (%s); trying the backup", p, e)
    return None


class PeriodicPersister:
    """Calls `persist()` every interval_ms (when `dirty()` says so) on a daemon thread, and at stop()."""

    def __init__(self, name: str, interval_ms: int, persist: Callable[[], None], dirty: Callable[[], bool]):
        self.name = name
        self.interval = max(interval_ms, 1) / 1000.0
        self._persist = persist
        self._dirty = dirty
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.persist_if_dirty()

    def persist_if_dirty(self) -> None:
        try:
            if self._dirty():
                self._persist()
        except Exception:
            log.exception("%s: persist failed", self.name)

    def stop(self) -> None:
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)
        self.persist_if_dirty()
