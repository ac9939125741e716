"""Every broker.conf key rmqstore knows, and what it does with it: the one registry StoreConfig checks.

RocketMQ reads a broker.conf into BrokerConfig, NettyServerConfig, NettyClientConfig and
MessageStoreConfig and silently ignores any other key. rmqstore answers every key one of four ways:

- HONOURED: read and acted on (StoreConfig fields, or keys the broker reads from StoreConfig.extra).
- TUNING: a knob of a part RocketMQ has and rmqstore does not (Netty's thread pools and buffers, Java mmap
  housekeeping, statistics switches): no promise about messages depends on it, so any value is accepted;
  each load names them in one warning ("no effect here").
- DEFAULT_ONLY: a feature rmqstore does not have (duplication, filter servers, TLS, ...): only the value
  that asks for what rmqstore does (RocketMQ's default, e.g. aclEnable=false) is accepted; any other value
  is a ConfigError naming the key and why.
- STORE_PATH: where a store's files are: accepted when it names the layout of the store being opened
  (storePathRootDir the store's own directory, storePathCommitLog its commitlog/ ...), checked at open.

A key in none of these is refused (a misspelt key, or one of a later RocketMQ): nothing is ignored
silently. Making a feature's key honoured is one line here: `"useTLS": HONOURED,`.
"""
from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass

from ...errors import ConfigError

log = logging.getLogger(__name__)


class Support(enum.Enum):
    HONOURED = "honoured"
    TUNING = "tuning: accepted, no effect"
    DEFAULT_ONLY = "not honoured: only its default value is accepted"
    STORE_PATH = "store path: must name the store's own layout"


@dataclass(frozen=True)
class KeyRule:
    support: Support
    accepted: tuple[str, ...] = ()      # DEFAULT_ONLY: the values accepted (normalised: see _norm)
    why: str = ""                       # what is not there (named in the refusal, the warning, the README)


HONOURED = KeyRule(Support.HONOURED)


def _norm(value) -> str:
    """A value as compared with a DEFAULT_ONLY key's accepted ones: integers as digits, the rest lower-case."""
    s = str(value).strip()
    try:
        return str(int(s.replace("_", "")))
    except ValueError:
        return s.lower()


def _tuning(why: str) -> KeyRule:
    return KeyRule(Support.TUNING, why=why)


def _only(*values, why: str) -> KeyRule:
    return KeyRule(Support.DEFAULT_ONLY, tuple(_norm(v) for v in values), why)


def _path(sub: str) -> KeyRule:
    return KeyRule(Support.STORE_PATH, (sub,))


_POOLS = "RocketMQ's request thread pools and their queues: rmqstore serves requests from one event loop"
_NETTY = "Netty's threads, semaphores and socket buffers: rmqstore's server is asyncio"
_CLIENT = "the broker's Netty client: rmqstore's broker opens only name server connections, with fixed timeouts"
_MMAP = "Java's mapped-file housekeeping (warm-up, forced unmapping, lock kinds): not in rmqstore's design"
_STATS = "a statistics or commercial switch RocketMQ keeps for itself: nothing rmqstore reports depends on it"
_REGISTER = "the name server registration's timing and encoding: rmqstore registers every 30 s, uncompressed"
_FAST_FAIL = "RocketMQ's send/pull queue waits and fast failure: rmqstore has no request queues to wait in"
_FILTER_RETRY = "SQL92 selectors over retry topics (the retry topic's subscription filtered too) are not implemented"

