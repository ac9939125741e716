"""rmqstore: Apache RocketMQ's message store in Python, byte-compatible with the files RocketMQ writes.

The names a user needs are importable from here:

    from rmqstore import MessageStore, StoreConfig, Message, MessageBatch

They are loaded on first use (PEP 562), so `import rmqstore` stays cheap and pulls in neither numpy's
users nor the messaging layer until they are asked for.
"""
from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("rmqstore")
except PackageNotFoundError:  # pragma: no cover - running from a source tree that was never installed
    __version__ = "0+unknown"

# public name -> module that defines it
_EXPORTS = {
    "MessageStore": ".store",
    "StoreConfig": ".config",
    "Message": ".message",
    "MessageExt": ".message",
    "PutMessageStatus": ".message",
    "GetMessageStatus": ".message",
    "MessageBatch": ".message_batch",
    "Producer": ".producer",
    "PushConsumer": ".consumer",
    "PullConsumer": ".consumer",
    "CorruptStoreError": ".errors",
    "ConfigError": ".errors",
    "StoreLockedError": ".errors",
    "RmqStoreError": ".errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rmqstore' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
