"""The `rmqstore` command line (also `python -m rmqstore`).

Every subcommand is one small `cmd_*` function plus one `Command` entry in the COMMANDS table at the
end of this file; main() builds the parser from that table, loads the `-c/--config` file with
StoreConfig.load and turns every error into one line on stderr and exit status 2.

Exit status: 0 success; 1 the command ran but some item failed (e.g. a put that was not PUT_OK);
2 error (bad argument, unreadable config, corrupt or unreadable store, a path that is not a store
directory for a command that reads one: such commands never create a store), nothing half-explained;
`load` also 141 (stdout closed early) and 130/143 (SIGINT/SIGTERM), see `rmqstore load --help`.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..store.conf.config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig
from ..errors import RmqStoreError
from ..store.format.message import Message, PutMessageStatus

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
# packages of the extras (pyproject.toml) a command may need: a missing one is named with its extra
OPTIONAL_PACKAGES = {"pyarrow": "spark", "pyspark": "spark", "pandas": "spark", "matplotlib": "spark",
                     "queuelib": "bench", "persistqueue": "bench"}
PROG = "rmqstore"


# ==== the one place the CLI opens a store ==========================================================
def _open_store(store: Path, cfg: StoreConfig, services: bool = False):
    """Open (lock, recover, dispatch) a store; a context manager. `services` starts the dispatcher and
    flush threads (needed by long-running writers); short commands dispatch synchronously."""
    from ..store.store import MessageStore

    return MessageStore.open(store, cfg, start_services=services, replicate=False)    # (the CLI's puts are local)


def _open_reader(store: Path, cfg: StoreConfig):
    """A read command's store (dump, get, query): recovered in memory, never written, created or locked
    (store.reads.store_reader.StoreReader: MessageStore's answers); a context manager. Reads a store another
    process holds open as well."""
    from ..store.reads.store_reader import StoreReader

    return StoreReader.open(store, cfg)


def _require_store(store: str | Path) -> Path:
    """The store directory of a command that must not create one (get, dump, query, stats, clean, rebuild,
    check): CliError "not a store directory: PATH" (exit 2) unless PATH is a directory holding commitlog/,
    consumequeue/ or checkpoint; a PATH holding a store in store/ says so. Looks only."""
    from ..store.files.store_dir import not_a_store

    why = not_a_store(store)
    if why:
        raise CliError(why)
    return Path(store)


def _check_store_arg(command: "Command", args: argparse.Namespace, cfg: StoreConfig) -> None:
    """Before a command runs: its STORE is a store directory (Command.store "read"), or can become one
    ("write": not a file, nor a folder holding a store in store/) whose commitlog files are the configured
    size (a forgotten -c broker.conf, said before recovery says anything; a read command meets it as an
    error: _error_line)."""
    from ..store.files.store_dir import not_a_store_to_write

    if command.store == "read":
        _require_store(args.store)
    elif command.store == "write":
        why = not_a_store_to_write(args.store)
        if why:
            raise CliError(why)
        line = _store_geometry(args.store, cfg)
        if line:
            raise CliError(line)


def _store_geometry(store: str, cfg: StoreConfig) -> str | None:
    """The one line for a store whose commitlog files are all of another size than cfg's (check_geometry:
    the file, its size, the key and the value to pass with -c), or None."""
    from ..store.check.check import NotAStoreError, check_geometry

    if not (Path(store) / "commitlog").is_dir():
        return None
    try:
        check_geometry(Path(store), cfg)
    except NotAStoreError as e:
        return str(e)
    return None


# ==== helpers =======================================================================================
class CliError(RmqStoreError):
    """A bad argument or input: the message names it (file, line, argument)."""


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _dumps(obj: dict) -> str:
    """One JSON line the way the golden files are written: compact, ASCII with \\u escapes."""
    return _ENCODER.encode(obj)


def _offset(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an offset (decimal or 0x hex)") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: offsets are not negative")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must not be negative")
    return v


class _Progress:
    """A counter on stderr (tqdm), drawn only when stderr is a terminal and the job takes over a second."""

    def __init__(self, what: str, after_s: float = 1.0):
        from .progress import ProgressBar

        self.bar = ProgressBar(what, unit=" msg", total=None, delay=after_s)

    def update(self, n: int) -> None:
        self.bar.update(n)

    def done(self, n: int) -> None:
        self.bar.update(n)
        self.bar.close()


# ==== load ==========================================================================================
LOAD_CHUNK = 1000


def _message_from_line(raw: bytes) -> Message:
    """One line of messages.jsonl to a Message; ValueError with the reason if it is not one."""
    try:
        text = raw.decode("utf-8").rstrip("\r\n")    # with its newline, an error at the end is "column 1"
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        hint = ("; the line ends inside a JSON value: each line must hold one whole message object (JSON lines, "
                "not a pretty-printed file)" if e.pos >= len(text.rstrip()) else "")
        raise ValueError(f"not JSON ({e.msg} at column {e.colno}){hint}") from None
    except RecursionError:
        raise ValueError("not a message: JSON nested too deeply") from None
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object, got {type(d).__name__}")
    if not isinstance(d.get("topic"), str):
        raise ValueError("field 'topic' missing or not a string")
    body = d.get("body", "")
    if not isinstance(body, str):
        raise ValueError("field 'body' must be a hex string")
    props = d.get("properties") or {}
    if not isinstance(props, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise ValueError("field 'properties' must be an object of string values")
    for f in ("bornHost", "storeHost"):
        if f in d and d[f] is not None and not isinstance(d[f], str):
            raise ValueError(f"field {f!r} must be an 'ip:port' string")
    for f in ("queueId", "flag", "sysFlag", "bornTimestamp", "reconsumeTimes", "preparedTransactionOffset"):
        if f in d and (not isinstance(d[f], int) or isinstance(d[f], bool)):
            raise ValueError(f"field {f!r} must be an integer")
    try:
        return Message.from_json(d)
    except ValueError as e:
        raise ValueError(f"field 'body' is not hex ({e})") from None


def _read_messages(stream, name: str) -> Iterator[tuple[int, Message]]:
    """(line number, Message) for every non-blank line; CliError naming the line for a bad one."""
    for lineno, raw in enumerate(stream, 1):
        if not raw.strip():
            continue
        try:
            yield lineno, _message_from_line(raw)
        except ValueError as e:
            raise CliError(f"{name} line {lineno}: {e}") from None


class _StopReading(Exception):
    """A SIGINT / SIGTERM arrived while the load waited for its next input line."""


def _until_stopped(items, stop: "_StopSignals"):
    """items, until a signal arrives while waiting for the next one (an idle stdin would otherwise hold
    the signal until its next line, or forever)."""
    it = iter(items)
    while True:
        stop.reading = True
        if stop.signum is not None:     # arrived before `reading` was set: it raised nothing, the wait
            stop.reading = False        # for a line would hold it
            return
        try:
            item = next(it)
        except (StopIteration, _StopReading):
            return
        finally:
            stop.reading = False
        yield item


class _StopSignals:
    """While active (main thread only): SIGINT and SIGTERM only set `signum`, so a batch being put and
    reported is finished before the load stops; while it waits for input (`reading`) the wait ends at once;
    a second signal raises KeyboardInterrupt at once (for a stdout that never drains). Restores the
    previous handlers on exit."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self):
        self.signum: int | None = None
        self.reading = False
        self._prev: dict[int, object] = {}

    def _handler(self, signum, _frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        if self.reading:
            raise _StopReading

    def __enter__(self) -> "_StopSignals":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                sig = getattr(signal, name)
                self._prev[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for sig, prev in self._prev.items():
            signal.signal(sig, prev)


# statuses of a message that is in the commitlog (FLUSH_*_TIMEOUT: stored, flushed or replicated late)
_STORED = frozenset({PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
                     PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE})


@dataclass
class _LoadRun:
    """What a load did: `stored` messages in the commitlog, `failed` not answered PUT_OK (some of them
    stored, flushed late), `reported` result lines printed (one per message, stored or not, in order)."""
    stored: int = 0
    reported: int = 0
    failed: int = 0
    stopped: str | None = None        # why the load stopped before the end of its input
    status: int = EXIT_OK


class _ResultOut:
    """Result lines to stdout, each write complete before it returns: straight to fd 1 with os.write
    (looping over partial writes), because CPython's buffered sys.stdout drops the rest of a large write
    that a signal handled without raising interrupts midway (seen with a SIGINT on a full pipe). Falls back
    to sys.stdout when it has no file descriptor (redirected in-process)."""

    def __init__(self):
        self.lines = 0      # complete lines written (counted as they go: a write cut by EPIPE counts its part)
        try:
            sys.stdout.flush()
            self._fd: int | None = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):
            self._fd = None

    def write(self, text: str) -> None:
        if self._fd is None:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.lines += text.count("\n")
            return
        view = memoryview(text.encode("utf-8"))
        while view:
            n = os.write(self._fd, view)
            self.lines += view[:n].tobytes().count(b"\n")
            view = view[n:]

    def flush(self) -> None:
        pass


def _put_and_report(st, batch: list[Message], run: _LoadRun, out, progress: "_Progress") -> None:
    """Put batch once, then print its results. A failed print (EPIPE: stdout closed) propagates; the
    batch is never put again, and `run` says how many were stored and how many of them reported."""
    results = st.put_messages(batch)
    lines = []
    i = run.reported
    for r in results:
        lines.append(_dumps({"i": i, **r.to_json()}))
        i += 1
        if r.status in _STORED:
            run.stored += 1
        if not r.ok:
            run.failed += 1
    before = out.lines
    try:
        out.write("\n".join(lines) + "\n")
        out.flush()
    finally:        # EPIPE part way: the lines that did go out count as reported
        run.reported += out.lines - before
    progress.update(run.reported)


def _load_stream(st, stream, name: str, out, run: _LoadRun, stop: _StopSignals) -> None:
    """Put the stream's messages in batches of LOAD_CHUNK, each put exactly once (a batch is taken out of
    the pending list before it is put, so an exception while printing its results never puts it again).
    After a SIGINT/SIGTERM the messages read so far are put and reported, then it stops (run.stopped).
    A malformed line: the messages before it are put and reported, then its CliError propagates."""
    progress = _Progress("messages loaded")
    batch: list[Message] = []
    try:
        try:
            for _lineno, msg in _until_stopped(_read_messages(stream, name), stop):
                batch.append(msg)
                if len(batch) >= LOAD_CHUNK or stop.signum is not None:
                    todo, batch = batch, []
                    _put_and_report(st, todo, run, out, progress)
                    if stop.signum is not None:
                        break
        except CliError:
            todo, batch = batch, []
            if todo:
                _put_and_report(st, todo, run, out, progress)
            raise
        todo, batch = batch, []
        if todo:
            _put_and_report(st, todo, run, out, progress)
    finally:
        progress.done(run.reported)
    if stop.signum is not None:
        import signal

        run.stopped = f"stopped by {signal.Signals(stop.signum).name}"
        run.status = 128 + stop.signum


def cmd_load(args: argparse.Namespace, cfg: StoreConfig) -> int:
    """Append the messages of a JSON-lines input; print one put result per message.

    Each message is put once. A result line is printed only after its message was put, in input order.
    When stdout is closed (EPIPE, e.g. `| head -2`) the load stops after the batch whose results could
    not be printed (it is stored, not put again) and exits 141; on SIGINT/SIGTERM it finishes and reports
    the batch in progress, closes the store cleanly and exits 130/143. Either way one stderr line says how
    many messages were stored and how many of their results were printed."""
    if args.input in (None, "-"):
        stream, name = sys.stdin.buffer, "<stdin>"
    else:
        stream, name = open(args.input, "rb"), args.input
    out = _ResultOut()
    run = _LoadRun()
    with contextlib.closing(stream) if stream is not sys.stdin.buffer else contextlib.nullcontext():
        with _StopSignals() as stop, _open_store(Path(args.store), cfg, services=True) as st:
            try:
                _load_stream(st, stream, name, out, run, stop)
            except BrokenPipeError:
                _stdout_to_devnull()
                run.stopped, run.status = "stdout was closed", 141
    if run.stopped:
        print(f"{PROG} load: {run.stopped}: {run.stored} messages stored, the results of the first "
              f"{run.reported} printed ({run.failed} not PUT_OK); the rest of {name} was not loaded",
              file=sys.stderr)
        return run.status
    if run.failed:
        print(f"{PROG} load: {run.failed} of {run.reported} messages were not answered PUT_OK (see their "
              "status)", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _stdout_to_devnull() -> None:
    """stdout's reader went away: point fd 1 at /dev/null so that no later flush raises again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="store directory (created if missing)")
    p.add_argument("--flush", choices=("async", "sync"), default=None,
                   help="flush policy (default: the config's flushDiskType, ASYNC_FLUSH). "
                        "sync: results are printed only once their messages are on disk")
    p.add_argument("-i", "--input", metavar="FILE", default="-",
                   help="read messages from FILE instead of standard input")


def _load_overrides(args: argparse.Namespace) -> dict:
    if args.flush is None:
        return {}
    return {"flushDiskType": SYNC_FLUSH if args.flush == "sync" else ASYNC_FLUSH}


# ==== cat ===========================================================================================
CAT_CHUNK = 512


def cmd_cat(args: argparse.Namespace, cfg: StoreConfig) -> int:
    """Print the commitlog's message records in physical order, one JSON object a line."""
    from ..store.reads.reader import CommitLogReader, find_commitlog_dir
    from ..store.files.store_dir import not_a_store

    try:
        find_commitlog_dir(args.store)
    except OSError as e:
        raise CliError(not_a_store(args.store) or _error_line(e)) from None
    out = sys.stdout
    lines: list[str] = []
    with CommitLogReader(args.store, cfg) as reader:
        try:
            for m in reader.messages(args.from_offset, limit=args.limit, check_crc=args.check_crc):
                lines.append(_dumps(m.to_json()))
                if len(lines) >= CAT_CHUNK:
                    out.write("\n".join(lines) + "\n")
                    lines = []
        finally:   # records before a corrupt one are printed before the error
            if lines:
                out.write("\n".join(lines) + "\n")
            out.flush()
    return EXIT_OK


def _cat_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE",
                   help="store directory (holding commitlog/) or a commitlog directory itself; "
                        "read only, nothing is written")
    p.add_argument("--from", dest="from_offset", metavar="OFFSET", type=_offset, default=0,
                   help="start at the first record at or after this commitlog offset (default 0)")
    p.add_argument("--limit", metavar="N", type=_count, default=None, help="print at most N records")
    p.add_argument("--check-crc", action="store_true",
                   help="verify each body's CRC32 against BODYCRC (a mismatch is an error)")


# ==== dump / get / query ============================================================================
def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="an existing store directory, never created (dump, get and "
                                                  "query change nothing in it and read one open elsewhere)")


