"""The files of a store on a filesystem other than this machine's: s3://, gs://, abfs://, hdfs://, ... any URI
pyarrow opens (pyarrow.fs.FileSystem.from_uri), or fsspec opens (wrapped in pyarrow's FSSpecHandler) when
fsspec is installed.

A plain path or a file:// URI is local and is read as before (mmap: store.recovery.view, store.files.mapped_file); only
other URIs come here. A remote store is read "as it is" (see store.recovery.view): one recursive listing tells its
files and sizes (kept LISTING_TTL seconds, so that the few listings one read's planning makes cost one),
consume queue files and commitlog spans are fetched with ranged reads (RangeReader: read_at, one GET each
on an object store), never downloaded whole.

A RemoteStore is plain data (the URI as given, query parameters such as endpoint_override included): Spark
ships it to executors, which resolve the filesystem again, once per process (_FILESYSTEMS). File paths
in views and messages are "display" paths, the URI without its query (no credentials), e.g.
s3://bucket/broker-a/store/commitlog/00000000000000000000.
"""
from __future__ import annotations

import fnmatch
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass

import numpy as np

LISTING_TTL = 30.0              # seconds a listing is reused (a copied store does not change while read)
GAP = 1 << 20                   # read_spans: records further apart than this are fetched separately
MAX_SPAN = 64 << 20             # read_spans: no fetch larger than this (unless one record is)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class StoreError(ValueError):
    """A path, option or file that makes a read impossible; the message names it."""


# --- URIs --------------------------------------------------------------------------------------------
def scheme_of(path: str) -> str | None:
    m = _SCHEME.match(str(path))
    return m.group(1).lower() if m else None


def is_remote(path) -> bool:
    """True for a URI with a scheme other than file:// (a plain path or file:// is read locally)."""
    s = scheme_of(str(path))
    return s is not None and s != "file"


def local_path(path: str) -> str:
    """A plain path as it is; file:///a/b as /a/b."""
    if scheme_of(path) == "file":
        u = urllib.parse.urlsplit(path)
        if u.netloc not in ("", "localhost"):
            raise StoreError(f"option 'path': {path!r} names host {u.netloc!r}: a file:// URI is a local path "
                             "(file:///dir/store)")
        return urllib.parse.unquote(u.path)
    return path


def display_uri(uri: str) -> str:
    """The URI without user info, query and fragment (they may hold credentials) and without a trailing
    slash: how messages and the view's paths name the store."""
    u = urllib.parse.urlsplit(uri)
    return urllib.parse.urlunsplit((u.scheme, u.netloc.rpartition("@")[2], u.path.rstrip("/"), "", ""))


def _with_path(uri: str, path: str) -> str:
    """uri with its path replaced (its query kept)."""
    u = urllib.parse.urlsplit(uri)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, path, u.query, u.fragment))


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


# --- filesystems, resolved once per process -----------------------------------------------------------
_FILESYSTEMS: dict[str, tuple[object, str]] = {}
_LOCK = threading.Lock()


