"""RocketMQ's ConfigManager file handling, for the JSON files under `{store}/config/`.

Writing (MixAll.string2File): the new content goes to `NAME.tmp`, the previous content is copied to
`NAME.bak`, then the temp file replaces `NAME`. Here both files are written to a temp file, fsynced and
renamed (os.replace), so a crash leaves either the old or the new file, never a torn one; and a previous
content that is not good (not JSON, wrong shape) never replaces the good `.bak`.

Reading (ConfigManager.load): `NAME`; if it is missing, empty, unreadable or malformed (not UTF-8, not
JSON, a wrong shape such as a list where a table belongs, a non-numeric offset), `NAME.bak`, with a
warning naming both. When neither is usable, CorruptStoreError names the file and how to repair it:
nothing is loaded half, no raw exception escapes. A directory (or FIFO...) where the file belongs is a
CorruptStoreError naming it too.

RocketMQ writes these files with fastjson, which writes integer map keys unquoted (`{0:12,1:3}`): the
reader accepts that as well as standard JSON. The writer emits standard JSON (quoted keys), which
fastjson reads back into its Integer-keyed maps.
"""
from __future__ import annotations

import json
import logging
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

from ...errors import CorruptStoreError

log = logging.getLogger(__name__)
T = TypeVar("T")

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


def backup_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".bak")


def check_file_or_missing(path: str | Path, what: str) -> bool:
    """True when path is a regular file, False when nothing is there; CorruptStoreError naming the path
    when something else is (a directory, a FIFO, a socket...), which no store file may be."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise CorruptStoreError(str(path), 0, f"cannot stat the {what}: {e.strerror}") from None
    if stat.S_ISREG(st.st_mode):
        return True
    kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
    raise CorruptStoreError(str(path), 0, f"{kind} where the {what} belongs: move it away (or remove it)")


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - directories that cannot be fsynced
        pass


def _write_atomically(data: bytes, path: Path) -> None:
    """data into path.tmp, fsync, rename over path: a crash leaves the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def string_to_file(text: str, path: str | Path, decode: Callable[[Any], Any] | None = None) -> None:
    """MixAll.string2File, made atomic: the new content goes to NAME.tmp (fsynced), the previous content
    of NAME becomes NAME.bak (atomically too), then NAME.tmp replaces NAME and the directory is fsynced.

    The previous content is kept as NAME.bak only when it is good (UTF-8 JSON that `decode` accepts): a
    corrupt NAME (the one load_config_file fell back from) never overwrites the last good backup.
    A directory or other non-file at NAME: CorruptStoreError naming it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = check_file_or_missing(path, "config file")
    bak = backup_path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    prev = path.read_bytes() if existed else None
    if prev and prev.strip():
        problem = _problem(prev, decode)
        if problem is None:
            check_file_or_missing(bak, "backup of a config file")
            _write_atomically(prev, bak)
        else:
            log.warning("%s: %s: not kept as the backup %s (it keeps the last good content)", path, problem,
                        bak.name)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


_DECODE_ERRORS = (ValueError, TypeError, AttributeError, KeyError, OverflowError, RecursionError)


def _problem(raw: bytes, decode: Callable[[Any], Any] | None) -> str | None:
    """Why raw is not a usable config file (None: it is)."""
    try:
        _decode_bytes(raw, decode)
    except _ConfigProblem as e:
        return str(e)
    return None


class _ConfigProblem(Exception):
    """What makes one config file (or its backup) unusable."""


def _decode_bytes(raw: bytes, decode: Callable[[Any], Any] | None) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _ConfigProblem(f"not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        data = loads_lenient(text)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise _ConfigProblem(f"not valid JSON ({e})") from None
    if decode is None:
        return data
    try:
        return decode(data)
    except _DECODE_ERRORS as e:
        raise _ConfigProblem(f"malformed ({e or type(e).__name__})") from None


def _read_one(path: Path, decode: Callable[[Any], Any] | None, what: str) -> tuple[bool, Any]:
    """(True, value) for a usable file; (False, None) when missing or empty; _ConfigProblem otherwise."""
    try:
        if not check_file_or_missing(path, what):
            return False, None
        raw = path.read_bytes()
    except CorruptStoreError as e:
        raise _ConfigProblem(e.reason) from None
    except OSError as e:
        raise _ConfigProblem(f"cannot read: {e.strerror}") from None
    if not raw.strip():
        return False, None        # ConfigManager.load: an empty file means "try the backup"
    return True, _decode_bytes(raw, decode)


def load_config_file(path: str | Path, decode: Callable[[Any], T]) -> T | None:
    """ConfigManager.load, stricter: decode(the file's JSON), else decode(the .bak's JSON) with a warning
    naming both files; None when neither exists or both are empty (nothing saved yet: the defaults).

    decode turns the parsed JSON into the manager's table and raises ValueError (TypeError,
    AttributeError, KeyError) for a wrong shape. When the file is unusable (unreadable, not UTF-8, not
    JSON, wrong shape) and so is its backup (or there is none), CorruptStoreError names the file and says
    how to repair it; nothing is loaded half. A directory (or other non-file) where the file belongs is a
    CorruptStoreError at once, backup or not: the store could not write its file there; so is one where the
    backup belongs, even while the file itself is good (its next write would fail on it)."""
    path = Path(path)
    bak = backup_path(path)
    check_file_or_missing(path, "config file")     # a directory there: the store could not write it either
    check_file_or_missing(bak, "backup of a config file")    # nor its backup: refused at open, not at close
    try:
        ok, value = _read_one(path, decode, "config file")
        if ok:
            return value
        problem = None
    except _ConfigProblem as e:
        problem = str(e)
    try:
        ok, value = _read_one(bak, decode, "backup of a config file")
    except _ConfigProblem as e:
        ok, bak_problem = False, str(e)
    else:
        bak_problem = None if ok else "missing or empty"
    if ok:
        if problem is not None:
            log.warning("%s: %s; loaded its backup %s instead", path, problem, bak.name)
        return value
    if problem is None and bak_problem == "missing or empty":
        return None
    if problem is None:
        raise CorruptStoreError(str(bak), 0, f"{bak_problem}, and {path.name} is missing or empty: restore "
                                             f"{path.name} from a copy, or remove {bak.name} to start from "
                                             "defaults (what it held is lost)")
    if bak_problem == "missing or empty":
        detail, remove = f"its backup {bak.name} is missing or empty", "remove it"
    else:
        detail, remove = f"its backup {bak.name} is unusable too ({bak_problem})", f"remove it and {bak.name}"
    raise CorruptStoreError(str(path), 0, f"{problem}; {detail}: restore {path.name} from a copy, or {remove} "
                                          "to start from defaults (what it held is lost)")


def as_int(value: Any, where: str) -> int:
    """A JSON integer (or a string of one: fastjson's map keys) of a config file; ValueError naming where."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{where}: {value!r} is not an integer")


def as_object(value: Any, where: str) -> dict:
    """A JSON object of a config file (None: empty); ValueError naming where for anything else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where} is a {type(value).__name__}, not an object")
    return value


def load_json_file(path: str | Path) -> Any | None:
    """load_config_file for JSON of any shape (the caller checks it)."""
    return load_config_file(path, lambda d: d)


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