def _write_lines(objs) -> None:
    out = sys.stdout
    lines: list[str] = []
    for o in objs:
        lines.append(_dumps(o))
        if len(lines) >= CAT_CHUNK:
            out.write("\n".join(lines) + "\n")
            lines = []
    if lines:
        out.write("\n".join(lines) + "\n")
    out.flush()


def cmd_dump(args: argparse.Namespace, cfg: StoreConfig) -> int:
    """The golden dump.jsonl of a store: min/max phy, every queue and its messages, key queries."""
    from .dump import dump_lines, read_keys

    keys = None
    if args.keys:
        try:
            keys = read_keys(args.keys)
        except ValueError as e:
            raise CliError(str(e)) from None
    with _open_reader(Path(args.store), cfg) as st:
        _write_lines(dump_lines(st, keys))
    return EXIT_OK


def _dump_args(p: argparse.ArgumentParser) -> None:
    _store_arg(p)
    p.add_argument("--keys", metavar="keys.tsv", help="also answer these key queries (topic<TAB>key lines) "
                                                      "with the raw index matches, as RocketMQ's store does")


def cmd_get(args: argparse.Namespace, cfg: StoreConfig) -> int:
    """getMessage: messages of a queue from a logical offset; the status line goes to stderr."""
    with _open_reader(Path(args.store), cfg) as st:
        r = st.get_message(args.group, args.topic, args.queue, args.offset, max(args.n, 1))
        messages = r.messages[:args.n]          # -n 0: none (getMessage itself answers at least one)
        _write_lines(m.to_json() for m in messages)
        print(_dumps({"status": r.status.value, "nextBeginOffset": r.next_begin_offset if messages else args.offset,
                      "minOffset": r.min_offset, "maxOffset": r.max_offset, "count": len(messages)}),
              file=sys.stderr)
    return EXIT_OK if messages or args.n == 0 else EXIT_FAILED


