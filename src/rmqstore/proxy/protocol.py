"""The generated `apache.rocketmq.v2` modules, taken from the published `rocketmq-python-client` package
(`rocketmq.grpc_protocol`), which rmqstore's extra `grpc` installs beside grpcio.

Nothing of the protocol lives in this repository. Importing this module without the extra raises
MissingExtraError naming the packages to install."""
from __future__ import annotations

from ..errors import RmqStoreError, install_hint


class MissingExtraError(RmqStoreError, ImportError):
    """The gRPC endpoint needs the `grpc` extra."""


try:  # pragma: no branch
    import grpc  # noqa: F401
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
