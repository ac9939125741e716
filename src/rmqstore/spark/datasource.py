"""The `rocketmq` Python data source: spark.read / readStream / write .format("rocketmq").

    from rmqstore.spark import register
    register(spark)
    df = spark.read.format("rocketmq").option("config", "store.conf").load("/data/broker-a/store")

Reading never takes the store's lock and never writes (see storeview). Options: see options.py and the
package docstring.
"""
from __future__ import annotations

import datetime as _dt
import logging

from pyspark.sql.datasource import (DataSource, DataSourceReader, EqualNullSafe, EqualTo, GreaterThan,
                                    GreaterThanOrEqual, In, InputPartition, IsNotNull, LessThan, LessThanOrEqual,
                                    Not)

from . import options as O
from .records import COLUMNS, NEVER_NULL, ms_from_datetime, spark_ddl
from .scan import NUMERIC, STRINGS, TIMESTAMPS, Cond, read_partition

log = logging.getLogger(__name__)

_OPS = {EqualTo: "eq", EqualNullSafe: "eq", GreaterThan: "gt", GreaterThanOrEqual: "ge", LessThan: "lt",
        LessThanOrEqual: "le", In: "in"}


def _value(col: str, v):
    """A filter value for col in the rows' units, or raise ValueError (the filter is not pushed)."""
    if v is None:
        raise ValueError("null")
    if col in TIMESTAMPS:
        if isinstance(v, (_dt.datetime, _dt.date)):
            return int(round(ms_from_datetime(v) * 1000))    # microseconds, exact for datetimes
        raise ValueError("not a timestamp")
    if col in NUMERIC:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("not a number")
        return v
    if col in STRINGS:
        if not isinstance(v, str):
            raise ValueError("not a string")
        return v
    raise ValueError("column not pushed")


def to_cond(f) -> Cond | None | bool:
    """A pushed Spark filter as a Cond; True for a filter that always holds here (IsNotNull on a column
    that is never null); None when it is not handled."""
    if isinstance(f, Not):
        inner = to_cond(f.child) if isinstance(f.child, (EqualTo, In)) else None
        if not isinstance(inner, Cond):
            return None
        return Cond(inner.col, "ne" if inner.op == "eq" else "nin", inner.value)
    attr = getattr(f, "attribute", None)
    if not attr or len(attr) != 1 or attr[0] not in COLUMNS:
        return None
    col = attr[0]
    if isinstance(f, IsNotNull):
        return True if col in NEVER_NULL else None
    op = _OPS.get(type(f))
    if op is None:
        return None
    if col in STRINGS and op not in ("eq", "in"):
        return None
    try:
        if op == "in":
            vals = tuple(_value(col, v) for v in f.value)
            return Cond(col, "in", frozenset(vals) if col in STRINGS else vals)
        return Cond(col, op, _value(col, f.value))
    except (ValueError, TypeError):
        return None


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
        # Only a reader that asks for pushed filters has pushFilters: PySpark refuses a reader that has it
        # when spark.sql.python.filterPushdown.enabled is false (DATA_SOURCE_PUSHDOWN_DISABLED), and the
        # default reader must work in any session.
        return RocketMQPushdownReader(ro) if ro.push_filters else RocketMQReader(ro)

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
    """The default reader: claims no filter (Spark applies them all), so the read it plans is the same for
    every query of a DataFrame. PySpark 4.x keeps the read planned for one query on the DataFrame's relation
    and reuses it for a later query of the same DataFrame that has no filter (PythonDataSourceV2.readInfo):
    a read that depends on the query's filters would then return wrong rows. Prune with the options
    (topics, queueIds, startingOffsets, ...: they belong to the relation)."""

    def __init__(self, ro: O.ReadOptions):
        self.ro = ro
        self.conds: list[Cond] = []

    def partitions(self):
        from .plan import plan_batch
        from .storeview import StoreError
        try:
            return plan_batch(self.ro, list(self.conds))
        except StoreError as e:
            raise O.OptionError(str(e)) from None

    def read(self, partition):
        yield from read_partition(partition)


class RocketMQPushdownReader(RocketMQReader):
    """option pushFilters=true: claims the filters it can use (see to_cond) and prunes queues, files and
    offset ranges with them. Needs spark.sql.python.filterPushdown.enabled=true, and a DataFrame read this
    way must not be reused for a query without filters (see RocketMQReader)."""

    def pushFilters(self, filters):
        self.conds = []
        for f in filters:
            c = to_cond(f)
            if c is None:
                yield f
            elif c is not True:
                self.conds.append(c)


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