def _get_args(p: argparse.ArgumentParser) -> None:
    _store_arg(p)
    p.add_argument("topic", metavar="TOPIC", help="the topic whose queue is read (as stored: e.g. TopicA, "
                                                  "%%RETRY%%group)")
    p.add_argument("queue", metavar="QUEUE", type=_count, help="queue id")
    p.add_argument("offset", metavar="OFFSET", type=_count, help="logical offset in the queue")
    p.add_argument("-n", "--limit", dest="n", metavar="N", type=_count, default=32,
                   help="at most N messages (default 32; RocketMQ's transfer limits apply); 0: none, only the "
                        "status line")
    p.add_argument("--group", default="rmqstore-cli", help="consumer group named in the request")


def _ms(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        pass
    from datetime import datetime
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch milliseconds nor an ISO date") from None


def cmd_query(args: argparse.Namespace, cfg: StoreConfig) -> int:
    """Messages of TOPIC carrying KEY (hash collisions and duplicates removed)."""
    with _open_reader(Path(args.store), cfg) as st:
        found = st.find_messages_by_key(args.topic, args.key, args.max, args.begin, args.end)
        _write_lines(m.to_json() for m in found)
    return EXIT_OK if found else EXIT_FAILED


def _query_args(p: argparse.ArgumentParser) -> None:
    _store_arg(p)
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("key", metavar="KEY", help="a word of the KEYS property, or a UNIQ_KEY")
    p.add_argument("--begin", type=_ms, default=0, help="earliest store time (ms or ISO date)")
    p.add_argument("--end", type=_ms, default=2 ** 63 - 1, help="latest store time (ms or ISO date)")
    p.add_argument("--max", type=_count, default=64, help="at most this many index matches (default 64)")


# ==== rebuild =======================================================================================
def cmd_rebuild(args: argparse.Namespace, cfg: StoreConfig) -> int:
    """Drop consume queues and index and rebuild them from the commitlog."""
    if args.engine == "spark":
        from ..spark import rebuild_spark

        out = rebuild_spark(args.store, cfg, master=args.master, conf=dict(args.conf or []))
        if out.get("missing_units"):        # the rebuilt queues are not what an open would make of the store
            print(_dumps(out))
            print(f"rmqstore rebuild: {out['missing_units']} units are still missing after the spark rebuild "
                  f"of {args.store}: rebuild it with --engine local", file=sys.stderr)
            return 1
    else:
        from ..store.repair.rebuild import rebuild_store
        from .progress import ProgressBar

        from ..store.check.check import NotAStoreError

        bar = ProgressBar("rebuild")
        try:
            out = rebuild_store(args.store, cfg, progress=bar.callback())
        except NotAStoreError as e:
            raise CliError(str(e)) from None
        finally:
            bar.close()
    print(_dumps(out))
    return EXIT_OK


def _rebuild_args(p: argparse.ArgumentParser) -> None:
    _store_arg(p)
    p.add_argument("--engine", choices=("local", "spark"), default="local",
                   help="local: this process; spark: parallel tasks on a Spark cluster (the spark extra)")
    p.add_argument("--master", metavar="URL", default=None, help="Spark master (default local[*])")
    p.add_argument("--conf", metavar="KEY=VALUE", action="append", type=_spark_conf,
                   help="a Spark setting for --engine spark, e.g. spark.driver.memory=512m (repeatable)")


def _spark_conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--conf {text!r}: expected KEY=VALUE")
    return key.strip(), value


# ==== check =========================================================================================
def cmd_check(args: argparse.Namespace, cfg: StoreConfig) -> int:
    """A full consistency check (rmqstore.store.check.check): one line per problem, then a summary line; exit 0 when
    clean, 1 when not. Read only, unless --repair (which takes the store's lock)."""
    from ..store.check.check import NotAStoreError, check_store
    from ..store.repair.check_repair import repair_store
    from .progress import ProgressBar

    bar = ProgressBar("check")
    try:
        if args.repair:
            first, report = repair_store(args.store, cfg, progress=bar.callback())
        else:
            first = report = check_store(args.store, cfg, progress=bar.callback())
    except NotAStoreError as e:
        raise CliError(str(e)) from None
    finally:
        bar.close()
    for note in first.notes:
        print(f"note: {note}", file=sys.stderr)
    for p in first.problems:
        print(str(p))
    if args.repair:
        for line in report.repaired:
            print(f"repaired: {line}")
        for p in report.problems:
            print(f"not repaired: {p}")
    print(report.summary())
    sys.stdout.flush()
    return EXIT_OK if report.ok else EXIT_FAILED


def _check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="store directory")
    p.add_argument("--repair", action="store_true", help="open the store (taking its lock), rebuild consume "
                   "queues and index, quarantine malformed config files (FILE.corrupt-<time>), check again")


