"""Broker statistics as RocketMQ 4.4.0 keeps them: StatsItem / StatsItemSet / BrokerStatsManager (per topic and
per group, over the last minute, hour and day) and StoreStatsService (the put and get rates over the last
10 s, 1 min and 10 min, the put latency distribution), plus BrokerStats' daily message counts.

Everything is counted on the broker's event loop thread; `tick(now_ms)` takes the samples (the broker's
periodic task calls it every second; RocketMQ's schedules: a StatsItem every 10 s, 10 min and 1 h, the
store's rates every second). Rates need samples: until a window has them, RocketMQ's broker reports an
empty string for that window ("putTps": "  " just after boot), and so does this one.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
GROUP_GET_LATENCY = "GROUP_GET_LATENCY"
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"
STATS_NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, GROUP_GET_LATENCY, SNDBCK_PUT_NUMS,
               BROKER_PUT_NUMS, BROKER_GET_NUMS)

SECOND_MS, MINUTE_MS, HOUR_MS = 1000, 60_000, 3_600_000
# StoreStatsService.PUT_MESSAGE_ENTIRE_TIME_MAX_DESC and the upper bound (ms, exclusive) of each bucket
PUT_TIME_BUCKETS = ("[<=0ms]", "[0~10ms]", "[10~50ms]", "[50~100ms]", "[100~200ms]", "[200~500ms]", "[500ms~1s]",
                    "[1~2s]", "[2~3s]", "[3~4s]", "[4~5s]", "[5~10s]", "[10s~]")
_BUCKET_LIMITS = (1, 10, 50, 100, 200, 500, 1000, 2000, 3000, 4000, 5000, 10000)
RATE_WINDOWS_S = (10, 60, 600)          # the three figures of putTps & co
_MAX_RATE_SAMPLES = 601


@dataclass(frozen=True)
class CallSnapshot:
    timestamp: int       # ms
    times: int
    value: int

    @staticmethod
    def tps(begin: "CallSnapshot", end: "CallSnapshot") -> float:
        span = end.timestamp - begin.timestamp
        return (end.value - begin.value) * 1000.0 / span if span else 0.0


@dataclass(frozen=True)
class StatsSnapshot:
    sum: int
    tps: float
    avgpt: float

    def to_json(self) -> dict:          # BrokerStatsItem
        return {"avgpt": self.avgpt, "sum": self.sum, "tps": self.tps}


def compute_stats(snaps: deque) -> StatsSnapshot:
    """StatsItem.computeStatsData: the sum, rate and average per call between the first and last sample."""
    if not snaps:
        return StatsSnapshot(0, 0.0, 0.0)
    first, last = snaps[0], snaps[-1]
    total = last.value - first.value
    span = last.timestamp - first.timestamp
    tps = total * 1000.0 / span if span else 0.0
    times = last.times - first.times
    return StatsSnapshot(total, tps, total / times if times > 0 else 0.0)


class StatsItem:
    """One key's counters (value = the sum of what was added, times = how many additions) and its samples:
    every 10 s (the last 7: a minute), every 10 min (an hour), every hour (a day, 25).

    Each window starts with a zero sample taken when the item is made (RocketMQ's first sample of a new item
    already holds its first additions, which its sums then never count), and VIEW_BROKER_STATS_DATA reads
    each window up to now (RocketMQ's up to its last sample: a day's count lags by up to an hour)."""

    __slots__ = ("name", "key", "value", "times", "minute", "hour", "day")

    def __init__(self, name: str, key: str, now_ms: int):
        self.name, self.key = name, key
        self.value = self.times = 0
        zero = CallSnapshot(now_ms, 0, 0)
        self.minute: deque = deque([zero], maxlen=7)
        self.hour: deque = deque([zero], maxlen=7)
        self.day: deque = deque([zero], maxlen=25)

    def add(self, value: int, times: int = 1) -> None:
        self.value += value
        self.times += times

    def sample(self, into: deque, now_ms: int) -> None:
        into.append(CallSnapshot(now_ms, self.times, self.value))

    def _upto(self, snaps: deque, now_ms: int | None) -> deque:
        """The window's samples and, with now_ms, one taken now (the window ends now, not at its last
        sample: a day's count includes the messages since the last hourly sample)."""
        if now_ms is None or (snaps and snaps[-1].timestamp >= now_ms):
            return snaps
        return deque([*snaps, CallSnapshot(now_ms, self.times, self.value)])

    def in_minute(self, now_ms: int | None = None) -> StatsSnapshot:
        return compute_stats(self._upto(self.minute, now_ms))

    def in_hour(self, now_ms: int | None = None) -> StatsSnapshot:
        return compute_stats(self._upto(self.hour, now_ms))

    def in_day(self, now_ms: int | None = None) -> StatsSnapshot:
        return compute_stats(self._upto(self.day, now_ms))


