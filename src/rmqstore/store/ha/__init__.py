"""Replication: RocketMQ 4.4.0's master/slave HA, byte-compatible with its brokers on either side.

A master streams its commitlog's bytes to each slave; a slave appends them exactly (its files are
byte-equal to the master's), dispatches them into its own consume queues and index, and reports how far it
holds the log. A SYNC_MASTER answers a put PUT_OK only once a slave reported holding its bytes.

Roles (broker.conf `brokerRole`, config.BrokerRole): ASYNC_MASTER (answers at once, replicates behind),
SYNC_MASTER (answers after the slave: FLUSH_SLAVE_TIMEOUT after syncFlushTimeout, SLAVE_NOT_AVAILABLE at
once with no slave or one more than haSlaveFallbehindMax behind), SLAVE (refuses puts:
SERVICE_NOT_AVAILABLE; brokerId > 0). mappedFileSizeCommitLog must be the same on both sides.

Wire format (one TCP connection per slave, from the slave to the master's HA port, listenPort + 1; every
integer big-endian; no handshake, no version, no checksum):

    slave -> master, repeated:   offset 0  int64  the slave's commitlog max offset
    master -> slave, repeated:   offset 0  int64  commitlog offset of the first data byte
                                 offset 8  int32  n, the data size (0: a heartbeat)
                                 offset 12 n bytes of the master's commitlog from that offset

- The slave reports at once on connecting (RocketMQ's waits 5 s), after every read that appended, and at
  least every haSendHeartbeatInterval (5 s). The master takes the last complete 8-byte value of what it
  read; its first value is where the stream starts. A negative value closes the connection.
- The master sends nothing before the first report. It streams from the reported offset (0: its first
  file; RocketMQ's master starts an empty slave at its last file), at most haTransferBatchSize (32 KiB)
  bytes a frame, never across a file's end (a full file's END_OF_FILE blank goes as bytes); frames cut
  records anywhere. A heartbeat (n = 0) goes when nothing was sent for haSendHeartbeatInterval.
- Either side closes the connection after haHousekeepingInterval (20 s) without reading anything. The
  slave closes when a frame's offset is not its log's end (an empty slave takes any file-aligned offset).

What rmqstore adds within that format (RocketMQ 4.4.0 has none of it; notes/ha-replication.md §3, §6):
- a slave cuts a partial record off its tail, then reports an offset up to 64 KiB below its end: the master
  sends those bytes again and the slave compares them with its own, then checks that the first new bytes
  start a record naming their offset; frames that would cross the slave's file ends are refused;
- a master counts a connection as a slave from its first report on and an acknowledgement only up to what it
  sent on that connection; a slave ahead of it, or below its oldest file, gets nothing and is told so in
  heartbeats (the master's end, or its oldest offset);
- divergence stops the link loudly (failure channel conditions `ha.diverged` on the slave, `ha.slave.<host>`
  on the master; the broker's runtime info; `rmqstore admin brokerStatus`) instead of silently;
  `rmqstore ha-truncate` cuts the slave back to the common prefix, checked byte for byte against the master,
  keeping the cut bytes aside (truncate.py);
- a slave's dispatcher that finds a damaged record makes the slave cut its log there and fetch the master's
  bytes again (slave.HAClient.refetch); a slave dispatches from whatever offset its log starts at.

Modules: protocol (the format, pure), transfer (SYNC_MASTER's waits: GroupTransfer), replica_log (the
slave's appends and checks), master (HAServer, HAConnection), slave (HAClient), service (HAService: its
loop, a thread of its own or the broker's event loop for a master, start()/shutdown()), role (a slave's record, config/brokerRole.json), truncate (the
operator's way out). They import the commitlog and the failure
channel, never the facade, the broker or the messaging layer.
"""
from .service import HAService, HAStatus, SlaveInfo, listen_port

__all__ = ["HAService", "HAStatus", "SlaveInfo", "listen_port"]