# ==== clean =========================================================================================
def cmd_clean(args: argparse.Namespace, cfg: StoreConfig) -> int:
    """Delete expired commitlog files (and the queue and index files below them) now."""
    from ..store.durability.cleanup import clean_store

    with _open_store(Path(args.store), cfg) as st:
        print(_dumps(clean_store(st, force=args.force)))
    return EXIT_OK


def _clean_args(p: argparse.ArgumentParser) -> None:
    _store_arg(p)
    p.add_argument("--force", action="store_true",
                   help="delete the oldest files even if not expired (never the current one), as RocketMQ does "
                        "above 85%% disk use")


# ==== stats =========================================================================================
def cmd_stats(args: argparse.Namespace, cfg: StoreConfig) -> int:
    """Per topic and queue: messages, bytes, first/last store time, messages per minute (read only)."""
    from ..spark import stats

    rows = stats(args.store, engine=args.engine, plot=args.plot, config=args.config or cfg)
    _write_lines(rows)
    if args.plot:
        print(f"{PROG} stats: plot written to {args.plot}", file=sys.stderr)
    return EXIT_OK


def _stats_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="store directory (read only: nothing is written)")
    p.add_argument("--engine", choices=("local", "spark"), default="local",
                   help="local: this process; spark: a local Spark session (the spark extra)")
    p.add_argument("--plot", metavar="OUT.png", default=None, help="also draw messages per minute per topic")


