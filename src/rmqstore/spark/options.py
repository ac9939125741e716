"""The `rocketmq` data source's options: parsed and checked when the DataFrame is created, so that a bad
option fails at planning with a message naming it."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..store.conf.config import StoreConfig
from ..errors import ConfigError
from . import storeview as SV
from .records import COLUMNS, ms_from_datetime

KNOWN = {
    "path", "paths", "topics", "subscribepattern", "queueids", "startingoffsets", "endingoffsets",
    "startingtimestamp", "endingtimestamp", "includebody", "config", "mode", "key", "maxoffsetspertrigger",
    "rowsperpartition", "pushfilters", "startingoffsetsbytimestamp", "endingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy", "failondataloss", "minpartitions", "minoffsetspertrigger",
    "maxtriggerdelay", "view", "checkcrc", "columns", "messageselector", "subscribe", "assign",
}
# Names as the user spells them (options arrive lower-cased).
SPELLING = {k.lower(): k for k in (
    "path", "paths", "topics", "subscribePattern", "queueIds", "startingOffsets", "endingOffsets",
    "startingTimestamp", "endingTimestamp", "includeBody", "config", "mode", "key", "maxOffsetsPerTrigger",
    "rowsPerPartition", "pushFilters", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "failOnDataLoss", "minPartitions", "minOffsetsPerTrigger",
    "maxTriggerDelay", "view", "checkCRC", "columns", "messageSelector", "subscribe", "assign")}
# Spark's Kafka source options that mean nothing here: what to use instead (kafka.* : KAFKA_SETTINGS).
KAFKA_ONLY = {
    "includeheaders": "the properties column always holds the messages' properties (Kafka's headers)",
    "maxrecordsperpartition": "option 'rowsPerPartition' caps the rows of a partition",
    "groupidprefix": "a store is read directly, with no consumer group",
}
KAFKA_SETTINGS = ("a store is read from its files, not from a broker: no kafka.* settings (the store's "
                  "broker.conf is option 'config')")
SELECTIONS = ("topics", "subscribe", "subscribePattern", "assign")     # Kafka's strategies (topics = subscribe)


class OptionError(ValueError):
    """A bad option of the rocketmq data source (the message names it)."""


PUSH_FILTERS_REMOVED = (
    "option pushFilters=true was removed: it returned wrong rows. PySpark 4.3 keeps the read planned with one "
    "query's pushed filters on the DataFrame (PythonScanBuilder.pushFilters -> PythonDataSourceV2.setReadInfo) "
    "and reuses it for the DataFrame's next query without filters, so df.filter(\"topic='T1'\").count() then "
    "df.count() counted topic T1 only, and a data source cannot tell the two queries apart. Leave it out: "
    "Spark applies every filter itself (any DataFrame can be reused), and the options topics, queueIds, "
    "startingOffsets / endingOffsets and startingTimestamp / endingTimestamp prune the read")


def _opt(name: str) -> str:
    return SPELLING.get(name, name)


@dataclass
class ReadOptions:
    paths: list[str]
    brokers: list[str]
    config: StoreConfig | None          # None: not given, the store's files tell its geometry
    mode: str = "queue"
    topics: set[str] | None = None
    pattern: re.Pattern | None = None
    queue_ids: set[int] | None = None
    assign: dict[str, frozenset[int]] | None = None     # option assign: {topic: queue ids} (topics: its keys)
    starting: object = None          # "earliest" | "latest" | {broker|None: {topic: {qid: offset}}}
    ending: object = None
    starting_ts: int | None = None
    ending_ts: int | None = None
    starting_by_ts: dict | None = None    # {broker|None: {topic: {qid: epoch ms}}}
    ending_by_ts: dict | None = None
    ts_strategy: str = "error"            # startingOffsetsByTimestampStrategy: error | latest
    fail_on_data_loss: bool = True
    loss_counter: object = None       # not an option: the session's skipped-data accumulator (loss.py)
    parallelism: int | None = None    # not an option: the session's default parallelism (plan.partition_rows)
    min_partitions: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    view: str | None = None               # "queues": one row per queue (metadata), no message is read
    check_crc: bool = True                # checkCRC: bodies returned are checked against BODYCRC (as Kafka check.crcs)
    include_body: bool = True
    columns: tuple | None = None          # columns: the only columns read and decoded (None: every column)
    key: str | None = None
    max_offsets_per_trigger: int | None = None
    rows_per_partition: int = 200_000
    selector: str | None = None           # messageSelector: an SQL92 selector (rmqstore.filter) rows must match
    config_path: str | None = None
    raw: dict = field(default_factory=dict)

    def topic_selected(self, topic: str) -> bool:
        if self.topics is not None:
            return topic in self.topics
        if self.pattern is not None:
            return self.pattern.fullmatch(topic) is not None
        return True

    def queue_selected(self, topic: str, qid: int) -> bool:
        if self.assign is not None:
            return qid in self.assign.get(topic, ())
        return self.topic_selected(topic) and (self.queue_ids is None or qid in self.queue_ids)


def _bool(name: str, v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise OptionError(f"option {_opt(name)!r} must be true or false, got {v!r}")


def _int(name: str, v: str, minimum: int | None = None) -> int:
    try:
        n = int(str(v).strip())
    except ValueError:
        raise OptionError(f"option {_opt(name)!r} must be an integer, got {v!r}") from None
    if minimum is not None and n < minimum:
        raise OptionError(f"option {_opt(name)!r} must be at least {minimum}, got {n}")
    return n


def _timestamp(name: str, v: str) -> int:
    """Epoch milliseconds, or an ISO-8601 date-time (UTC unless it says otherwise)."""
    s = str(v).strip()
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    import datetime as dt
    try:
        d = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(f"option {_opt(name)!r} must be epoch milliseconds or an ISO-8601 time, got {v!r}") from None
    return int(ms_from_datetime(d) // 1)


_UNITS_MS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(name: str, v: str) -> int:
    """Spark's time strings: 100ms, 30s, 5m, 1h, 1d (a bare number is seconds, as Spark reads it)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", str(v).lower())
    if not m or m.group(2) not in ("", *_UNITS_MS):
        raise OptionError(f"option {_opt(name)!r} must be a duration like 30s, 5m or 100ms, got {v!r}")
    return int(m.group(1)) * _UNITS_MS.get(m.group(2) or "s", 1000)


