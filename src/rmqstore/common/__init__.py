"""What both sides of rmqstore's messaging use, as RocketMQ's rocketmq-common and client share it: the
in-process consumer groups (messaging/) and the network client (client/) import from here, never from
each other."""