# ==== serve =========================================================================================
def _serve_args(p: argparse.ArgumentParser) -> None:
    from ..broker import server

    class _StoreNamed:   # the positional is STORE in every command's usage line
        def __getattr__(self, name):
            return getattr(p, name)

        def add_argument(self, *names, **kw):
            if names == ("store",):
                kw.setdefault("metavar", "STORE")
            return p.add_argument(*names, **kw)

    server.cli_add_arguments(_StoreNamed())


def _serve_run(args: argparse.Namespace, cfg: StoreConfig) -> int:
    from ..broker import server

    return server.cli_run(args, cfg)


# ==== bench =========================================================================================
def _bench_args(p: argparse.ArgumentParser) -> None:
    from . import bench

    class _WithoutConfig:   # bench declares -c/--config itself; the common option already means the same
        def __getattr__(self, name):
            return getattr(p, name)

        def add_argument(self, *names, **kw):
            return None if "--config" in names else p.add_argument(*names, **kw)

    bench.add_arguments(_WithoutConfig())
    p.add_argument("--server", action="store_true",
                   help="instead: async send and push-consume throughput through `rmqstore serve` over loopback")


def cmd_bench(args: argparse.Namespace, cfg: StoreConfig) -> int:
    if args.server:
        from ..broker import server

        return server.cli_bench_server(args, cfg)
    from . import bench

    bench.run(args)
    return EXIT_OK