KEYS: dict[str, KeyRule] = {
    # --- MessageStoreConfig (4.4.0), the store ------------------------------------------------------------
    "storePathRootDir": _path(""), "storePathCommitLog": _path("commitlog"),
    "storePathConsumeQueue": _path("consumequeue"), "storePathIndex": _path("index"),
    "storeCheckpoint": _path("checkpoint"), "abortFile": _path("abort"),
    "mappedFileSizeCommitLog": HONOURED, "mappedFileSizeConsumeQueue": HONOURED,
    "enableConsumeQueueExt": HONOURED, "mappedFileSizeConsumeQueueExt": HONOURED,
    "bitMapLengthConsumeQueueExt": HONOURED,
    "flushIntervalCommitLog": HONOURED, "commitIntervalCommitLog": HONOURED,
    "useReentrantLockWhenPutMessage": _tuning(_MMAP), "flushCommitLogTimed": HONOURED,
    "flushIntervalConsumeQueue": HONOURED, "cleanResourceInterval": HONOURED,
    "deleteCommitLogFilesInterval": HONOURED, "deleteConsumeQueueFilesInterval": _tuning(_MMAP),
    "destroyMappedFileIntervalForcibly": _tuning(_MMAP), "redeleteHangedFileInterval": _tuning(_MMAP),
    "deleteWhen": HONOURED, "diskMaxUsedSpaceRatio": HONOURED, "fileReservedTime": HONOURED,
    "putMsgIndexHightWater": _tuning(_STATS), "maxMessageSize": HONOURED, "checkCRCOnRecover": HONOURED,
    "flushCommitLogLeastPages": HONOURED, "commitCommitLogLeastPages": HONOURED,
    "flushLeastPagesWhenWarmMappedFile": _tuning(_MMAP), "flushConsumeQueueLeastPages": HONOURED,
    "flushCommitLogThoroughInterval": HONOURED, "commitCommitLogThoroughInterval": HONOURED,
    "flushConsumeQueueThoroughInterval": HONOURED,
    "maxTransferBytesOnMessageInMemory": HONOURED, "maxTransferCountOnMessageInMemory": HONOURED,
    "maxTransferBytesOnMessageInDisk": HONOURED, "maxTransferCountOnMessageInDisk": HONOURED,
    "accessMessageInMemoryMaxRatio": HONOURED, "messageIndexEnable": HONOURED, "maxHashSlotNum": HONOURED,
    "maxIndexNum": HONOURED, "maxMsgsNumBatch": HONOURED, "messageIndexSafe": HONOURED,
    "haListenPort": HONOURED, "haSendHeartbeatInterval": HONOURED, "haHousekeepingInterval": HONOURED,
    "haTransferBatchSize": HONOURED, "haMasterAddress": HONOURED, "haSlaveFallbehindMax": HONOURED,
    "brokerRole": HONOURED, "flushDiskType": HONOURED,
    "syncFlushTimeout": HONOURED, "messageDelayLevel": HONOURED, "flushDelayOffsetInterval": HONOURED,
    "cleanFileForciblyEnable": HONOURED, "warmMappedFileEnable": _tuning(_MMAP),
    "offsetCheckInSlave": HONOURED, "debugLockEnable": _tuning(_MMAP),
    "duplicationEnable": _only(False, why="duplication (re-dispatching a slave's commitlog as a master's) is "
                                          "not implemented"),
    "diskFallRecorded": _tuning(_STATS), "osPageCacheBusyTimeOutMills": _tuning(_MMAP),
    "defaultQueryMaxNum": HONOURED, "transientStorePoolEnable": HONOURED,
    "transientStorePoolSize": _tuning("the number of Java direct buffers in the pool: rmqstore's write buffer is one"),
    "fastFailIfNoBufferInStorePool": _tuning(_MMAP),
    # RocketMQ 5's timer messages (MessageStoreConfig 5.x)
    "timerPrecisionMs": HONOURED, "timerMaxDelaySec": HONOURED, "timerRollWindowSlot": HONOURED,
    "mappedFileSizeTimerLog": HONOURED,
    # --- BrokerConfig (4.4.0) -----------------------------------------------------------------------------
    "rocketmqHome": HONOURED,                  # where plain_acl.yml is (aclEnable)
    "namesrvAddr": HONOURED, "brokerIP1": HONOURED, "brokerIP2": HONOURED,
    "brokerName": HONOURED, "brokerClusterName": HONOURED, "brokerId": HONOURED,
    "brokerPermission": _only(6, why="a broker that is not readable and writable (perm 6) is not implemented"),
    "defaultTopicQueueNums": HONOURED, "autoCreateTopicEnable": HONOURED,
    "clusterTopicEnable": _only(True, why="the topic named after the cluster is always created"),
    "brokerTopicEnable": _only(True, why="the topic named after the broker is always created"),
    "autoCreateSubscriptionGroup": HONOURED,
    "messageStorePlugIn": _only("", why="message store plug-ins are not implemented"),
    "msgTraceTopicName": _only("RMQ_SYS_TRACE_TOPIC", why="trace topics are not created by the broker"),
    "traceTopicEnable": _only(False, why="the broker does not create the trace topic (trace messages are "
                                          "ordinary sends: autoCreateTopicEnable or updateTopic serve them)"),
    "sendMessageThreadPoolNums": _tuning(_POOLS), "pullMessageThreadPoolNums": _tuning(_POOLS),
    "queryMessageThreadPoolNums": _tuning(_POOLS), "adminBrokerThreadPoolNums": _tuning(_POOLS),
    "clientManageThreadPoolNums": _tuning(_POOLS), "consumerManageThreadPoolNums": _tuning(_POOLS),
    "heartbeatThreadPoolNums": _tuning(_POOLS), "endTransactionThreadPoolNums": _tuning(_POOLS),
    "flushConsumerOffsetInterval": HONOURED, "flushConsumerOffsetHistoryInterval": _tuning(_STATS),
    "rejectTransactionMessage": _only(False, why="refusing transactional messages is not implemented"),
    "fetchNamesrvAddrByAddressServer": _only(False, why="the name server address server is not implemented"),
    "sendThreadPoolQueueCapacity": _tuning(_POOLS), "pullThreadPoolQueueCapacity": _tuning(_POOLS),
    "queryThreadPoolQueueCapacity": _tuning(_POOLS), "clientManagerThreadPoolQueueCapacity": _tuning(_POOLS),
    "consumerManagerThreadPoolQueueCapacity": _tuning(_POOLS),
    "heartbeatThreadPoolQueueCapacity": _tuning(_POOLS), "endTransactionPoolQueueCapacity": _tuning(_POOLS),
    "filterServerNums": _only(0, why="filter servers are not implemented"),
    "longPollingEnable": HONOURED, "shortPollingTimeMills": HONOURED,
    "notifyConsumerIdsChangedEnable": _only(True, why="consumers are always told when their group changes"),
    "highSpeedMode": _tuning(_STATS), "commercialEnable": _tuning(_STATS), "commercialTimerCount": _tuning(_STATS),
    "commercialTransCount": _tuning(_STATS), "commercialBigCount": _tuning(_STATS),
    "commercialBaseCount": _tuning(_STATS),
    "transferMsgByHeap": _tuning("how Java copies pulled messages (heap or zero-copy): rmqstore copies once"),
    "maxDelayTime": _tuning(_STATS), "regionId": _tuning(_STATS),
    "registerBrokerTimeoutMills": _tuning(_REGISTER),
    "slaveReadEnable": HONOURED,
    "disableConsumeIfConsumerReadSlowly": _only(False, why="disabling slow consumer groups is not implemented"),
    "consumerFallbehindThreshold": _tuning("used only with disableConsumeIfConsumerReadSlowly"),
    "brokerFastFailureEnable": _tuning(_FAST_FAIL), "waitTimeMillsInSendQueue": _tuning(_FAST_FAIL),
    "waitTimeMillsInPullQueue": _tuning(_FAST_FAIL), "waitTimeMillsInHeartbeatQueue": _tuning(_FAST_FAIL),
    "waitTimeMillsInTransactionQueue": _tuning(_FAST_FAIL),
    "startAcceptSendRequestTimeStamp": _only(0, why="a delayed start of accepting sends is not implemented"),
    "traceOn": _tuning(_STATS),
    "enableCalcFilterBitMap": HONOURED, "expectConsumerNumUseFilter": HONOURED, "maxErrorRateOfBloomFilter": HONOURED,
    "enablePropertyFilter": HONOURED,
    "filterDataCleanTimeSpan": _tuning("how long a departed group's filter data is kept: rmqstore keeps it until the "
                                       "group's next heartbeat replaces it"),
    "filterSupportRetry": _only(False, why=_FILTER_RETRY),
    "compressedRegister": _tuning(_REGISTER), "forceRegister": _tuning(_REGISTER),
    "registerNameServerPeriod": _tuning(_REGISTER),
    "transactionTimeOut": HONOURED, "transactionCheckMax": HONOURED, "transactionCheckInterval": HONOURED,
    "aclEnable": HONOURED, "innerClientAuthenticationCredentials": HONOURED,   # plain ACL (rmqstore.acl)
    # --- NettyServerConfig / NettyClientConfig (4.4.0) -------------------------------------------------
    "listenPort": HONOURED, "serverWorkerThreads": _tuning(_NETTY), "serverCallbackExecutorThreads": _tuning(_NETTY),
    "serverSelectorThreads": _tuning(_NETTY), "serverOnewaySemaphoreValue": _tuning(_NETTY),
    "serverAsyncSemaphoreValue": _tuning(_NETTY), "serverChannelMaxIdleTimeSeconds": HONOURED,
    "serverSocketSndBufSize": _tuning(_NETTY), "serverSocketRcvBufSize": _tuning(_NETTY),
    "serverPooledByteBufAllocatorEnable": _tuning(_NETTY), "useEpollNativeSelector": _tuning(_NETTY),
    "clientWorkerThreads": _tuning(_CLIENT), "clientCallbackExecutorThreads": _tuning(_CLIENT),
    "clientOnewaySemaphoreValue": _tuning(_CLIENT), "clientAsyncSemaphoreValue": _tuning(_CLIENT),
    "connectTimeoutMillis": _tuning(_CLIENT), "channelNotActiveInterval": _tuning(_CLIENT),
    "clientChannelMaxIdleTimeSeconds": _tuning(_CLIENT), "clientSocketSndBufSize": _tuning(_CLIENT),
    "clientSocketRcvBufSize": _tuning(_CLIENT), "clientPooledByteBufAllocatorEnable": _tuning(_CLIENT),
    "clientCloseSocketIfTimeout": _tuning(_CLIENT),
    "useTLS": _only(False, why="TLS is not implemented: the listeners speak plain TCP"),
    # RocketMQ's system properties rocketmq.broker.diskSpaceWarningLevelRatio / diskSpaceCleanForciblyRatio,
    # here broker.conf keys (cleanup.py: percent or fraction)
    "diskSpaceWarningLevelRatio": HONOURED, "diskSpaceCleanForciblyRatio": HONOURED,
    # --- rmqstore's own ------------------------------------------------------------------------------------
    "grpcListenPort": HONOURED,                 # the RocketMQ 5 gRPC endpoint (-1: off)
    "serverFrameMemoryMax": HONOURED,           # remoting: bytes of unfinished frames across connections
    "serverFrameTimeoutSeconds": HONOURED,      # remoting: seconds a connection may take to finish a frame
}


