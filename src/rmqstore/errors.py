"""The exceptions rmqstore raises. Every error that concerns a file names the file and offset."""
from __future__ import annotations


class RmqStoreError(Exception):
    """Base class of rmqstore's own errors."""


class CorruptStoreError(RmqStoreError):
    """A store file holds bytes that cannot be what rmqstore or RocketMQ wrote there."""

    def __init__(self, path: str, offset: int, reason: str):
        self.path = str(path)
        self.offset = offset
        self.reason = reason
        super().__init__(f"{self.path} at offset {offset}: {reason}")


class ConfigError(RmqStoreError, ValueError):
    """A configuration key has a value that cannot be used; names the key and, if any, the file."""

    def __init__(self, key: str, value: object, reason: str, source: str | None = None):
        self.key, self.value, self.source = key, value, source
        where = f" in {source}" if source else ""
        super().__init__(f"bad value {value!r} for {key}{where}: {reason}")


class StoreLockedError(RmqStoreError):
    """Another process holds the store's lock file."""

    def __init__(self, path: str):
        self.path = str(path)
        super().__init__(f"store {self.path} is locked by another process (lock file {self.path}/lock); "
                         "close the other process first")


class StoreClosedError(RmqStoreError):
    """An operation on a store that was shut down."""


def install_hint(extra: str) -> str:
    """How to install one of the package's extras (pyproject.toml): rmqstore is installed from its checkout
    or from a wheel built there (`python -m build`), not from PyPI."""
    return (f"pip install '.[{extra}]' in rmqstore's checkout (or, from a wheel, "
            f"pip install 'rmqstore-VERSION-py3-none-any.whl[{extra}]')")
