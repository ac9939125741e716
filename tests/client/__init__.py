"""Tests of the Python RocketMQ 4.x client (src/rmqstore/client/) against a real `rmqstore serve`."""