def canonical(key: str) -> str:
    """RocketMQ 4.x's misspelling `maped` read as `mapped` (the registry's spelling)."""
    return key.replace("maped", "mapped").replace("Maped", "Mapped")


def check_key(key: str, raw, source: str | None = None) -> KeyRule:
    """The rule of a broker.conf key (RocketMQ's spelling, canonical() applied by the caller) for this value:
    ConfigError naming the key when it is unknown, or not honoured and not at its default."""
    rule = KEYS.get(key)
    if rule is None:
        raise ConfigError(key, raw, "not a broker.conf key rmqstore knows (RocketMQ would ignore it silently: a "
                                    "misspelt key, or one of a later RocketMQ); remove it", source)
    if rule.support is Support.DEFAULT_ONLY and _norm(raw) not in rule.accepted:
        want = rule.accepted[0] if rule.accepted and rule.accepted[0] else "unset"
        raise ConfigError(key, raw, f"not honoured by rmqstore: {rule.why}; only {key}={want} is accepted", source)
    return rule


def warn_tuning(keys: list[str], source: str | None) -> None:
    """One warning naming the TUNING keys a configuration set (they change nothing here)."""
    if keys:
        whys = sorted({KEYS[k].why for k in keys})
        log.warning("%s%s: no effect in rmqstore (%s); no promise depends on %s", f"{source}: " if source else "",
                    ", ".join(sorted(keys)), "; ".join(whys), "it" if len(keys) == 1 else "them")


