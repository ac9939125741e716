"""The bytes every room shares: the byte layouts of the store's files, the message types, the one record scanner.

Owns: codec (every byte layout of RocketMQ 4.4.0's files: commitlog records v1/v2, consume queue units, index
header/slots/entries, checkpoint; message ids), message and message_batch (Message, MessageExt, results and
status enums; MessageBatch, the columnar batch), java_map (java.util.HashMap's property order),
validation (the one boundary a put crosses), scanner (THE record scanner: Outcome, one validity rule) and
resync (where valid records resume after a damaged range).

May import: nothing of the store (rmqstore.errors only). Every other room imports this one.
Writes: no file; byte layouts are defined in codec.py (timer files: store/timer/timer_codec.py).
"""
