"""Tests of RocketMQ 5 gRPC (src/rmqstore/proxy/) with the official 5.x clients; bench_grpc."""