def parse_offsets(name: str, v: str, brokers: list[str], *, timestamps: bool = False):
    """Kafka's spelling: earliest, latest, or JSON {"topic": {"0": 23}} (-2 earliest, -1 latest), also
    {"broker": {"topic": {"0": 23}}} for one of several stores. Returns "earliest", "latest" or
    {broker or None: {topic: {qid: offset}}}."""
    s = str(v).strip()
    if s.lower() in ("earliest", "latest") and not timestamps:
        return s.lower()
    try:
        got = json.loads(s)
    except ValueError as e:
        raise OptionError(f"option {_opt(name)!r} is not earliest, latest or JSON like "
                          f"{{\"topic\": {{\"0\": 23}}}}: {e} in {s!r}") from None
    if not isinstance(got, dict) or not got:
        raise OptionError(f"option {_opt(name)!r} must be a JSON object {{\"topic\": {{\"0\": 23}}}}, got {s!r}")

    def queue_map(where: str, m) -> dict[int, int]:
        if not isinstance(m, dict):
            raise OptionError(f"option {_opt(name)!r}: {where} must map queue ids to offsets, got {m!r}")
        out = {}
        for q, off in m.items():
            if not str(q).lstrip("-").isdigit() or not isinstance(off, int) or isinstance(off, bool) or \
                    off < (0 if timestamps else -2):
                raise OptionError(f"option {_opt(name)!r}: {where}: queue {q!r} -> {off!r} is not " + (
                    "queueId -> epoch milliseconds" if timestamps else
                    "queueId -> offset (an integer, -2 earliest, -1 latest)"))
            out[int(q)] = off
        return out
    depth3 = all(isinstance(x, dict) and x and all(isinstance(y, dict) for y in x.values()) for x in got.values())
    if depth3:
        unknown = [b for b in got if b not in brokers]
        if unknown:
            raise OptionError(f"option {_opt(name)!r}: unknown broker {unknown[0]!r} (brokers: {brokers})")
        return {b: {t: queue_map(f"{b}/{t}", m) for t, m in tm.items()} for b, tm in got.items()}
    return {None: {t: queue_map(f"topic {t!r}", m) for t, m in got.items()}}


def offsets_topics(spec) -> set[str]:
    if not isinstance(spec, dict):
        return set()
    return {t for tm in spec.values() for t in tm}


