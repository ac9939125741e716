"""Progress bars of the long commands (`load`, `rebuild`, `check`, `bench`): tqdm on stderr, drawn only
when stderr is a terminal (a pipe, a file or a test sees nothing)."""
from __future__ import annotations

import sys
from typing import Callable


class ProgressBar:
    """A tqdm bar on stderr, or nothing when stderr is not a terminal. update(done, total) sets the
    position (bytes or items), close() ends the line."""

    def __init__(self, label: str, unit: str = "B", total: int | None = 1, delay: float = 0.0, stream=None):
        """total None: a counter (no end known); delay: draw nothing for a job shorter than that (s)."""
        stream = stream or sys.stderr
        self._bar = None
        if stream.isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=total, unit=unit, unit_scale=True, desc=label, file=stream, leave=True,
                             mininterval=0.2, delay=delay)

    def update(self, done: int, total: int | None = None) -> None:
        if self._bar is None:
            return
        if total is not None:
            self._bar.total = max(total, done, 1)
        elif self._bar.total is not None and done > self._bar.total:
            self._bar.total = done
        self._bar.n = done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def callback(self) -> Callable[[int, int], None] | None:
        """update as a (done, total) callback, None when nothing is drawn (the work skips the calls)."""
        return self.update if self._bar is not None else None
