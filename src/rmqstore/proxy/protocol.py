"""The generated `apache.rocketmq.v2` modules, taken from the published `rocketmq-python-client` package
(`rocketmq.grpc_protocol`), which rmqstore's extra `grpc` installs beside grpcio.

Nothing of the protocol lives in this repository. Importing this module without the extra raises
MissingExtraError naming the packages to install."""
from __future__ import annotations

import sys
import types

from ..errors import RmqStoreError, install_hint


class MissingExtraError(RmqStoreError, ImportError):
    """The gRPC endpoint needs the `grpc` extra."""


class _DeferredPackage(types.ModuleType):
    """The `rocketmq` package, its __init__ not run yet: that imports the whole 5.x client (OpenTelemetry's
    exporters, ...), 0.2 s at every broker start, for names the endpoint never uses. It runs, in this same
    module object, on the first use of a name it defines (`from rocketmq import Producer`, `rocketmq.Message`),
    so a process that uses the client too gets the package it expects."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        self.__class__ = types.ModuleType
        try:
            self.__spec__.loader.exec_module(self)
        except BaseException:
            if sys.modules.get(self.__name__) is self:       # as a failed import: not left half made
                del sys.modules[self.__name__]
            raise
        return getattr(self, name)


def _defer_rocketmq_init() -> None:
    """Put the `rocketmq` package in sys.modules without running its __init__ (unless already imported), so
    that importing rocketmq.grpc_protocol loads only the generated modules."""
    if "rocketmq" in sys.modules:
        return
    import importlib.util
    spec = importlib.util.find_spec("rocketmq")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return                                          # not there: the import below says so
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _DeferredPackage
    sys.modules["rocketmq"] = module


try:  # pragma: no branch
    import grpc  # noqa: F401
    _defer_rocketmq_init()
    from rocketmq.grpc_protocol import definition_pb2 as definition  # noqa: F401
    from rocketmq.grpc_protocol import service_pb2 as service  # noqa: F401
    from rocketmq.grpc_protocol import service_pb2_grpc as service_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(
        f"the gRPC endpoint (RocketMQ 5 protocol) needs grpcio and rocketmq-python-client: "
        f"{install_hint('grpc')} ({e})") from e

Code = definition.Code
MessageType = definition.MessageType
Permission = definition.Permission
ClientType = definition.ClientType
DigestType = definition.DigestType
FilterType = definition.FilterType
TransactionResolution = definition.TransactionResolution


def status(code: int = Code.OK, message: str = "OK") -> "definition.Status":
    return definition.Status(code=code, message=message)
