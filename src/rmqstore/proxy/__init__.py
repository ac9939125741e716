"""RocketMQ 5's gRPC protocol (`apache.rocketmq.v2.MessagingService`, what RocketMQ 5's proxy serves) over
rmqstore's store: the official 5.x clients (rocketmq-python-client, rocketmq-client-nodejs, the Java 5
client) produce and consume through `rmqstore serve` on broker.conf `grpcListenPort` (8081 by default).

    protocol   the generated apache.rocketmq.v2 modules, from the published rocketmq-python-client
               package (extra `rmqstore[grpc]`); nothing of the protocol is copied here
    message_id 5.x message ids (MessageIdCodec: version 01, MAC, pid, seconds since 2021, sequence)
    convert    pure conversions between the protocol's Message and the store's Message / MessageExt
    settings   the server's Settings answered on the Telemetry stream
    service    the MessagingService servicer (grpc.aio): route, send, receive, ack, transactions
    pull       PullMessage / offsets (the Node client's push path)
    arrivals   long polling: waiting for a topic's next message
    telemetry  the clients' Telemetry streams; orphaned-transaction checks over them
    server     GrpcProxyServer: start() / shutdown() on the broker's event loop
"""
