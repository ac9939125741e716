"""rmqstore's RocketMQ-compatible server: a name server and a broker over a MessageStore.

See rmqstore.server for the entry points (`serve`, `python -m rmqstore.server`)."""
from .app import BrokerServer

__all__ = ["BrokerServer"]
