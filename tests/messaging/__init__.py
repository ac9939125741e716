"""Tests of the in-process layer (src/rmqstore/messaging/): producers, consumer groups, delay, transactions, POP."""