class StoreStatsService:
    """The store's rates and put latencies (StoreStatsService)."""

    def __init__(self, now_ms: int):
        self.boot_timestamp = now_ms
        self.put_times_total = 0
        self.put_size_total = 0
        self.get_found = 0
        self.get_miss = 0
        self.transfered = 0
        self.put_time_max = 0
        self.get_time_max = 0
        self.put_distribution = [0] * len(PUT_TIME_BUCKETS)
        self.samples: dict[str, deque] = {k: deque(maxlen=_MAX_RATE_SAMPLES)
                                          for k in ("put", "get_found", "get_miss", "transfered")}
        self.sample(now_ms)

    def record_put(self, messages: int, size: int, elapsed_ms: int) -> None:
        """messages put in one store call that took elapsed_ms (counted once per message: each was a send)."""
        self.put_times_total += messages
        self.put_size_total += size
        i = 0
        while i < len(_BUCKET_LIMITS) and elapsed_ms >= _BUCKET_LIMITS[i]:
            i += 1
        self.put_distribution[i] += messages
        if elapsed_ms > self.put_time_max:
            self.put_time_max = elapsed_ms

    def record_get(self, found: bool, messages: int, elapsed_ms: int) -> None:
        if found:
            self.get_found += 1
            self.transfered += messages
        else:
            self.get_miss += 1
        if elapsed_ms > self.get_time_max:
            self.get_time_max = elapsed_ms

    def sample(self, now_ms: int) -> None:
        s = self.samples
        s["put"].append(CallSnapshot(now_ms, 0, self.put_times_total))
        s["get_found"].append(CallSnapshot(now_ms, 0, self.get_found))
        s["get_miss"].append(CallSnapshot(now_ms, 0, self.get_miss))
        s["transfered"].append(CallSnapshot(now_ms, 0, self.transfered))

    def _rate(self, name: str, window_s: int) -> float | None:
        lst = self.samples[name]
        if len(lst) <= window_s:
            return None
        return CallSnapshot.tps(lst[-1 - window_s], lst[-1])

    def rates(self, name: str) -> str:
        """"tps10s tps1min tps10min", a window without enough samples empty (getPutTps & co)."""
        return " ".join("" if r is None else java_double(r) for r in map(lambda w: self._rate(name, w), RATE_WINDOWS_S))

    def total_rates(self) -> str:
        """getGetTotalTps: found + miss, 0.0 where a window lacks samples."""
        return " ".join(java_double((self._rate("get_found", w) or 0.0) + (self._rate("get_miss", w) or 0.0))
                        for w in RATE_WINDOWS_S)

    def distribution(self) -> str:
        return "".join(f"{d}:{n} " for d, n in zip(PUT_TIME_BUCKETS, self.put_distribution))

    def runtime(self, now_ms: int) -> str:
        t = max(0, now_ms - self.boot_timestamp)
        return (f"[ {t // (24 * HOUR_MS)} days, {t % (24 * HOUR_MS) // HOUR_MS} hours, "
                f"{t % HOUR_MS // MINUTE_MS} minutes, {t % MINUTE_MS // SECOND_MS} seconds ]")

    def runtime_info(self, now_ms: int) -> dict[str, str]:
        """StoreStatsService.getRuntimeInfo."""
        total = self.put_times_total or 1
        return {"bootTimestamp": str(self.boot_timestamp), "runtime": self.runtime(now_ms),
                "putMessageEntireTimeMax": str(self.put_time_max), "putMessageTimesTotal": str(total),
                "putMessageSizeTotal": str(self.put_size_total), "putMessageDistributeTime": self.distribution(),
                "putMessageAverageSize": java_double(self.put_size_total / total), "dispatchMaxBuffer": "0",
                "getMessageEntireTimeMax": str(self.get_time_max), "putTps": self.rates("put"),
                "getFoundTps": self.rates("get_found"), "getMissTps": self.rates("get_miss"),
                "getTotalTps": self.total_rates(), "getTransferedTps": self.rates("transfered")}


def java_double(x: float) -> str:
    """Double.toString for the figures a broker reports (Python's repr agrees from 1e-3 to 1e7; beyond, the
    mantissa is rounded to 15 digits)."""
    x = float(x)
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0 or 1e-3 <= abs(x) < 1e7:
        return repr(x)
    mant, exp = f"{x:.15e}".split("e")
    mant = mant.rstrip("0")
    return f"{mant}0E{int(exp)}" if mant.endswith(".") else f"{mant}E{int(exp)}"