# ==== the command table =============================================================================
@dataclass(frozen=True)
class Command:
    name: str
    help: str                                                   # one line, for `rmqstore --help`
    run: Callable[[argparse.Namespace, StoreConfig], int]       # returns the exit status
    add_arguments: Callable[[argparse.ArgumentParser], None]
    description: str = ""                                       # for `rmqstore NAME --help`
    epilog: str = ""
    config_overrides: Callable[[argparse.Namespace], dict] | None = None   # RocketMQ key -> value
    store: str = ""          # its STORE: "read" an existing store, "write" one created if missing (_check_store_arg)


COMMANDS: list[Command] = [
    Command(
        "load", "append messages from JSON lines (messages.jsonl format); print a put result per message",
        cmd_load, _load_args, config_overrides=_load_overrides, store="write",
        description="Read messages, one JSON object a line in the format of the golden messages.jsonl "
                    "(topic, queueId, flag, sysFlag, bornTimestamp, bornHost, storeHost, reconsumeTimes, "
                    "preparedTransactionOffset, properties, body as hex), append them in order and print, "
                    "for each, one line in the format of puts.jsonl: "
                    '{"i","status","msgId","wroteOffset","logicsOffset"}. '
                    "A malformed line stops the load with an error naming its line number; the "
                    "messages before it are stored and reported.",
        epilog="example:\n  rmqstore load -c store.conf ./my-store < messages.jsonl > puts.jsonl\n\n"
               "exit status: 0 all stored, 1 some message not answered PUT_OK (see its status), 2 error,\n"
               "141 stdout closed early (`| head`), 130/143 SIGINT/SIGTERM: the load stops after the batch in\n"
               "progress (stored once, never put again) and says on stderr how many were stored"),
    Command(
        "cat", "print the commitlog's records in physical order as JSON lines (read only)",
        cmd_cat, _cat_args,
        description="Decode every message record of the commitlog in physical order and print one JSON "
                    "object per record, with the fields of the golden dump.jsonl message lines (topic, "
                    "queueId, queueOffset, commitLogOffset, storeSize, bodyCRC, flag, sysFlag, "
                    "bornTimestamp, storeTimestamp, bornHost, storeHost, reconsumeTimes, "
                    "preparedTransactionOffset, msgId, properties, body). Opens nothing for writing. "
                    "A record that is not valid stops the listing: the records before it are printed, "
                    "then an error naming the file and the offset.",
        epilog="examples:\n  rmqstore cat ./my-store | head\n"
               "  rmqstore cat --from 262144 --limit 10 ./my-store\n"
               "  rmqstore cat --check-crc /path/to/commitlog"),
    Command("dump", "print what the store reads back, in the golden dump.jsonl format", cmd_dump, _dump_args,
            store="read",
            description="Open the store (recovering it if needed) and print: the commitlog's min and max "
                        "offsets; for every topic (sorted) and queue, its min and max offsets and every "
                        "message from min to max as getMessage returns them; then, with --keys, for every "
                        "topic<TAB>key line the offsets queryMessage returns (raw index matches).",
            epilog="example:\n  rmqstore dump -c store.conf --keys keys.tsv ./copy-of-store > dump.jsonl"),
    Command("get", "read messages of a queue from a logical offset (getMessage)", cmd_get, _get_args, store="read",
            epilog="example:\n  rmqstore get ./my-store TopicA 0 100 -n 8\n"
                   "the status, next begin offset and min/max offsets go to stderr as one JSON line\n\n"
                   "exit status: 0 messages printed (or -n 0), 1 none found at OFFSET (the status line says why:\n"
                   "NO_MATCHED_LOGIC_QUEUE, OFFSET_OVERFLOW_ONE, ...), 2 error"),
    Command("query", "find the messages of a topic that carry a key", cmd_query, _query_args, store="read",
            description="Look a key up in the index and print the messages of TOPIC whose KEYS or UNIQ_KEY "
                        "really is KEY, each once (the raw index may also hold hash collisions and other "
                        "topics' messages: see `dump --keys`).",
            epilog="example:\n  rmqstore query ./my-store TopicA order-42\n\n"
                   "exit status: 0 messages printed, 1 no message of TOPIC carries KEY, 2 error"),
    Command("rebuild", "drop and rebuild consume queues and index from the commitlog", cmd_rebuild,
            _rebuild_args, store="read",
            epilog="examples:\n  rmqstore rebuild -c store.conf ./my-store\n"
                   "  rmqstore rebuild --engine spark --master local[2] ./my-store"),
    Command("check", "check every file of a store (records, CRCs, queues, index, checkpoint, config)",
            cmd_check, _check_args, store="read",
            description="A full consistency check, read only (nothing is created, locked or written): every "
                        "commitlog record (magic code, sizes, CRC; after a bad record the scan resumes at the "
                        "next valid one), every consume queue unit against its record and every message "
                        "against its queue, index entries against records, the checkpoint against the files, "
                        "config/*.json. One line per problem (FILE: offset N: what), then a summary line. "
                        "--repair opens the store, rebuilds what is derived and quarantines what is not.",
            epilog="examples:\n  rmqstore check -c store.conf ./my-store\n"
                   "  rmqstore check -c store.conf --repair ./my-store\n\n"
                   "exit status: 0 clean, 1 problems found (after --repair: problems left), 2 error"),
    Command("clean", "delete expired files now (fileReservedTime, disk use)", cmd_clean, _clean_args, store="read",
            description="Apply RocketMQ's cleanup rules once: commitlog files older than fileReservedTime "
                        "hours (or, above diskMaxUsedSpaceRatio, the oldest), never the current file; then the "
                        "consume queue and index files wholly below the commitlog's new min offset, moving "
                        "each queue's min offset. Prints what was deleted as JSON.",
            epilog="example:\n  rmqstore clean -c broker.conf ./my-store\n  rmqstore clean --force ./my-store"),
    Command("stats", "per topic and queue: count, bytes, first/last store time, messages per minute",
            cmd_stats, _stats_args, store="read",
            epilog="examples:\n  rmqstore stats ./my-store\n  rmqstore stats --engine spark --plot rates.png ./my-store"),
    Command("serve", "run a RocketMQ 4.x name server and broker over the store", _serve_run, _serve_args,
            store="write",
            description="One process serving RocketMQ's remoting protocol: a name server (namesrvAddr, default "
                        "127.0.0.1:9876) and a broker on listenPort (10911) and the VIP port listenPort - 2, "
                        "bound to brokerIP1 (loopback by default). RocketMQ 4.x clients (Java, Go, C++) and "
                        "rmqstore.client talk to it. SIGTERM shuts down cleanly.",
            epilog="example:\n  rmqstore serve -c broker.conf ./my-store",
            config_overrides=lambda args: __import__("rmqstore.broker.server", fromlist=["x"]).cli_config_overrides(args)),
    Command("bench", "measure put, dispatch and read throughput (JSON on stdout)", cmd_bench, _bench_args,
            epilog="example:\n  rmqstore bench --scale small"),
    Command("admin", "operate a running broker as mqadmin does (clusterList, topicStatus, brokerStatus, ...)",
            lambda args, cfg: __import__("rmqstore.tools.admin_cli", fromlist=["x"]).run(args, cfg),
            lambda p: __import__("rmqstore.tools.admin_cli", fromlist=["x"]).add_arguments(p),
            epilog="examples:\n  rmqstore admin clusterList -n 127.0.0.1:9876\n"
                   "  rmqstore admin topicStatus -n 127.0.0.1:9876 -t TopicA"),
    Command("namesrv", "run a RocketMQ 4.x name server alone (for a master/slave pair)",
            lambda args, cfg: __import__("rmqstore.broker.server", fromlist=["x"]).cli_namesrv(args, cfg),
            lambda p: __import__("rmqstore.broker.server", fromlist=["x"]).cli_namesrv_arguments(p),
            epilog="example:\n  rmqstore namesrv --listen 127.0.0.1:9876"),
    Command("ha-truncate", "cut a slave's commitlog back to what its master holds (after a divergence)",
            lambda args, cfg: __import__("rmqstore.tools.ha_cli", fromlist=["x"]).run(args, cfg),
            lambda p: __import__("rmqstore.tools.ha_cli", fromlist=["x"]).add_arguments(p),
            description="A slave whose log diverged from its master's (the master lost bytes the slave has, or "
                        "the slave was pointed at another master) stops replicating and says so. This finds "
                        "the common prefix, comparing the slave's bytes with the master's byte for byte over "
                        "the HA port, cuts the slave's commitlog (a stopped store) back to the last whole "
                        "record in it and keeps the cut bytes aside in STORE/quarantine/. Consume queues and "
                        "index are cut at the next start.",
            epilog="examples:\n  rmqstore ha-truncate -c slave.conf --master 127.0.0.1:10912 --dry-run ./slave-store\n"
                   "  rmqstore ha-truncate -c slave.conf --master 127.0.0.1:10912 ./slave-store\n"
                   "  rmqstore ha-truncate -c slave.conf --to 4718592 ./slave-store"),
    # ---- more commands register here: write cmd_NAME(args, cfg) -> int and _NAME_args(parser)
    # ---- above, then add one Command(...) line.
]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only=NAME: only that command's options are declared (the others keep their name
    and help line: the command list, --help and a misspelt command read the same). Every command's own
    parser costs ~0.5 ms, admin's ~20 subcommands 10 ms: a run builds only the one it runs."""
    from .. import __version__
    from .cli_args import CommandParser

    parser = CommandParser(
        prog=PROG, description="A RocketMQ 4.4.0-compatible message store: tools over a store directory.",
        epilog=f"Run '{PROG} COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-c", "--config", metavar="FILE", default=None,
                        help="broker.conf-style properties file (key=value; RocketMQ names such as "
                             "mapedFileSizeCommitLog); defaults: RocketMQ's")
    common.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for c in COMMANDS:
        p = sub.add_parser(c.name, parents=[common], help=c.help,
                           description=textwrap.fill(c.description or c.help, 79),
                           epilog=c.epilog or None, formatter_class=argparse.RawDescriptionHelpFormatter)
        if only is None or only == c.name:
            c.add_arguments(p)
        p.set_defaults(_command=c)
    return parser