def _resolve(uri: str):
    """(pyarrow FileSystem, path in it) of uri; StoreError naming the URI when nothing opens it."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    try:
        return pafs.FileSystem.from_uri(uri)
    except pa.ArrowInvalid as e:
        if "nrecognized filesystem" not in str(e):
            raise StoreError(f"option 'path': cannot open {display_uri(uri)!r}: {_one_line(e)}") from None
    except (OSError, ValueError) as e:
        raise StoreError(f"option 'path': cannot open {display_uri(uri)!r}: {_one_line(e)}") from None
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise StoreError(f"option 'path': pyarrow has no filesystem for {scheme_of(uri)}:// ({display_uri(uri)!r}) "
                         "and fsspec is not installed: pip install fsspec and its package for that scheme") from None
    try:
        fs, path = url_to_fs(uri)
    except (ImportError, ValueError, OSError) as e:
        raise StoreError(f"option 'path': cannot open {display_uri(uri)!r} with fsspec: {_one_line(e)}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def filesystem(uri: str):
    """_resolve(uri), cached for this process (executors resolve each store's URI once)."""
    got = _FILESYSTEMS.get(uri)
    if got is None:
        got = _resolve(uri)
        with _LOCK:
            _FILESYSTEMS[uri] = got
    return got


# --- the listing of a store ---------------------------------------------------------------------------
class Listing:
    """The files of a store from one recursive listing: directory (display path) -> {name: size, -1 for a
    directory}."""

    def __init__(self, root: str, entries: dict[str, dict[str, int]]):
        self.root = root
        self.entries = entries

    def names(self, d: str) -> dict[str, int]:
        return self.entries.get(d.rstrip("/"), {})

    def is_dir(self, p: str) -> bool:
        return p.rstrip("/") in self.entries

    def is_file(self, p: str) -> bool:
        d, _, n = p.rpartition("/")
        return self.names(d).get(n, -1) >= 0

    def digit_files(self, d: str, digits: int | None = 20) -> list[tuple[int, str, int]]:
        """(offset from the name, path, size) of the files of d named by digits, in name order."""
        return [(int(n), f"{d}/{n}", s) for n, s in sorted(self.names(d).items())
                if s >= 0 and n.isdigit() and (digits is None or len(n) == digits)]

    def commitlog_dir(self) -> str | None:
        sub = f"{self.root}/commitlog"
        if self.is_dir(sub):
            return sub
        if self.digit_files(self.root):
            return self.root
        return None

    def topics(self) -> dict[str, list[int]]:
        cq = f"{self.root}/consumequeue"
        out: dict[str, list[int]] = {}
        for t, s in sorted(self.names(cq).items()):
            if s < 0:
                out[t] = sorted(int(q) for q, qs in self.names(f"{cq}/{t}").items() if q.isdigit() and qs < 0)
        return out


def _listing(store: "RemoteStore") -> Listing:
    import pyarrow.fs as pafs
    fs = store.fs
    try:
        infos = fs.get_file_info(pafs.FileSelector(store.fs_root, recursive=True, allow_not_found=True))
    except (OSError, ValueError) as e:
        raise StoreError(f"option 'path': cannot list {store.root!r}: {_one_line(e)}") from None
    entries: dict[str, dict[str, int]] = {}
    for info in infos:
        p = store.display(info.path)
        d, _, name = p.rpartition("/")
        size = (info.size or 0) if info.type == pafs.FileType.File else -1
        entries.setdefault(d, {})[name] = size
        if size < 0:
            entries.setdefault(p, {})
    return Listing(store.root, entries)


_LISTINGS: dict[str, tuple[float, Listing]] = {}


# --- a store ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RemoteStore:
    """A store at a URI: `uri` as given (query included), `root` its display form, `fs_root` its path in the
    filesystem. Picklable: executors resolve the filesystem again (filesystem())."""
    uri: str
    root: str
    fs_root: str

    @property
    def fs(self):
        return filesystem(self.uri)[0]

    def fs_path(self, path: str) -> str:
        """The filesystem path of a display path of this store."""
        if path == self.root or path.startswith(self.root + "/"):
            return self.fs_root + path[len(self.root):]
        raise StoreError(f"{path!r} is not a file of the store {self.root!r}")

    def display(self, fs_path: str) -> str:
        fs_path = fs_path.rstrip("/")
        if fs_path == self.fs_root or fs_path.startswith(self.fs_root + "/"):
            return self.root + fs_path[len(self.fs_root):]
        return fs_path

    def listing(self) -> Listing:
        got = _LISTINGS.get(self.uri)
        now = time.monotonic()
        if got is None or now - got[0] > LISTING_TTL:
            got = (now, _listing(self))
            with _LOCK:
                _LISTINGS[self.uri] = got
        return got[1]

    def read(self, path: str, offset: int, n: int) -> np.ndarray:
        """Bytes [offset, offset + n) of one of its files (fewer at the file's end), one ranged read."""
        with self.fs.open_input_file(self.fs_path(path)) as f:
            return _read_at(f, offset, n)


def open_store(uri: str) -> RemoteStore:
    """The RemoteStore of uri (the filesystem is resolved here: an unknown scheme fails now)."""
    _, fs_root = filesystem(uri)
    return RemoteStore(uri, display_uri(uri), fs_root.rstrip("/"))


def _read_at(f, offset: int, n: int) -> np.ndarray:
    n = max(min(n, f.size() - offset), 0)
    if n == 0:
        return np.empty(0, dtype=np.uint8)
    return np.frombuffer(f.read_at(n, offset), dtype=np.uint8)


class RangeReader:
    """Ranged reads of a remote store's files for one task: the remote counterpart of mapped_file.FileCache
    (which maps whole local files). Each file is opened once (on an object store: one HEAD) and read with
    read_at (one ranged GET each). close() closes them."""

    def __init__(self, store: RemoteStore):
        self.store = store
        self._files: dict[str, object] = {}

    def read(self, path: str, offset: int, n: int) -> np.ndarray:
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = self.store.fs.open_input_file(self.store.fs_path(path))
        return _read_at(f, offset, n)

    def close(self) -> None:
        files, self._files = self._files, {}
        for f in files.values():
            f.close()


def read_spans(pos: np.ndarray, sizes: np.ndarray | None, file_size: int, gap: int = GAP,
               max_span: int = MAX_SPAN) -> list[tuple[int, int, int, int]]:
    """How to fetch records at positions pos (of one file; sizes known, or None) with few ranged reads:
    (i, j, lo, hi) = records pos[i:j] lie in bytes [lo, hi) of the file. A new span starts where a record
    does not follow the previous one (a position going back) or starts more than `gap` bytes after its end,
    or where the span would exceed max_span. Without sizes each span runs to the file's end."""
    n = len(pos)
    if n == 0:
        return []
    pos = np.asarray(pos, dtype=np.int64)
    if sizes is None:
        return [(0, n, int(pos.min()), file_size)]
    ends = np.minimum(pos + np.maximum(np.asarray(sizes, dtype=np.int64), 0), file_size)
    nxt = pos[1:]
    cut = np.flatnonzero((nxt < ends[:-1]) | (nxt - ends[:-1] > gap)) + 1
    edges = np.concatenate(([0], cut, [n]))
    out = []
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
        while a < b:        # positions rise within [a, b): split at max_span
            k = int(np.searchsorted(ends[a:b], int(pos[a]) + max_span, side="right")) + a
            k = min(max(k, a + 1), b)
            out.append((a, k, int(pos[a]), int(ends[k - 1])))
            a = k
    return out


# --- globs --------------------------------------------------------------------------------------------
def expand_glob(uri: str) -> list[str]:
    """The URIs a glob in uri's path matches (*, ?, [..] per path component, as glob.glob), by listing one
    directory level at a time; the query is kept on every match."""
    import pyarrow.fs as pafs
    u = urllib.parse.urlsplit(uri)
    parts = u.path.strip("/").split("/")
    first = next(i for i, p in enumerate(parts) if _has_magic(p))
    fs, base = filesystem(_with_path(uri, "/" + "/".join(parts[:first])))
    prefixes = ["/" + "/".join(parts[:first])] if first else ["/"]
    fs_bases = [base.rstrip("/")]
    for part in parts[first:]:
        nxt, nxt_fs = [], []
        for pre, fb in zip(prefixes, fs_bases):
            if not _has_magic(part):
                nxt.append(f"{pre.rstrip('/')}/{part}")
                nxt_fs.append(f"{fb}/{part}")
                continue
            try:
                infos = fs.get_file_info(pafs.FileSelector(fb, allow_not_found=True))
            except (OSError, ValueError) as e:
                raise StoreError(f"option 'path': cannot list {display_uri(_with_path(uri, pre))!r}: "
                                 f"{_one_line(e)}") from None
            for info in sorted(infos, key=lambda i: i.path):
                name = info.path.rstrip("/").rsplit("/", 1)[-1]
                if info.type == pafs.FileType.Directory and fnmatch.fnmatchcase(name, part):
                    nxt.append(f"{pre.rstrip('/')}/{name}")
                    nxt_fs.append(f"{fb}/{name}")
        prefixes, fs_bases = nxt, nxt_fs
    infos = fs.get_file_info(fs_bases) if fs_bases else []
    return [_with_path(uri, p) for p, i in zip(prefixes, infos) if i.type == pafs.FileType.Directory]


def _has_magic(s: str) -> bool:
    return any(c in s for c in "*?[")


def path_has_magic(uri: str) -> bool:
    """A glob in the URI's path (its query's '?' and '&' do not count)."""
    return _has_magic(urllib.parse.urlsplit(uri).path)
