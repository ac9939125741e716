"""rmqstore: Apache RocketMQ's message store in Python, byte-compatible with the files RocketMQ writes.

The names a user needs are importable from here:

    from rmqstore import MessageStore, StoreConfig, Message, MessageBatch

They are loaded on first use (PEP 562), so `import rmqstore` stays cheap and pulls in neither numpy's
users nor the messaging layer until they are asked for.
"""
from __future__ import annotations

from importlib import import_module

# public name -> module that defines it
_EXPORTS = {
    "MessageStore": ".store.store",
    "StoreConfig": ".store.conf.config",
    "Message": ".store.format.message",
    "MessageExt": ".store.format.message",
    "PutMessageStatus": ".store.format.message",
    "GetMessageStatus": ".store.format.message",
    "MessageBatch": ".store.format.message_batch",
    "Producer": ".messaging.producer",
    "PushConsumer": ".messaging.consumer",
    "PullConsumer": ".messaging.consumer",
    "ConsumeFromWhere": ".messaging.consumer",
    "CONSUME_SUCCESS": ".messaging.consumer",
    "RECONSUME_LATER": ".messaging.consumer",
    "LocalBroker": ".messaging.local_broker",
    "MessageSelector": ".filter",
    "SelectorError": ".filter",
    "TransactionProducer": ".messaging.transaction",
    "CorruptStoreError": ".errors",
    "ConfigError": ".errors",
    "StoreLockedError": ".errors",
    "RmqStoreError": ".errors",
}

__all__ = ["__version__", *_EXPORTS]


def _install_schedule(store) -> None:
    """The default store extension: delayed messages (DELAY rewrite hook + ScheduleMessageService), as
    RocketMQ 4.4.0's store did itself; the engine never imports the messaging layer (store/commitlog/hooks.py)."""
    from .messaging.schedule import install
    install(store)


def _install_timer(store) -> None:
    """Timer messages (RIP-43): TIMER_DELIVER_MS / __STARTDELIVERTIME parked until due (store/timer/timer.py,
    store/timer/timer_service.py)."""
    from .store.timer.timer_service import install
    install(store)


def _register_default_extensions() -> None:
    from .store.commitlog.hooks import register_default_extension
    register_default_extension("schedule", _install_schedule)
    register_default_extension("timer", _install_timer)


_register_default_extensions()


def _installed_version() -> str:
    """The installed distribution's version: read on first use of __version__, not at import (importlib.metadata
    and the lookup cost every process that imports rmqstore about 25 ms)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("rmqstore")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str):
    if name == "__version__":
        value = globals()[name] = _installed_version()
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rmqstore' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
