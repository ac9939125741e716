"""In-process messaging over one MessageStore: producers, consumer groups, rebalancing, retry and DLQ,
delayed and transactional messages, consumer offsets and topic configuration (RocketMQ's client and
broker-side services, without a network)."""
