"""What the dispatcher does at damage: the commitlog ranges it must not dispatch (recovery's skips), a missing
middle file jumped over, an invalid record resynchronised past (format/resync.py); each skip reported on the
failure channel and kept in the dispatcher's `skipped` list."""
from __future__ import annotations

import bisect
import logging

from ..files.mapped_file import offset_to_file_name
from ..format import resync
from ..state.failure import Failure, FailureKind

log = logging.getLogger("rmqstore.store.consumequeue.dispatch")     # logged under the name of the module it came from


class DamageSkips:
    """Mixed into Dispatcher (dispatch.py): uses its commit_log, skip_ranges, skipped and failures."""

    def is_skipped(self, offset: int) -> bool:
        """offset lies in a damaged range that was skipped (its bytes are not a trustworthy message)."""
        return bool(self.skip_ranges) and self._skip_range_at(offset)[0] is not None

    def add_skip_range(self, start: int, end: int) -> None:
        """Do not dispatch [start, end) (a damaged range recovery reported)."""
        if end > start:
            bisect.insort(self.skip_ranges, (start, end))

    # --- damage: skip it, say so ---------------------------------------------------------------------
    def _skip_range_at(self, offset: int) -> tuple[int | None, int | None]:
        """(end of the skip range holding offset or None, start of the next skip range after it or None)."""
        ranges = self.skip_ranges
        i = bisect.bisect_right(ranges, (offset, float("inf"))) - 1
        if i >= 0 and ranges[i][0] <= offset < ranges[i][1]:
            return ranges[i][1], None
        return None, ranges[i + 1][0] if i + 1 < len(ranges) else None

    def _skip_gap(self, offset: int) -> int | None:
        """offset lies in no commitlog file: if a later file exists (a missing middle file), report the
        gap and return the first later file's offset; None when offset is past the last file."""
        files = self.commit_log.queue.files
        later = [mf for mf in files if mf.file_from_offset > offset]
        if not later or offset < self.commit_log.get_min_offset():
            return None
        nxt = later[0].file_from_offset
        earlier = [mf for mf in files if mf.file_from_offset < offset]
        after = earlier[-1].path.name if earlier else "the first file"
        missing = self.commit_log.queue.store_path / offset_to_file_name(offset)
        self._report_skip(FailureKind.COMMITLOG_GAP, str(missing), offset, nxt,
                          f"commitlog file missing (after {after}): offsets {offset}..{nxt} are lost; dispatch "
                          f"goes on at {later[0].path.name}")
        return nxt

    def _resync(self, offset: int, why: str) -> int | None:
        """The record at offset is invalid: the offset where valid records resume (in the same file, else
        the next file's start), reported as a skipped range; None when nothing valid follows in the
        written data (the commitlog's torn end: nothing to skip to)."""
        cl = self.commit_log
        mf = cl.file_of(offset)
        if mf is None:
            return None
        base = mf.file_from_offset
        limit = mf.read_position
        try:
            nxt = resync.next_valid_record(mf.mm, offset - base, limit, check_crc=True, base=base)
        except ValueError:      # unmapped under us (cleanup)
            return None
        if nxt is not None:
            nxt += base
        elif cl.get_max_offset() > base + mf.file_size:
            nxt = base + mf.file_size           # nothing valid left in this file: go on with the next
        elif limit > offset - base:
            nxt = base + limit                  # the rest of the readable data is damage
        else:
            return None
        self._report_skip(FailureKind.CORRUPT_RECORD, str(mf.path), offset, nxt,
                          f"{why}: {nxt - offset} bytes skipped, dispatch resumes at byte {nxt - base}")
        return nxt

    def _report_skip(self, kind: FailureKind, path: str, start: int, end: int, why: str) -> None:
        log.warning("%s: dispatch skipped commitlog offsets %d..%d: %s", path, start, end, why)
        known = any(a <= start and end <= b for a, b in self.skip_ranges)
        self.skipped.append(self.failures.report(kind, why, path=path, offset=start, end=end)
                            if not known else Failure(kind, why, path, start, end))