def parse(options: dict, *, streaming: bool = False) -> ReadOptions:
    """The data source's options, checked: a ReadOptions, or an OptionError naming the option."""
    opts = {str(k).lower(): v for k, v in dict(options).items()}
    unknown = sorted(set(opts) - KNOWN)
    if unknown:
        raise OptionError(_unknown(unknown[0]))
    ro = _parse_stores(opts)
    mode = str(opts.get("mode", "queue")).strip().lower()
    if mode not in ("queue", "commitlog"):
        raise OptionError(f"option 'mode' must be queue or commitlog, got {opts['mode']!r}")
    ro.mode = mode
    queues: dict[str, set[int]] = {}
    have_cq = True
    for p in ro.paths:
        for t, qids in SV.list_topics(p).items():
            queues.setdefault(t, set()).update(qids)
        if not SV.has_consume_queues(p):
            have_cq = False
    all_topics = set(queues)
    _parse_selection(ro, opts, queues, have_cq)
    _parse_range(ro, opts, all_topics, have_cq, streaming)
    _parse_kafka_extras(ro, opts, ro.brokers, all_topics, have_cq, streaming)
    _parse_switches(ro, opts)
    _check_mode(ro, opts, streaming)
    return ro


def _unknown(name: str) -> str:
    """The line for an unknown option: what to use instead of a Kafka one, else its near match."""
    import difflib
    if name in KAFKA_ONLY or name.startswith("kafka."):
        return f"option {name!r} of Spark's Kafka source has no meaning here: {KAFKA_ONLY.get(name, KAFKA_SETTINGS)}"
    near = difflib.get_close_matches(name, list(SPELLING), n=1, cutoff=0.6)
    hint = f"did you mean {SPELLING[near[0]]!r}?" if near else f"known: {', '.join(sorted(SPELLING.values()))}"
    return f"unknown option {name!r} of the rocketmq data source ({hint})"


def _parse_stores(opts: dict) -> ReadOptions:
    """path / paths (each a store, broker names distinct) and config."""
    try:
        paths = SV.resolve_paths(opts.get("path"), opts.get("paths"))
    except SV.StoreError as e:
        raise OptionError(str(e)) from None
    brokers = [SV.broker_name(p) for p in paths]
    dup = {b for b in brokers if brokers.count(b) > 1}
    if dup:
        raise OptionError(f"option 'path': two stores have the broker name {sorted(dup)[0]!r} (the broker column "
                          "is the store directory's name, or its parent's when it is called store)")
    config_path = opts.get("config")
    try:
        config = StoreConfig.load(config_path, reading=True) if config_path else None    # a read: geometry
    except (ConfigError, OSError) as e:
        raise OptionError(f"option 'config': {e}") from None
    return ReadOptions(paths, brokers, config, config_path=config_path, raw=opts)


def _parse_selection(ro: ReadOptions, opts: dict, queues: dict[str, set[int]], have_cq: bool) -> None:
    """topics (or Kafka's subscribe) / subscribePattern / assign, and queueIds: which queues are read. As
    Kafka's, one of the first four at most (none: every topic)."""
    given = [n for n in SELECTIONS if n.lower() in opts]
    if len(given) > 1:
        raise OptionError(f"options {given[0]!r} and {given[1]!r} exclude each other: give one of "
                          f"{', '.join(SELECTIONS)} ('topics' and 'subscribe' are the same option)")
    for name in ("topics", "subscribe"):
        if name in opts:
            ts = [t.strip() for t in str(opts[name]).split(",") if t.strip()]
            if not ts:
                raise OptionError(f"option {name!r} names no topic: {opts[name]!r}")
            _known_topics(name, ts, queues, have_cq)
            ro.topics = set(ts)
    if "subscribepattern" in opts:
        if not str(opts["subscribepattern"]).strip():
            raise OptionError("option 'subscribePattern' is empty: give a regular expression of topic names")
        try:
            ro.pattern = re.compile(str(opts["subscribepattern"]).strip())
        except re.error as e:
            raise OptionError(f"option 'subscribePattern' is not a regular expression: {e}") from None
    if "assign" in opts:
        if "queueids" in opts:
            raise OptionError("option 'queueIds' selects queues of every topic: with 'assign', name each "
                              "topic's queues there")
        ro.assign = _parse_assign(opts["assign"], queues, have_cq)
        ro.topics = set(ro.assign)
    if "queueids" in opts:
        try:
            ro.queue_ids = {int(x) for x in str(opts["queueids"]).split(",") if x.strip()}
        except ValueError:
            raise OptionError(f"option 'queueIds' must be a comma list of integers, got {opts['queueids']!r}") from None


