"""Kafka's failOnDataLoss for the rocketmq data source: messages a read should return but cannot (deleted
commitlog files, offsets below a queue's minimum, a damaged or missing middle commitlog file, consume queue
units past the commitlog's data, a record whose PHYSICALOFFSET field is not where it lies).

failOnDataLoss=true (the default): the read fails with DataLossError naming the store, the queue (or
commitlog file) and the offsets. false: they are skipped with a warning that says the same, and counted in
the session's metric: rmqstore.spark.skipped_data(spark) -> {"ranges": skipped ranges, "messages": the
messages among them whose number is known (queue offsets, records; missing commitlog files: the messages of
the read's queues that a local store's consume queues place there; a cut middle commitlog file counts as a
range only)}, summed over every read and stream of the session since register(spark) (a Spark
accumulator: executors add to it, the driver reads it).
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


def data_loss(fail: bool, what: str, messages: int = 0, counter=None) -> None:
    """Report lost data: raise DataLossError when fail, else log a warning and count one skipped range of
    `messages` messages (0: not known) in counter (the session's accumulator, None outside a session);
    `what` says where."""
    if fail:
        raise DataLossError(f"{what}. {HINT}")
    log.warning("data loss (failOnDataLoss=false, skipped): %s", what)
    if counter is not None:
        counter.add((1, max(int(messages), 0)))


class SkippedParam:
    """The accumulator's (ranges, messages) pairs, summed (pyspark AccumulatorParam's protocol)."""

    def zero(self, value):
        return (0, 0)

    def addInPlace(self, a, b):
        return (a[0] + b[0], a[1] + b[1])


_COUNTERS: dict = {}      # id(SparkContext) -> (SparkContext, its accumulator)


def session_counter(spark):
    """The skipped-data accumulator of spark's SparkContext (made on first use)."""
    sc = spark.sparkContext
    got = _COUNTERS.get(id(sc))
    if got is None or got[0] is not sc:
        got = _COUNTERS[id(sc)] = (sc, sc.accumulator((0, 0), SkippedParam()))
    return got[1]


def skipped_data(spark) -> dict:
    """What reads and streams of this session skipped with failOnDataLoss=false (module docstring)."""
    ranges, messages = session_counter(spark).value
    return {"ranges": ranges, "messages": messages}
