"""rmqstore.broker.stats on a fake clock: the rate strings of GET_BROKER_RUNTIME_INFO ("10s 1min 10min",
a window without samples empty, as RocketMQ's StoreStatsService), the put latency distribution, the
per-topic / per-group StatsItems of VIEW_BROKER_STATS_DATA and the daily counts."""
from __future__ import annotations

import time

from rmqstore.broker.stats import (BROKER_PUT_NUMS, GROUP_GET_NUMS, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE,
                                   BrokerStatsManager, java_double)

T0 = 1_700_000_000_000      # ms


class Clock:
    def __init__(self):
        self.ms = T0

    def __call__(self) -> float:
        return self.ms / 1000


def test_put_rates_need_their_samples():
    clock = Clock()
    m = BrokerStatsManager("C", clock=clock)
    assert m.store.runtime_info(clock.ms)["putTps"] == "  "          # just booted: three empty figures
    for _ in range(11):                  # 100 puts a second for 11 s
        m.on_put("T", 100, 100 * 200, 3)
        clock.ms += 1000
        m.tick()
    info = m.store.runtime_info(clock.ms)
    tps10, tps60, tps600 = info["putTps"].split(" ")
    assert float(tps10) == 100.0 and tps60 == "" and tps600 == ""
    assert info["putMessageTimesTotal"] == "1100" and info["putMessageSizeTotal"] == str(1100 * 200)
    assert info["putMessageAverageSize"] == "200.0"
    assert info["putMessageDistributeTime"].startswith("[<=0ms]:0 [0~10ms]:1100 [10~50ms]:0 ")
    assert info["getTotalTps"] == "0.0 0.0 0.0"
    for _ in range(50):                  # 50 s more without puts: the minute figure exists, lower
        clock.ms += 1000
        m.tick()
    tps10, tps60, _ = m.store.runtime_info(clock.ms)["putTps"].split(" ")
    assert float(tps10) == 0.0 and abs(float(tps60) - 1000 / 60) < 1e-9


def test_gets_found_missed_and_transferred():
    clock = Clock()
    m = BrokerStatsManager("C", clock=clock)
    for _ in range(11):
        m.on_get("g", "T", 0, 32, 32 * 100, 1)     # found 32
        m.on_get("g", "T", 1, 0, 0, 0)             # a miss
        clock.ms += 1000
        m.tick()
    info = m.store.runtime_info(clock.ms)
    assert float(info["getFoundTps"].split(" ")[0]) == 1.0
    assert float(info["getMissTps"].split(" ")[0]) == 1.0
    assert float(info["getTransferedTps"].split(" ")[0]) == 32.0
    assert info["getTotalTps"].split(" ")[0] == "2.0"
    assert m.daily_info()["msgGetTotalTodayNow"] == str(11 * 32)


def test_stats_items_minute_hour_day():
    clock = Clock()
    m = BrokerStatsManager("C", clock=clock)
    m.on_put("T", 10, 1000, 1)
    m.on_put("T", 5, 500, 1)
    m.on_get("g", "T", 0, 7, 700, 1)
    assert m.broker_stats_data(TOPIC_PUT_NUMS, "T")["statsMinute"] == {"avgpt": 0.0, "sum": 0, "tps": 0.0}
    clock.ms += 5_000                     # each window is read up to now, between samples too
    d = m.broker_stats_data(TOPIC_PUT_NUMS, "T")
    assert d["statsMinute"] == {"avgpt": 7.5, "sum": 15, "tps": 3.0} and d["statsDay"]["sum"] == 15
    clock.ms += 5_000
    m.tick()                              # the 10 s sample
    d = m.broker_stats_data(TOPIC_PUT_NUMS, "T")
    assert d["statsMinute"] == {"avgpt": 7.5, "sum": 15, "tps": 1.5}      # 15 messages in 2 puts over 10 s
    assert m.broker_stats_data(TOPIC_PUT_SIZE, "T")["statsMinute"]["sum"] == 1500
    assert m.broker_stats_data(BROKER_PUT_NUMS, "C")["statsMinute"]["sum"] == 15
    assert m.broker_stats_data(GROUP_GET_NUMS, "T@g")["statsMinute"]["sum"] == 7
    assert m.tps_group_get_nums("g", "T") == 0.7
    assert m.broker_stats_data(TOPIC_PUT_NUMS, "nope") is None
    clock.ms += 600_000
    m.tick()                              # the 10 min sample: the hour window has it
    assert m.broker_stats_data(TOPIC_PUT_NUMS, "T")["statsHour"]["sum"] == 15
    clock.ms += 3_600_000
    m.tick()
    assert m.broker_stats_data(TOPIC_PUT_NUMS, "T")["statsDay"]["sum"] == 15
    # the minute window keeps 7 samples (a minute): after more than a minute without puts, nothing
    for _ in range(7):
        clock.ms += 10_000
        m.tick()
    assert m.broker_stats_data(TOPIC_PUT_NUMS, "T")["statsMinute"]["sum"] == 0


def test_daily_counts_roll_at_midnight():
    clock = Clock()
    lt = time.localtime(clock())
    clock.ms += ((23 - lt.tm_hour) * 3600 + (59 - lt.tm_min) * 60 + (59 - lt.tm_sec)) * 1000 - 1000  # 23:59:58
    m = BrokerStatsManager("C", clock=clock)
    m.on_put("T", 3, 300, 0)
    clock.ms += 5000                      # past midnight
    m.tick()
    m.on_put("T", 2, 200, 0)
    d = m.daily_info()
    assert (d["msgPutTotalYesterdayMorning"], d["msgPutTotalTodayMorning"], d["msgPutTotalTodayNow"]) == ("0", "3", "5")


def test_java_double():
    assert [java_double(x) for x in (0.0, 1.5, 100.0, 12345678.0, 0.0001)] == \
        ["0.0", "1.5", "100.0", "1.2345678E7", "1.0E-4"]