def _known_topics(name: str, topics, queues: dict[str, set[int]], have_cq: bool) -> None:
    missing = [t for t in topics if t not in queues]
    if missing and have_cq:
        raise OptionError(f"option {name!r}: unknown topic {missing[0]!r} (the store has "
                          f"{', '.join(sorted(queues)) or 'no topic'})")


def _parse_assign(v, queues: dict[str, set[int]], have_cq: bool) -> dict[str, frozenset[int]]:
    """Kafka's option assign, {"topicA": [0, 1], "topicB": [2]}: topics and their queue ids, each queue in
    a store (with several stores: in one of them at least)."""
    example = '{"topicA": [0, 1], "topicB": [2]}'
    try:
        got = json.loads(str(v))
    except ValueError:
        got = None
    if not isinstance(got, dict) or not got or not all(
            isinstance(qs, list) and qs and all(isinstance(q, int) and not isinstance(q, bool) and q >= 0
                                                for q in qs) for qs in got.values()):
        raise OptionError(f"option 'assign' must be JSON like {example} (topics and their queue ids), got {v!r}")
    _known_topics("assign", list(got), queues, have_cq)
    for t, qs in got.items():
        absent = sorted(set(qs) - queues.get(t, set(qs)))
        if absent and have_cq:
            raise OptionError(f"option 'assign': the store has no queue {t}/{absent[0]} (queues of {t}: "
                              f"{sorted(queues[t])})")
    return {t: frozenset(qs) for t, qs in got.items()}


def _parse_range(ro: ReadOptions, opts: dict, all_topics: set[str], have_cq: bool, streaming: bool) -> None:
    """startingOffsets / endingOffsets and startingTimestamp / endingTimestamp."""
    for name, attr in (("startingoffsets", "starting"), ("endingoffsets", "ending")):
        if name in opts:
            spec = parse_offsets(name, opts[name], ro.brokers)
            missing = [t for t in offsets_topics(spec) if t not in all_topics]
            if missing and have_cq:
                raise OptionError(f"option {_opt(name)!r}: unknown topic {missing[0]!r}")
            setattr(ro, attr, spec)
    if ro.ending == "earliest":
        raise OptionError("option 'endingOffsets' cannot be earliest")
    if streaming and "endingoffsets" in opts:
        raise OptionError("option 'endingOffsets' is for batch reads only (a stream has no end)")
    for name, attr in (("startingtimestamp", "starting_ts"), ("endingtimestamp", "ending_ts")):
        if name in opts:
            setattr(ro, attr, _timestamp(name, opts[name]))
    if ro.starting_ts is not None and "startingoffsets" in opts:
        raise OptionError("options 'startingTimestamp' and 'startingOffsets' exclude each other: give one")
    if ro.ending_ts is not None and "endingoffsets" in opts:
        raise OptionError("options 'endingTimestamp' and 'endingOffsets' exclude each other: give one")


def _parse_columns(v) -> tuple:
    """Option columns: comma-separated column names (any case), in the rows' column order."""
    by_lower = {c.lower(): c for c in COLUMNS}
    names = [w.strip() for w in str(v).split(",") if w.strip()]
    if not names:
        raise OptionError("option 'columns' is empty: give column names, comma-separated "
                          f"(of {', '.join(COLUMNS)})")
    for w in names:
        if w.lower() not in by_lower:
            raise OptionError(f"option 'columns': no column {w!r} (columns: {', '.join(COLUMNS)})")
    want = {by_lower[w.lower()] for w in names}
    return tuple(c for c in COLUMNS if c in want)


def _parse_switches(ro: ReadOptions, opts: dict) -> None:
    """includeBody, columns, key, maxOffsetsPerTrigger, pushFilters, rowsPerPartition, messageSelector."""
    if "includebody" in opts:
        ro.include_body = _bool("includebody", opts["includebody"])
    if "columns" in opts:
        ro.columns = _parse_columns(opts["columns"])
        ro.include_body = ro.include_body and "body" in ro.columns
    if "key" in opts:
        ro.key = str(opts["key"])
        if not ro.key:
            raise OptionError("option 'key' is empty")
    if "maxoffsetspertrigger" in opts:
        ro.max_offsets_per_trigger = _int("maxoffsetspertrigger", opts["maxoffsetspertrigger"], 1)
    if "pushfilters" in opts and _bool("pushfilters", opts["pushfilters"]):
        raise OptionError(PUSH_FILTERS_REMOVED)
    if "rowsperpartition" in opts:
        ro.rows_per_partition = _int("rowsperpartition", opts["rowsperpartition"], 1)
    if "messageselector" in opts:
        ro.selector = parse_selector(opts["messageselector"])


