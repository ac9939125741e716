"""The save modes of `df.write.format("rocketmq")`, as Spark's Kafka sink takes them: Append, and ErrorIfExists
(Spark's default, when no mode is given) which appends; Overwrite and Ignore are refused, saying what they
would mean.

Spark refuses ErrorIfExists itself for every data source written through the DataSource V2 API, Python data
sources included (UNSUPPORTED_DATA_SOURCE_SAVE_MODE, "use either Append or Overwrite"), before the source is
asked: a Python data source cannot accept it. register(spark) therefore wraps PySpark's DataFrameWriter (the
class of the session's `df.write`, classic or Spark Connect) once per process: a `save` to the rocketmq
format in ErrorIfExists mode is sent as Append, and Overwrite / Ignore fail at once with mode_error's line.
Every other format and mode goes through untouched."""
from __future__ import annotations

import functools

from pyspark.errors import PySparkValueError

FORMAT = "rocketmq"
_APPENDS = ("append", "error", "errorifexists", "default")      # what Kafka's sink accepts (default: error)

_MEANING = {
    "overwrite": "it would delete every message of the store before writing, and a RocketMQ store only "
                 "appends (messages leave it by expiry: fileReservedTime, `rmqstore clean`)",
    "ignore": "it would write nothing when the store exists",
}


def mode_error(mode: str) -> str | None:
    """The one line refusing save mode `mode` (any case), or None when the rocketmq sink takes it."""
    m = str(mode).strip().lower()
    if m in _APPENDS:
        return None
    meaning = _MEANING.get(m, "Spark has no such mode")
    return (f"save mode {mode!r} is not allowed for the rocketmq sink: {meaning}; allowed: 'append' and "
            "'errorifexists' (Spark's default, which appends, as Kafka's sink does)")


class SaveModeError(PySparkValueError):
    """A save mode the rocketmq sink refuses (the message says what it would mean): a PySpark error, as
    Spark's own refusal of a save mode is."""

    def __init__(self, message: str):
        super().__init__(message=message)


def install(writer_cls) -> None:
    """Wrap writer_cls's format, mode and save (once) as the module docstring says."""
    if getattr(writer_cls, "_rmqstore_save_mode", False):
        return
    fmt, mode, save = writer_cls.format, writer_cls.mode, writer_cls.save

    @functools.wraps(fmt)
    def format_(self, source):
        self._rmqstore_format = source
        return fmt(self, source)

    @functools.wraps(mode)
    def mode_(self, saveMode):
        if saveMode is not None:
            self._rmqstore_mode = saveMode
        return mode(self, saveMode)

    @functools.wraps(save)
    def save_(self, path=None, format=None, mode=None, partitionBy=None, **options):
        source = format if format is not None else getattr(self, "_rmqstore_format", None)
        if isinstance(source, str) and source.strip().lower() == FORMAT:
            m = mode if mode is not None else getattr(self, "_rmqstore_mode", None) or "errorifexists"
            refused = mode_error(m)
            if refused:
                raise SaveModeError(refused)
            mode = "append"
        return save(self, path, format, mode, partitionBy, **options)

    writer_cls.format, writer_cls.mode, writer_cls.save = format_, mode_, save_
    writer_cls._rmqstore_save_mode = True


def install_for(spark) -> None:
    """install() on the DataFrameWriter class of this session (classic PySpark or Spark Connect)."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect.readwriter import DataFrameWriter
    else:
        from pyspark.sql.readwriter import DataFrameWriter
    install(DataFrameWriter)
