"""The `rocketmq` Python data source: spark.read / readStream / write .format("rocketmq").

    from rmqstore.spark import register
    register(spark)
    df = spark.read.format("rocketmq").option("config", "store.conf").load("/data/broker-a/store")

Reading never takes the store's lock and never writes (see storeview). Options: see options.py and the
package docstring.
"""
from __future__ import annotations

import logging

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from . import options as O
from .records import COLUMNS, spark_ddl
from .scan import read_partition

log = logging.getLogger(__name__)


def _check_user_schema(ro: O.ReadOptions, schema) -> None:
    """A schema given with .schema(...) must name the source's own columns, in order: rows are not converted
    to another schema, and Spark would refuse them only when a task returns them
    (DATA_SOURCE_RETURN_SCHEMA_MISMATCH)."""
    names = [f.name for f in getattr(schema, "fields", ())]
    want = [n for n in COLUMNS if ro.columns is None or n in ro.columns]
    if schema is not None and names != want:
        raise O.OptionError(f"a schema given with .schema() ({', '.join(names)}) is not the rocketmq source's "
                            f"({', '.join(want)}): leave .schema() out; to read fewer columns, option 'columns'")


class RocketMQDataSource(DataSource):
    """Messages of RocketMQ store directories (see the package docstring for the options). register(spark)
    registers a subclass of it whose loss_counter is the session's skipped-data accumulator (loss.py)."""
    loss_counter = None
    parallelism = None

    def _options(self) -> O.ReadOptions:
        ro = O.parse(self.options)
        ro.loss_counter, ro.parallelism = self.loss_counter, self.parallelism
        return ro

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> str:
        ro = O.parse(self.options)     # bad options fail here, when the DataFrame is created
        if ro.view == "queues":
            from .metadata import QUEUES_DDL
            return QUEUES_DDL
        return spark_ddl(ro.columns)

    def reader(self, schema) -> "RocketMQReader":
        ro = self._options()
        if ro.view == "queues":
            return QueuesReader(ro)
        _check_user_schema(ro, schema)
        return RocketMQReader(ro)

    def streamReader(self, schema):
        from .stream import RocketMQStreamReader
        _check_user_schema(O.parse(self.options), schema)
        return RocketMQStreamReader(self.options, self.loss_counter, self.parallelism)

    def writer(self, schema, overwrite: bool):
        from .writer import RocketMQWriter
        return RocketMQWriter(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from .sink import RocketMQStreamWriter
        return RocketMQStreamWriter(self.options, schema, overwrite)


class RocketMQReader(DataSourceReader):
    """The reader: claims no filter (it has no pushFilters: Spark applies every filter itself), so the read
    it plans is the same for every query of a DataFrame. PySpark 4.3 keeps the read planned for one query on
    the DataFrame's relation and reuses it for a later query of the same DataFrame that has no filter
    (PythonDataSourceV2.readInfo): a read that depended on the query's filters returned wrong rows, and the
    option that made it (pushFilters) is refused (options.PUSH_FILTERS_REMOVED). Prune with the options
    (topics, queueIds, startingOffsets, ...: they belong to the relation)."""

    def __init__(self, ro: O.ReadOptions):
        self.ro = ro

    def partitions(self):
        from .plan import plan_batch
        from .storeview import StoreError
        try:
            return plan_batch(self.ro, [])
        except StoreError as e:
            raise O.OptionError(str(e)) from None

    def read(self, partition):
        yield from read_partition(partition)


class QueuesPartition(InputPartition):
    """option view=queues: the rows, computed when the read is planned (no message is read)."""


class QueuesReader(DataSourceReader):
    def __init__(self, ro: O.ReadOptions):
        self.ro = ro

    def partitions(self):
        from .metadata import queue_rows
        from .storeview import StoreError
        try:
            return [QueuesPartition(queue_rows(self.ro))]
        except StoreError as e:
            raise O.OptionError(str(e)) from None

    def read(self, partition):
        yield from (partition.value or [])
