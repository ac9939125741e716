"""Timer messages (RocketMQ 5's RIP-43, TimerMessageStore): a message with a delivery time is parked in the
system topic `rmq_sys_wheel_timer` (queue 0) with REAL_TOPIC / REAL_QID / TIMER_OUT_MS (and TIMER_DELIVER_MS),
as RocketMQ 5's HookUtils does, and put to its real topic and queue when its time comes, never earlier and
within about TIMER_PRECISION_MS after it.

    timer_service.install(store)    # the store extension (rmqstore/__init__.py registers it for every store):
                                    # the "timer" put-message hook and the TimerMessageService ("timer")
    store.put_message(Message("T", b"x", properties={"TIMER_DELIVER_MS": str(t)}))    # parked until t

Any put carrying TIMER_DELIVER_MS (absolute ms), TIMER_DELAY_SEC / TIMER_DELAY_MS (relative) or the 4.x
clients' __STARTDELIVERTIME (absolute ms) goes through TimerHook: due now or earlier, it is stored as it
is; later, it is parked, TIMER_OUT_MS being its wheel slot's time (the delivery time rounded down to the
precision; one precision earlier when it is a multiple of it: RocketMQ's rule, so that the slot is read at
or after the delivery time); beyond timerMaxDelaySec (or an unparseable value) it is refused with
MESSAGE_ILLEGAL naming the property. A put already carrying TIMER_OUT_MS (a delivered timer message) is
left alone.

The parking and delivery service is store/timer/timer_service.py, on RocketMQ 5's files: `timerwheel`,
`timerlog/`, `config/timercheck` (layouts in store/timer/timer_codec.py)."""
from __future__ import annotations

import time

from ..format import codec
from ..format.message import Message, MessageExt, PutMessageResult, PutMessageStatus

TIMER_TOPIC = "rmq_sys_wheel_timer"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"      # the delay-level hook's topic (messaging/schedule.py)
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
PROPERTY_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_START_DELIVER_TIME = "__STARTDELIVERTIME"
TRIGGERS = frozenset({PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS,
                      PROPERTY_START_DELIVER_TIME})
TIMER_PRECISION_MS = 1000          # timerPrecisionMs default
MAX_DELAY_SEC = 3 * 24 * 3600      # timerMaxDelaySec default
NEVER_ENQUEUED_MS = 2 ** 63 - 1    # TIMER_ENQUEUE_MS of a message due when it was read (Long.MAX_VALUE)


def now_ms() -> int:
    return int(time.time() * 1000)


def timer_out_ms(deliver_ms: int, precision_ms: int = TIMER_PRECISION_MS) -> int:
    """The wheel slot's time of a delivery time (HookUtils.transformTimerMessage): rounded down to the
    precision, one precision earlier when it is a multiple of it. The slot is read once the clock has
    passed its end, so at or after deliver_ms."""
    if deliver_ms % precision_ms == 0:
        return deliver_ms - precision_ms
    return deliver_ms // precision_ms * precision_ms


def park(msg: Message, deliver_ms: int, precision_ms: int = TIMER_PRECISION_MS) -> Message:
    """The message as parked in the timer topic: its real topic and queue kept in properties."""
    props = dict(msg.properties)
    props[codec.PROPERTY_REAL_TOPIC] = msg.topic
    props[codec.PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    props[PROPERTY_TIMER_DELIVER_MS] = str(int(deliver_ms))
    props[PROPERTY_TIMER_OUT_MS] = str(timer_out_ms(int(deliver_ms), precision_ms))
    return Message(topic=TIMER_TOPIC, body=msg.body, queue_id=0, flag=msg.flag, sys_flag=msg.sys_flag,
                   born_timestamp=msg.born_timestamp, born_host=msg.born_host, store_host=msg.store_host,
                   reconsume_times=msg.reconsume_times, properties=props)


def unpark(m: MessageExt, enqueue_ms: int, roll: bool = False) -> Message:
    """A parked message as put when its slot is read (TimerMessageStore.convert): to its real topic and
    queue, or, rolled (due beyond the roll window), back to the timer topic with TIMER_ROLL_TIMES + 1.
    TIMER_ENQUEUE_MS / TIMER_DEQUEUE_MS added; TIMER_DELIVER_MS and TIMER_OUT_MS kept, as RocketMQ 5 does."""
    props = dict(m.properties)
    props[PROPERTY_TIMER_ENQUEUE_MS] = str(enqueue_ms)
    props[PROPERTY_TIMER_DEQUEUE_MS] = str(now_ms())
    if roll:
        props[PROPERTY_TIMER_ROLL_TIMES] = str(int(props.get(PROPERTY_TIMER_ROLL_TIMES, "0")) + 1)
        topic, qid = m.topic, m.queue_id
    else:
        topic = props.pop(codec.PROPERTY_REAL_TOPIC)
        qid = int(props.pop(codec.PROPERTY_REAL_QUEUE_ID, "0"))
    return Message(topic=topic, body=m.body or b"", queue_id=qid, flag=m.flag, sys_flag=m.sys_flag,
                   born_timestamp=m.born_timestamp, born_host=m.born_host, reconsume_times=m.reconsume_times,
                   properties=props)


def deliver_ms_of(props: dict[str, str], now: int) -> int | None:
    """The absolute delivery time a message asks for (ms), None for none; ValueError for a bad value."""
    for key, scale, relative in ((PROPERTY_TIMER_DELAY_SEC, 1000, True), (PROPERTY_TIMER_DELAY_MS, 1, True),
                                 (PROPERTY_TIMER_DELIVER_MS, 1, False), (PROPERTY_START_DELIVER_TIME, 1, False)):
        v = props.get(key)
        if v is None:
            continue
        try:
            t = int(v.strip()) * scale
        except ValueError:
            raise ValueError(f"{key}={v!r} is not an integer") from None
        return now + t if relative else t
    return None


class TimerHook:
    """The put-message hook: a message due later than now is parked in the timer topic."""
    hook_name = "timer"
    trigger_properties = TRIGGERS

    def __init__(self, precision_ms: int = TIMER_PRECISION_MS, max_delay_sec: int = MAX_DELAY_SEC):
        self.precision_ms = precision_ms
        self.max_delay_ms = max_delay_sec * 1000

    def execute_before_put_message(self, msg: Message) -> Message | PutMessageResult:
        if msg.topic in (TIMER_TOPIC, SCHEDULE_TOPIC) or msg.sys_flag & codec.TRANSACTION_TYPE_MASK \
                or PROPERTY_TIMER_OUT_MS in msg.properties:
            return msg          # parked already (by this hook or the delay-level one), delivered, or a transaction's
        now = now_ms()
        try:
            due = deliver_ms_of(msg.properties, now)
        except ValueError as e:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, f"timer message to {msg.topic}: {e}")
        if due is None or due <= now:
            if due is not None and PROPERTY_TIMER_DEL_UNIQKEY in msg.properties:
                return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None,
                                        f"timer delete message to {msg.topic}: its delivery time has passed")
            return msg
        if due - now > self.max_delay_ms:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None,
                                    f"timer message to {msg.topic}: delivery in {(due - now) // 1000} s exceeds "
                                    f"timerMaxDelaySec={self.max_delay_ms // 1000}")
        return park(msg, due, self.precision_ms)

