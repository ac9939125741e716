"""StoreConfig: RocketMQ's MessageStoreConfig (and the broker keys rmqstore uses), with its names.

Attributes are snake_case; files and dicts use RocketMQ's camelCase names (`mappedFileSizeCommitLog`),
and RocketMQ 4.x's misspelling `maped...` is accepted too. A broker.conf-style properties file loads
with `StoreConfig.load(path)`. Every key is checked against the registry in config_keys.py: honoured, tuning
(accepted, named in one warning: no effect here), accepted only at its default (a feature rmqstore does not
have: useTLS=true is refused), or unknown (refused); bad values raise ConfigError naming the key.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError

log = logging.getLogger(__name__)

ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(enum.Enum):
    """RocketMQ's BrokerRole: what a store does with puts and with the HA link (store/ha)."""
    ASYNC_MASTER = "ASYNC_MASTER"     # takes puts, answers at once, replicates behind
    SYNC_MASTER = "SYNC_MASTER"       # takes puts, answers once a slave has acknowledged their bytes
    SLAVE = "SLAVE"                   # refuses puts; appends what its master streams


@dataclass
class StoreConfig:
    # geometry
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300000 * 20
    max_hash_slot_num: int = 5000000
    max_index_num: int = 5000000 * 4
    max_message_size: int = 1024 * 1024 * 4
    max_msgs_num_batch: int = 64
    message_index_enable: bool = True
    message_index_safe: bool = False
    # flush and commit
    flush_disk_type: str = ASYNC_FLUSH
    sync_flush_timeout: int = 1000 * 5
    flush_interval_commit_log: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 1000 * 10
    flush_commit_log_timed: bool = False
    commit_interval_commit_log: int = 200
    commit_commit_log_least_pages: int = 4
    commit_commit_log_thorough_interval: int = 200
    flush_interval_consume_queue: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 1000 * 60
    transient_store_pool_enable: bool = False
    transient_store_pool_size: int = 5
    check_crc_on_recover: bool = True
    # cleanup
    file_reserved_time: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    clean_file_forcibly_enable: bool = True
    clean_resource_interval: int = 10000
    delete_commit_log_files_interval: int = 100
    delete_consume_queue_files_interval: int = 100
    destroy_mapped_file_interval_forcibly: int = 1000 * 120
    redelete_hanged_file_interval: int = 1000 * 120
    # reading
    max_transfer_bytes_on_message_in_memory: int = 1024 * 256
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 1024 * 64
    max_transfer_count_on_message_in_disk: int = 8
    access_message_in_memory_max_ratio: int = 40
    default_query_max_num: int = 32
    # schedule
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    flush_delay_offset_interval: int = 1000 * 10
    # timer messages (RocketMQ 5's MessageStoreConfig; store/timer/timer_service.py)
    timer_precision_ms: int = 1000
    timer_max_delay_sec: int = 3600 * 24 * 3
    timer_roll_window_slot: int = 3600 * 24 * 2
    mapped_file_size_timer_log: int = 100 * 1024 * 1024
    # the consume queue extension and SQL92 filtering (store/consumequeue/consume_queue_ext.py, rmqstore.filter)
    enable_consume_queue_ext: bool = False
    mapped_file_size_consume_queue_ext: int = 48 * 1024 * 1024
    bit_map_length_consume_queue_ext: int = 64      # bits; the broker sets it from its bloom filter, as RocketMQ
    enable_property_filter: bool = False
    enable_calc_filter_bit_map: bool = False
    expect_consumer_num_use_filter: int = 32
    max_error_rate_of_bloom_filter: int = 20
    # broker keys rmqstore uses
    broker_name: str = "broker-a"
    broker_cluster_name: str = "DefaultCluster"
    broker_id: int = 0
    broker_ip1: str = "127.0.0.1"
    listen_port: int = 10911
    namesrv_addr: str = "127.0.0.1:9876"
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 8
    long_polling_enable: bool = True
    short_polling_time_mills: int = 1000
    broker_role: str = ""                         # "": not set, an ASYNC_MASTER (see `role`)
    # replication (store/ha; RocketMQ's MessageStoreConfig and BrokerConfig names)
    broker_ip2: str = ""                          # host of the haServerAddr registered (default: brokerIP1)
    ha_listen_port: int = 0                       # 0: 10912 for a SYNC_MASTER, none else (ha.listen_port);
                                                  # `rmqstore serve`: listenPort + 1, as RocketMQ's broker
    ha_master_address: str = ""                   # a slave's master (host:haPort); else the name server's answer
    ha_send_heartbeat_interval: int = 5000
    ha_housekeeping_interval: int = 20000
    ha_transfer_batch_size: int = 32768
    ha_slave_fallbehind_max: int = 256 * 1024 * 1024
    slave_read_enable: bool = False
    offset_check_in_slave: bool = False
    store_path_root_dir: str = ""
    # the other broker.conf keys the registry accepts (config_keys.py), by their RocketMQ name; the broker reads
    # its own from here (grpcListenPort, transactionTimeOut, ...)
    extra: dict[str, str] = field(default_factory=dict, repr=False)

    # --- names -----------------------------------------------------------------------------------
    @staticmethod
    def java_name(attr: str) -> str:
        if attr in _JAVA_NAMES:
            return _JAVA_NAMES[attr]
        head, *rest = attr.split("_")
        return head + "".join(w[:1].upper() + w[1:] for w in rest)

    @staticmethod
    def attr_name(key: str) -> str | None:
        """A RocketMQ or snake_case key to the attribute it sets (None if unknown)."""
        k = key.strip()
        k = re.sub(r"^maped", "mapped", k)
        k = re.sub(r"Maped", "Mapped", k)
        if "_" in k or k.islower():
            snake = k
        else:   # camelCase with acronyms: checkCRCOnRecover -> check_crc_on_recover, brokerIP1 -> broker_ip1
            snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", k)).lower()
        return snake if snake in _FIELDS else None

    # --- loading ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict, source: str | None = None, *, reading: bool = False) -> "StoreConfig":
        cfg = cls()
        cfg.update(values, source, reading=reading)
        return cfg

    def update(self, values: dict, source: str | None = None, *, reading: bool = False) -> "StoreConfig":
        """Set keys (RocketMQ names, their `maped` spelling, or attribute names): each is checked against the
        registry (config_keys.check_key: ConfigError for a key that is unknown, or not honoured and not at
        its default); the tuning keys set are named in one warning. reading: the configuration is only read
        from (a read-only command, a Spark read of a store: its geometry), which serves nothing and enforces
        nothing: keys it would refuse (useTLS=true, duplicationEnable=true) are left out, named in a warning."""
        from .config_keys import Support, canonical, check_key, warn_ignored, warn_tuning
        tuning, ignored = [], []
        for key, raw in values.items():
            attr = self.attr_name(key)
            if attr == "extra":
                attr = None
            name = canonical(self.java_name(attr) if attr is not None else str(key).strip())
            try:
                support = check_key(name, raw, source).support
            except ConfigError:
                if not reading:
                    raise
                ignored.append(name)
                continue
            if reading and support is Support.STORE_PATH:
                continue        # where the broker keeps its store: a read is of the directory it is given
            is_tuning = support is Support.TUNING
            if attr is None:
                if name in _EXTRA_INTS:
                    lo, hi = _EXTRA_INTS[name]
                    v = _coerce("int", name, raw, source)
                    if not lo <= v <= hi:
                        raise ConfigError(name, raw, f"must be {lo}..{hi}", source)
                elif name in _EXTRA_BOOLS:      # kept as "true"/"false": readers compare with "true"
                    raw = "true" if _coerce("bool", name, raw, source) else "false"
                self.extra[name] = raw
                if is_tuning:
                    tuning.append(name)
                continue
            value = _coerce(_FIELDS[attr], key, raw, source)
            if is_tuning and value != _DEFAULTS[attr]:      # a default value asks for nothing: no warning
                tuning.append(name)
            setattr(self, attr, value)
        self.validate(source)
        warn_tuning(tuning, source)
        warn_ignored(ignored, source)
        return self

    @classmethod
    def load(cls, path: str | Path | None, overrides: dict | None = None, *, reading: bool = False) -> "StoreConfig":
        """Read a broker.conf-style properties file (key=value, # comments); None gives defaults. reading: see
        update."""
        values: dict[str, str] = {}
        if path is not None:
            p = Path(path)
            try:
                text = p.read_text(encoding="utf-8")
            except OSError as e:
                raise ConfigError("-c", str(p), f"cannot read config file: {e.strerror}") from e
            for lineno, line in enumerate(text.splitlines(), 1):
                s = line.strip()
                if not s or s[0] in "#!":
                    continue
                m = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", s)
                if not m:
                    raise ConfigError(f"line {lineno}", s, "not a key=value line", str(p))
                values[m.group(1)] = m.group(2).strip()
        cfg = cls.from_dict(values, str(path) if path else None, reading=reading)
        if overrides:
            cfg.update(overrides, reading=reading)
        return cfg

    def validate(self, source: str | None = None) -> None:
        def need(cond: bool, attr: str, why: str) -> None:
            if not cond:
                raise ConfigError(self.java_name(attr), getattr(self, attr), why, source)
        need(4096 <= self.mapped_file_size_commit_log <= _JAVA_INT_MAX, "mapped_file_size_commit_log",
             "must be 4096..2147483647 (RocketMQ's file size is a Java int)")
        need(self.mapped_file_size_consume_queue <= _JAVA_INT_MAX, "mapped_file_size_consume_queue",
             "must be at most 2147483647")
        need(self.max_message_size <= _JAVA_INT_MAX, "max_message_size", "must be at most 2147483647")
        for attr in ("flush_interval_commit_log", "commit_interval_commit_log", "flush_interval_consume_queue",
                     "clean_resource_interval", "flush_delay_offset_interval", "default_query_max_num",
                     "max_transfer_count_on_message_in_memory", "max_transfer_count_on_message_in_disk",
                     "max_transfer_bytes_on_message_in_memory", "max_transfer_bytes_on_message_in_disk",
                     "max_msgs_num_batch"):
            need(0 < getattr(self, attr) <= _JAVA_INT_MAX, attr, "must be 1..2147483647")
        for attr in ("delete_commit_log_files_interval", "short_polling_time_mills",
                     "flush_commit_log_least_pages", "flush_consume_queue_least_pages",
                     "commit_commit_log_least_pages"):
            need(0 <= getattr(self, attr) <= _JAVA_INT_MAX, attr, "must be 0..2147483647")
        need(0 <= self.access_message_in_memory_max_ratio <= 100, "access_message_in_memory_max_ratio",
             "must be 0..100 (percent of memory)")
        need(1 <= self.default_topic_queue_nums <= 65535, "default_topic_queue_nums",
             "must be 1..65535 (a queue id is 0..65535)")
        hours = [h.strip() for h in str(self.delete_when).split(";")]
        need(all(h.isdigit() and 0 <= int(h) <= 23 for h in hours), "delete_when",
             "must be hours of the day, 00..23, separated by ';' (\"04\" or \"04;16\")")
        need(self.mapped_file_size_consume_queue >= 20 and self.mapped_file_size_consume_queue % 20 == 0,
             "mapped_file_size_consume_queue", "must be a positive multiple of 20")
        need(self.max_hash_slot_num > 0, "max_hash_slot_num", "must be positive")
        need(self.max_index_num > 1, "max_index_num", "must be at least 2")
        need(0 < self.max_message_size, "max_message_size", "must be positive")
        need(self.flush_disk_type in (ASYNC_FLUSH, SYNC_FLUSH), "flush_disk_type",
             "must be ASYNC_FLUSH or SYNC_FLUSH")
        need(self.broker_role in BrokerRole.__members__ or self.broker_role == "", "broker_role",
             "must be ASYNC_MASTER, SYNC_MASTER or SLAVE")
        need(self.broker_role != "SLAVE" or self.broker_id > 0, "broker_id",
             "a SLAVE's brokerId must be > 0 (RocketMQ's BrokerStartup refuses it too)")
        need(0 <= self.ha_listen_port <= 65535, "ha_listen_port", "must be 0..65535")
        need(self.ha_send_heartbeat_interval > 0, "ha_send_heartbeat_interval", "must be positive")
        need(self.ha_housekeeping_interval > 0, "ha_housekeeping_interval", "must be positive")
        need(4096 <= self.ha_transfer_batch_size <= 4 * 1024 * 1024 - 12, "ha_transfer_batch_size",
             "must be 4096..4194292 (a RocketMQ slave reads frames into a 4 MiB buffer)")
        need(self.ha_slave_fallbehind_max > 0, "ha_slave_fallbehind_max", "must be positive")
        if self.ha_master_address:
            host, _, port = self.ha_master_address.rpartition(":")
            need(bool(host) and port.isdigit() and 0 < int(port) <= 65535, "ha_master_address",
                 "must be host:port (the master's HA port, listenPort + 1)")
        need(0 < self.disk_max_used_space_ratio <= 95, "disk_max_used_space_ratio", "must be in 1..95")
        need(self.file_reserved_time >= 0, "file_reserved_time", "must not be negative")
        need(self.sync_flush_timeout > 0, "sync_flush_timeout", "must be positive")
        need(self.transient_store_pool_size > 0, "transient_store_pool_size", "must be positive")
        need(2 <= self.listen_port <= 65535, "listen_port",
             "must be 2..65535 (the VIP channel listens on listenPort - 2, as RocketMQ's)")
        need(self.timer_precision_ms > 0, "timer_precision_ms", "must be positive")
        need(self.timer_max_delay_sec > 0, "timer_max_delay_sec", "must be positive")
        need(self.mapped_file_size_timer_log >= 68, "mapped_file_size_timer_log",
             "must be at least 68 (a unit and a blank)")
        need(self.mapped_file_size_consume_queue_ext >= 4096, "mapped_file_size_consume_queue_ext",
             "must be at least 4096")
        need(self.bit_map_length_consume_queue_ext >= 0, "bit_map_length_consume_queue_ext", "must not be negative")
        need(1 <= self.max_error_rate_of_bloom_filter < 100, "max_error_rate_of_bloom_filter",
             "must be 1..99 (percent)")
        need(self.expect_consumer_num_use_filter >= 1, "expect_consumer_num_use_filter", "must be at least 1")
        try:
            if not self.delay_levels_ms():
                raise ValueError("must name at least one delay level (RocketMQ's default: 1s 5s 10s 30s 1m ...)")
        except ValueError as e:
            raise ConfigError("messageDelayLevel", self.message_delay_level, str(e), source) from None

    # --- derived ---------------------------------------------------------------------------------
    def delay_levels_ms(self) -> list[int]:
        units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
        out = []
        for item in self.message_delay_level.split():
            unit = units.get(item[-1:])
            if unit is None or not item[:-1].isdigit():
                raise ValueError(f"delay level {item!r} is not a number followed by s, m, h or d")
            out.append(int(item[:-1]) * unit)
        return out

    @property
    def role(self) -> BrokerRole:
        """brokerRole; ASYNC_MASTER (RocketMQ's default) when not set."""
        return BrokerRole[self.broker_role or "ASYNC_MASTER"]

    @property
    def is_slave(self) -> bool:
        return self.broker_role == "SLAVE"

    @property
    def ha_server_addr(self) -> str:
        """What a broker registers as its haServerAddr (RocketMQ's brokerIP2:haListenPort)."""
        return f"{self.broker_ip2 or self.broker_ip1}:{self.ha_listen_port}"

    @property
    def store_host(self) -> str:
        return f"{self.broker_ip1}:{self.listen_port}"

    def to_properties(self) -> str:
        """The config as broker.conf lines, RocketMQ names."""
        lines = []
        for f in dataclasses.fields(self):
            if f.name != "extra":
                v = self.role.value if f.name == "broker_role" else getattr(self, f.name)
                lines.append(f"{self.java_name(f.name)}={str(v).lower() if isinstance(v, bool) else v}")
        return "\n".join(lines) + "\n"