@functools.lru_cache(maxsize=8)
def _parser(only: str) -> argparse.ArgumentParser:
    """build_parser(only=...), built once per process: parsing changes nothing in it, and a process that
    runs main() many times (the corruption fuzzer's workers, ~600 calls) pays ~8 ms a call otherwise."""
    return build_parser(only=only)


_SIZE_KEYS = {"commitlog": "mappedFileSizeCommitLog", "consumequeue": "mappedFileSizeConsumeQueue",
              "index": "maxHashSlotNum/maxIndexNum"}


def _geometry_line(e: BaseException) -> str | None:
    """A store file whose size is not the configured one (a forgotten -c): the file, its size, the key."""
    import re
    from ..errors import CorruptStoreError

    m = re.match(r"file size (\d+) does not match the configured size (\d+)", getattr(e, "reason", "") or "")
    if not isinstance(e, CorruptStoreError) or m is None:
        return None
    parts = Path(e.path).parts
    key = next((k for d, k in _SIZE_KEYS.items() if d in parts), "the configured file size")
    value = f" ({key}={m[1]})" if "/" not in key and " " not in key else ""
    return (f"{e.path}: file size {m[1]} does not match {key} {m[2]}: the store was written with another "
            f"configuration; pass its broker.conf with -c broker.conf{value}")


