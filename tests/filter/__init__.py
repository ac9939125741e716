"""Tests of SQL92 selectors (src/rmqstore/filter/) against RocketMQ 4.4.0's answers, in process and in Spark."""