_JAVA_NAMES = {"check_crc_on_recover": "checkCRCOnRecover", "broker_ip1": "brokerIP1", "broker_ip2": "brokerIP2"}
_FIELDS = {f.name: f.type for f in dataclasses.fields(StoreConfig)}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(StoreConfig) if f.name != "extra"}
_JAVA_INT_MAX = 2**31 - 1
# honoured keys StoreConfig keeps in `extra` whose readers want an integer: its range, else refused at load
_EXTRA_INTS = {"serverChannelMaxIdleTimeSeconds": (0, _JAVA_INT_MAX), "flushConsumerOffsetInterval": (1, _JAVA_INT_MAX),
               "transactionTimeOut": (1, _JAVA_INT_MAX), "transactionCheckMax": (1, _JAVA_INT_MAX),
               "transactionCheckInterval": (1, _JAVA_INT_MAX), "grpcListenPort": (-1, 65535),
               "serverFrameMemoryMax": (1, 2**62), "serverFrameTimeoutSeconds": (1, _JAVA_INT_MAX)}
# and those whose readers want a boolean (kept normalised: "true" or "false")
_EXTRA_BOOLS = {"autoCreateSubscriptionGroup", "aclEnable"}


def _coerce(typ, key: str, raw, source: str | None):
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if t == "bool":
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in ("true", "1", "yes"):
                return True
            if s in ("false", "0", "no"):
                return False
            raise ValueError("expected true or false")
        if t == "int":
            if isinstance(raw, bool):
                raise ValueError("expected an integer")
            return int(str(raw).strip().replace("_", ""))
        if t == "str":
            return str(raw).strip()
    except ValueError as e:
        raise ConfigError(key, raw, str(e) if "expected" in str(e) else "expected an integer", source) from None
    return raw
