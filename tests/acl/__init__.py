"""Tests of plain ACL (src/rmqstore/acl/): signatures, plain_acl.yml, the server's checks, RocketMQ's own client replayed."""