def warn_ignored(keys: list[str], source: str | None) -> None:
    """One warning naming the keys a configuration that is only read from left out (StoreConfig.update's
    reading): a serving rmqstore would refuse them."""
    if keys:
        log.warning("%s%s: not honoured by rmqstore, ignored for this read (`rmqstore serve` refuses %s)",
                    f"{source}: " if source else "", ", ".join(sorted(keys)), "it" if len(keys) == 1 else "them")


def check_store_paths(config, root: str | os.PathLike) -> None:
    """STORE_PATH keys must name the layout of the store at root (rmqstore keeps every file under the store's
    directory, RocketMQ 4.4.0's default layout): ConfigError naming the first that does not."""
    real = os.path.realpath(root)
    given = {"storePathRootDir": config.store_path_root_dir}
    given.update({k: v for k, v in (config.extra or {}).items() if k in KEYS and KEYS[k].support is Support.STORE_PATH})
    for key, value in given.items():
        if value is None or not str(value).strip():
            continue
        want = os.path.join(real, KEYS[key].accepted[0]) if KEYS[key].accepted[0] else real
        if os.path.realpath(os.path.expanduser(str(value).strip())) != os.path.normpath(want):
            raise ConfigError(key, value, f"the store being opened is {root}: rmqstore keeps its files there "
                                          f"({key} must be {want}, or unset)")
