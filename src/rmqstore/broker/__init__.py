"""rmqstore's RocketMQ-compatible server: a name server and a broker over a MessageStore.

See rmqstore.broker.server for the entry points (`serve`, `python -m rmqstore.broker.server`)."""
__all__ = ["BrokerServer"]


def __getattr__(name: str):
    """BrokerServer on first use: `rmqstore --help` and the processes tests start import broker.server
    (its argument parser, ServerProcess) without the whole broker."""
    if name == "BrokerServer":
        from .app import BrokerServer
        return BrokerServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
