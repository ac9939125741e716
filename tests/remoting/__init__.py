"""Tests of RocketMQ 4.x remoting (src/rmqstore/remoting/): frames, headers, fastjson, bodies."""