def _error_line(e: BaseException, store: str | None = None, cfg: StoreConfig | None = None) -> str:
    geometry = _geometry_line(e)
    if geometry is not None:      # any store file of another size: said as the commitlog's, when they are too
        return (_store_geometry(store, cfg) if store and cfg else None) or geometry
    if isinstance(e, OSError) and not isinstance(e, RmqStoreError):
        where = e.filename if e.filename is not None else ""
        what = e.strerror or str(e)
        msg = f"{where}: {what}" if where else what
    else:
        msg = str(e)
    return " ".join(msg.split("\n"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    parser = _parser(argv[0] if argv else "")
    args = parser.parse_args(argv)
    command: Command | None = getattr(args, "_command", None)
    if command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    logging.basicConfig(stream=sys.stderr, format=f"{PROG}: %(levelname)s: %(message)s",
                        level=logging.WARNING - 10 * min(args.verbose, 2))
    cfg = None
    try:
        overrides = command.config_overrides(args) if command.config_overrides else None
        # only serving and putting honour the broker's features: the other commands read a broker.conf for the
        # store's geometry, and a key they would refuse (useTLS=true, duplicationEnable=true) is only named
        cfg = StoreConfig.load(args.config, overrides, reading=command.name not in ("serve", "load", "bench"))
        _check_store_arg(command, args, cfg)
        return command.run(args, cfg)
    except ModuleNotFoundError as e:
        extra = OPTIONAL_PACKAGES.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        from ..errors import install_hint
        print(f"{PROG} {command.name}: needs {e.name}, which is not installed: {install_hint(extra)}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # the reader went away (`rmqstore cat | head`): stop quietly, like other Unix tools
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 141
    except (RmqStoreError, OSError) as e:
        with contextlib.suppress(OSError):
            sys.stdout.flush()
        print(f"{PROG} {command.name}: {_error_line(e, getattr(args, 'store', None), cfg)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG} {command.name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
