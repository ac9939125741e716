"""Timer messages (RIP-43, RocketMQ 5's files): a message with TIMER_DELIVER_MS or __STARTDELIVERTIME is parked
until it is due, then put to its real topic.

Owns: timer (the put-path hook), timer_service (the wheel service: enqueue, scan, deliver; `install`, the
store extension), timer_wheel, timer_log, timer_checkpoint, timer_progress, timer_recovery, timer_codec.

May import: format, conf, files.
Writes: `{store}/timerwheel`, `{store}/timerlog/<20-digit offset>`, `config/timercheck` (byte layouts in
timer_codec.py); reads (never writes) the earlier `config/timerProgress.json` once (timer_progress.py).
"""