def parse_selector(v) -> str:
    """Option messageSelector: an SQL92 selector, compiled now (RocketMQ's refusal names the option)."""
    from ..filter import SelectorError, compile_sql92
    text = str(v)
    try:
        compile_sql92(text)
    except SelectorError as e:
        raise OptionError(f"option 'messageSelector' is not a selector RocketMQ accepts: {e.remark}") from None
    return text


def _check_mode(ro: ReadOptions, opts: dict, streaming: bool) -> None:
    """What mode=commitlog and a stream exclude."""
    if ro.mode == "commitlog":
        for name in ("startingoffsets", "endingoffsets", "startingtimestamp", "endingtimestamp"):
            if name in opts:
                raise OptionError(f"option {_opt(name)!r} is for mode=queue (queue offsets); in mode=commitlog "
                                  "filter on commitLogOffset or storeTimestamp")
        if streaming:
            raise OptionError("option 'mode': streams read mode=queue (offsets per topic and queue)")
    if ro.key is not None and streaming:
        raise OptionError("option 'key' is for batch reads only")


def _parse_kafka_extras(ro: ReadOptions, opts: dict, brokers: list[str], all_topics: set[str], have_cq: bool,
                        streaming: bool) -> None:
    """The Kafka source's options beyond offsets: by-timestamp offsets, failOnDataLoss, partitions and
    trigger limits, and the metadata view."""
    for name, attr in (("startingoffsetsbytimestamp", "starting_by_ts"), ("endingoffsetsbytimestamp", "ending_by_ts")):
        if name in opts:
            spec = parse_offsets(name, opts[name], brokers, timestamps=True)
            missing = [t for t in offsets_topics(spec) if t not in all_topics]
            if missing and have_cq:
                raise OptionError(f"option {_opt(name)!r}: unknown topic {missing[0]!r}")
            setattr(ro, attr, spec)
    if ro.starting_by_ts is not None and ("startingoffsets" in opts or "startingtimestamp" in opts):
        raise OptionError("option 'startingOffsetsByTimestamp' excludes 'startingOffsets' and 'startingTimestamp': "
                          "give one")
    if ro.ending_by_ts is not None and ("endingoffsets" in opts or "endingtimestamp" in opts):
        raise OptionError("option 'endingOffsetsByTimestamp' excludes 'endingOffsets' and 'endingTimestamp': give one")
    if streaming and ("endingtimestamp" in opts or "endingoffsetsbytimestamp" in opts):
        raise OptionError("options 'endingTimestamp' and 'endingOffsetsByTimestamp' are for batch reads only "
                          "(a stream has no end)")
    if "startingoffsetsbytimestampstrategy" in opts:
        v = str(opts["startingoffsetsbytimestampstrategy"]).strip().lower()
        if v not in ("error", "latest"):
            raise OptionError(f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got {v!r}")
        ro.ts_strategy = v
    if "failondataloss" in opts:
        ro.fail_on_data_loss = _bool("failondataloss", opts["failondataloss"])
    if "minpartitions" in opts:
        ro.min_partitions = _int("minpartitions", opts["minpartitions"], 1)
    if "minoffsetspertrigger" in opts:
        ro.min_offsets_per_trigger = _int("minoffsetspertrigger", opts["minoffsetspertrigger"], 1)
    if "maxtriggerdelay" in opts:
        ro.max_trigger_delay_ms = _duration_ms("maxtriggerdelay", opts["maxtriggerdelay"])
    if "checkcrc" in opts:
        ro.check_crc = _bool("checkcrc", opts["checkcrc"])
    if "view" in opts:
        v = str(opts["view"]).strip().lower()
        if v != "queues":
            raise OptionError(f"option 'view' must be queues (one row per consume queue), got {opts['view']!r}")
        if streaming:
            raise OptionError("option 'view' is for batch reads only")
        if "columns" in opts:
            raise OptionError("option 'columns' selects message columns: it does not apply to view=queues")
        ro.view = v
