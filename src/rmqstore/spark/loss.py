"""Kafka's failOnDataLoss for the rocketmq data source: messages a read should return but cannot (deleted
commitlog files, offsets below a queue's minimum, a damaged or missing middle commitlog file).

failOnDataLoss=true (the default): the read fails with DataLossError naming the store, the queue (or
commitlog file) and the offsets. false: they are skipped with a warning that says the same.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

HINT = ("Set option failOnDataLoss=false to skip what is lost and read the rest (a warning names each "
        "skipped range).")


class DataLossError(RuntimeError):
    """Messages a read was asked for are no longer in the store (or cannot be read)."""


def describe(offsets) -> str:
    """'5 offsets (12..16)' for a sorted sequence of integers."""
    n = len(offsets)
    if n == 0:
        return "no offset"
    lo, hi = int(offsets[0]), int(offsets[-1])
    return f"offset {lo}" if n == 1 else f"{n} offsets ({lo}..{hi})"


def data_loss(fail: bool, what: str) -> None:
    """Report lost data: raise DataLossError when fail, else log a warning; `what` says where."""
    if fail:
        raise DataLossError(f"{what}. {HINT}")
    log.warning("data loss (failOnDataLoss=false, skipped): %s", what)
