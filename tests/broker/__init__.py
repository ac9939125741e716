"""Tests of `rmqstore serve` (src/rmqstore/broker/) over real sockets: processors, admin, stats, frames, replication faults, SQL92 subscriptions."""
