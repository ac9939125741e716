"""Tests of the `rocketmq` Spark data source, stream, sink and writer (src/rmqstore/spark/) on real local SparkSessions."""
