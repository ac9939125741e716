"""rmqstore's RocketMQ-compatible server: a name server and a broker over a MessageStore.

See rmqstore.broker.server for the entry points (`serve`, `python -m rmqstore.broker.server`)."""
from .app import BrokerServer

__all__ = ["BrokerServer"]
