"""df.writeStream.format("rocketmq").option("checkpointLocation", C).start(STORE): a streaming sink with
exactly-once across restarts.

Tasks encode their rows as the batch writer's do (writer.encode_task); commit(messages, batchId) on the
driver appends the micro-batch as one two-phase transaction (transaction.py) that records, at its commit
point, the batch id for this sink in the store (`config/sparkTransaction.json`, "sinks"). A batch Spark
replays after a restart (its id is not above the recorded one) is skipped: each micro-batch is appended
exactly once. The sink's id is the option sinkId, else the query's checkpointLocation (its absolute path):
two queries writing to one store need different checkpoints (as they do anyway).
"""
from __future__ import annotations

import logging
import os

from pyspark.sql.datasource import DataSourceStreamArrowWriter

from .writer import WriteError, append_encoded, check_schema, check_target, encode_task

log = logging.getLogger(__name__)

KNOWN = ("path", "config", "sinkid", "checkpointlocation")


def sink_id(options: dict) -> str:
    opts = {k.lower(): v for k, v in options.items()}
    if opts.get("sinkid"):
        return str(opts["sinkid"])
    if opts.get("checkpointlocation"):
        loc = str(opts["checkpointlocation"])
        return "checkpoint:" + (loc if "://" in loc else os.path.abspath(loc))
    raise WriteError("the rocketmq streaming sink needs option 'checkpointLocation' (or 'sinkId'): the store "
                     "records the last batch id committed per sink")


class RocketMQStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict, schema, overwrite: bool):
        self.options = dict(options)
        self.path, self.config = check_target(self.options, overwrite, KNOWN)
        self.sink = sink_id(self.options)
        check_schema(schema)

    def write(self, iterator):
        return encode_task(iterator, self.config.max_message_size)

    def commit(self, messages, batchId) -> None:
        msgs = sorted((m for m in messages if m is not None), key=lambda m: m.partition)
        append_encoded(self.path, self.config, msgs, sink=(self.sink, int(batchId)))

    def abort(self, messages, batchId) -> None:
        log.warning("%s: micro-batch %s aborted: nothing was appended", self.path, batchId)