class BrokerStatsManager:
    """BrokerStatsManager + StoreStatsService + BrokerStats, on the broker's event loop."""

    def __init__(self, cluster_name: str, clock=time.time):
        self.cluster_name = cluster_name
        self.clock = clock
        now = self.now_ms()
        self.store = StoreStatsService(now)
        self.table: dict[str, dict[str, StatsItem]] = {name: {} for name in STATS_NAMES}
        self._last = {"10s": now, "10min": now, "1h": now, "1s": now}
        self._day = time.localtime(now / 1000).tm_yday
        # BrokerStats: the put / get totals at the last two midnights (at boot: 0)
        self.put_yesterday_morning = self.put_today_morning = 0
        self.get_yesterday_morning = self.get_today_morning = 0
        self.get_total = 0
        self._sample_items(now, "minute")
        self._sample_items(now, "hour")
        self._sample_items(now, "day")

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def item(self, name: str, key: str) -> StatsItem:
        items = self.table[name]
        it = items.get(key)
        if it is None:
            it = items[key] = StatsItem(name, key, self.now_ms())
        return it

    def get_item(self, name: str, key: str) -> StatsItem | None:
        return self.table.get(name, {}).get(key)

    # --- counting (BrokerStatsManager.inc*) ---------------------------------------------------------
    def on_put(self, topic: str, messages: int, size: int, elapsed_ms: int) -> None:
        self.item(TOPIC_PUT_NUMS, topic).add(messages, 1)
        self.item(TOPIC_PUT_SIZE, topic).add(size, 1)
        self.item(BROKER_PUT_NUMS, self.cluster_name).add(messages, 1)
        self.store.record_put(messages, size, elapsed_ms)

    def on_get(self, group: str, topic: str, queue_id: int, messages: int, size: int, elapsed_ms: int) -> None:
        """A pull: messages found (0: a miss) of size bytes."""
        if messages:
            key = f"{topic}@{group}"
            self.item(GROUP_GET_NUMS, key).add(messages, 1)
            self.item(GROUP_GET_SIZE, key).add(size, 1)
            self.item(BROKER_GET_NUMS, self.cluster_name).add(messages, 1)
            self.get_total += messages
        self.store.record_get(messages > 0, messages, elapsed_ms)

    def on_send_back(self, group: str, topic: str) -> None:
        self.item(SNDBCK_PUT_NUMS, f"{topic}@{group}").add(1, 1)

    def tps_group_get_nums(self, group: str, topic: str) -> float:
        it = self.get_item(GROUP_GET_NUMS, f"{topic}@{group}")
        return it.in_minute().tps if it is not None else 0.0

    # --- sampling -----------------------------------------------------------------------------------
    def _sample_items(self, now_ms: int, into: str) -> None:
        for items in self.table.values():
            for it in items.values():
                it.sample(getattr(it, into), now_ms)

    def tick(self, now_ms: int | None = None) -> None:
        """Take the samples that are due (call at least once a second)."""
        now = self.now_ms() if now_ms is None else now_ms
        last = self._last
        while now - last["1s"] >= SECOND_MS:
            last["1s"] += SECOND_MS
            self.store.sample(last["1s"])
        for k, period, into in (("10s", 10 * SECOND_MS, "minute"), ("10min", 10 * MINUTE_MS, "hour"),
                                ("1h", HOUR_MS, "day")):
            if now - last[k] >= period:
                last[k] = now
                self._sample_items(now, into)
        day = time.localtime(now / 1000).tm_yday
        if day != self._day:           # BrokerStats.record at midnight
            self._day = day
            self.put_yesterday_morning, self.put_today_morning = self.put_today_morning, self.store.put_times_total
            self.get_yesterday_morning, self.get_today_morning = self.get_today_morning, self.get_total

    def daily_info(self) -> dict[str, str]:
        return {"msgPutTotalYesterdayMorning": str(self.put_yesterday_morning),
                "msgPutTotalTodayMorning": str(self.put_today_morning),
                "msgPutTotalTodayNow": str(self.store.put_times_total),
                "msgGetTotalYesterdayMorning": str(self.get_yesterday_morning),
                "msgGetTotalTodayMorning": str(self.get_today_morning),
                "msgGetTotalTodayNow": str(self.get_total)}

    def broker_stats_data(self, name: str, key: str) -> dict | None:
        """VIEW_BROKER_STATS_DATA's BrokerStatsData, None when the item does not exist."""
        it = self.get_item(name, key)
        if it is None:
            return None
        now = self.now_ms()
        return {"statsDay": it.in_day(now).to_json(), "statsHour": it.in_hour(now).to_json(),
                "statsMinute": it.in_minute(now).to_json()}
