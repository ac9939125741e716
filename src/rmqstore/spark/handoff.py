"""How a writer task's encoded rows reach the driver: a file in the write's staging directory, or the task's
commit message.

Rows carried in commit messages travel as Spark task results, which the driver's JVM holds on its heap until
Python has fetched them: a 200,000-row write of ~600-byte rows (two task results of ~65 MB) beside a cached
copy of those rows failed with OutOfMemoryError under Spark's default 1 GB driver (measured, `make bench`).
So the driver makes `{store}/.spark-write-<token>/` at planning. A task that sees it (on the driver's
machine, or with the store on a shared mount: executors see it as they see the store for a rebuild) writes
its rows there, one Arrow IPC file per task attempt, and sends the file's name and size; a task that does not
sends its rows in the message as before. The driver maps the files when it appends (checking each is there
with its size: a file it cannot see is an error naming it, never rows silently missing) and removes the
directory afterwards, appended or aborted. A directory a killed driver left is removed by a later write to
the store once it is a day old (a younger one may belong to a write that is still running).
"""
from __future__ import annotations

import io
import logging
import os
import shutil
import time
import uuid

import pyarrow as pa

log = logging.getLogger(__name__)

PREFIX = ".spark-write-"
STALE_SECONDS = 24 * 3600


class StagingError(RuntimeError):
    """A task's staged rows cannot be read by the driver."""


def make_stage(store: str) -> tuple[str, bool]:
    """(the staging directory of a new write, whether the store's directory was made for it)."""
    made = not os.path.exists(store)
    path = os.path.join(store, PREFIX + uuid.uuid4().hex)
    os.makedirs(path)
    return path, made


def open_sink(stage: str | None, partition: int, attempt: int) -> tuple[pa.NativeFile | io.BytesIO, str | None]:
    """Where a task writes its rows: (a file of stage, its name) when this executor sees stage, else (a
    buffer for the commit message, None)."""
    if stage and os.path.isdir(stage):
        name = f"part-{partition:05d}-{attempt}-{uuid.uuid4().hex[:8]}.arrow"
        return pa.OSFile(os.path.join(stage, name), "wb"), name
    return io.BytesIO(), None


def rows_source(stage: str | None, name: str | None, size: int, payload: bytes, partition: int):
    """What pa.ipc.open_stream reads a task's rows from: its staged file (mapped), or its payload."""
    if name is None:
        return payload
    path = os.path.join(stage or "", name)
    try:
        got = os.path.getsize(path)
    except OSError:
        got = None
    if got != size:
        raise StagingError(f"the rows of partition {partition} were written to {path} ({size} bytes) by a task "
                           f"that saw that directory, but here it is {'missing' if got is None else f'{got} bytes'}: "
                           "do the executors see the store's directory as the driver does (a shared mount)?")
    return pa.memory_map(path)


def remove_stage(stage: str | None, store: str, made_store: bool) -> None:
    """Remove a write's staging directory; and the store's directory if the write made it and left it empty."""
    if not stage:
        return
    shutil.rmtree(stage, ignore_errors=True)
    if made_store:
        try:
            os.rmdir(store)
        except OSError:
            pass            # not empty: the write appended (or someone else wrote there)


def remove_stale(store: str) -> None:
    """Staging directories of writes that died (older than STALE_SECONDS), under the store's lock."""
    try:
        names = [n for n in os.listdir(store) if n.startswith(PREFIX)]
    except OSError:
        return
    now = time.time()
    for n in names:
        p = os.path.join(store, n)
        try:
            old = now - os.path.getmtime(p) > STALE_SECONDS
        except OSError:
            continue
        if old:
            log.warning("%s: removed the staging directory of a Spark write that did not finish", p)
            shutil.rmtree(p, ignore_errors=True)
