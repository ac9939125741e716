"""TimerMessageService: RocketMQ 5's TimerMessageStore over its own files (layouts in store/timer/timer_codec.py).

    {root}/timerwheel          store/timer/timer_wheel.py   2 * 604,800 slots of 32 bytes
    {root}/timerlog/           store/timer/timer_log.py     52-byte units in 100 MiB mapped files
    {root}/config/timercheck   store/timer/timer_checkpoint.py

One thread does what RocketMQ 5 spreads over its enqueue, dequeue and flush services:
- enqueue: read rmq_sys_wheel_timer queue 0 from the checkpointed queue offset; a message whose slot
  (TIMER_OUT_MS) is already behind the wheel's write time (now, rounded to the precision) is put at once
  (TIMER_ENQUEUE_MS = Long.MAX_VALUE); any other gets a timerlog unit whose prevPos is the slot's lastPos,
  and the slot's lastPos (firstPos for the first, num + 1) then points at it. A message due beyond the
  roll window (timerRollWindowSlot, 2 days) is linked in a slot inside the window with MAGIC_ROLL and put
  back into the timer topic when read (TIMER_ROLL_TIMES + 1), to be linked again.
- dequeue: for each slot from the read time to the write time (numpy finds the next used one), follow
  lastPos -> prevPos, read the parked messages from the commitlog and put them to REAL_TOPIC / REAL_QID in
  enqueue order; delete units (TIMER_DEL_UNIQKEY) cancel the slot's messages with that key. Then the read
  time moves past the slot.
- checkpoint (after each slot delivered and each round that linked something; RocketMQ flushes every
  second): the timerlog and wheel are flushed, then config/timercheck records the read time, the
  timerlog's flushed end and the queue offset.
- recovery (at open): store/timer/timer_recovery.py.
- cleanup (every 30 s): timerlog files whose last unit's message is below the commitlog's min offset
  (removed by the commitlog cleanup) are deleted, as RocketMQ does.

Delivery is at least once, as RocketMQ 5's: SIGKILLed after putting a slot's messages (or messages due
when read) and before the checkpoint that records it, they are delivered again at the next open. Nothing
acknowledged is lost: a parked message is in the commitlog when its put is acknowledged (in the timer
topic's queue once dispatched, by recovery too), and a checkpoint never covers what was not linked or
delivered. rmqstore checkpoints after every slot that delivered, so the window is one slot.

Migration: a store of the earlier rmqstore design (config/timerProgress.json, store/timer/timer_progress.py) is
continued from its `committed` offset, its `delivered` ones skipped. Those parked messages carry no
TIMER_OUT_MS: their TIMER_DELIVER_MS is used.

The files are created when the first timer message is parked (a store that never parks one has none)."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from ..format import codec
from ...errors import StoreClosedError
from ..format.message import GetMessageStatus, Message, MessageExt, PutMessageStatus
from .timer import (NEVER_ENQUEUED_MS, PROPERTY_START_DELIVER_TIME, PROPERTY_TIMER_DEL_UNIQKEY, TimerHook,
                    PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_OUT_MS, TIMER_PRECISION_MS, TIMER_TOPIC, now_ms,
                    timer_out_ms, unpark)
from .timer_checkpoint import TimerCheckpointFile, next_version, read_timer_checkpoint
from .timer_codec import (MAGIC_DEFAULT, MAGIC_DELETE, MAGIC_ROLL, TimerCheckpoint, TimerLogUnit, encode_unit,
                          is_magic_ok, java_string_hash, roll_window_slots)
from .timer_log import TimerLog
from .timer_progress import FILE_NAME as PROGRESS_FILE_NAME, read_earlier_progress, retire_earlier_progress
from .timer_recovery import recover_timer
from .timer_wheel import TimerWheel

log = logging.getLogger(__name__)

SCAN_BATCH = 256
DELIVER_BATCH = 512             # messages of a slot put at a time (RocketMQ splits a slot into lists too)
CLEAN_INTERVAL_MS = 30_000      # timerlog files of removed commitlog messages deleted this often
_NO_RETRY = (PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)


class TimerMessageService:
    """Links parked timer messages into the wheel and delivers them when due (module doc)."""

    def __init__(self, store, precision_ms: int = TIMER_PRECISION_MS, *,
                 timer_log_file_size: int | None = None, roll_window: int | None = None):
        self.store = store
        self.precision_ms = precision_ms
        cfg = store.config
        self.timer_log_file_size = timer_log_file_size or cfg.mapped_file_size_timer_log
        self.roll_window = roll_window_slots(roll_window or cfg.timer_roll_window_slot)
        root = Path(store.path)
        self.wheel_path = root / "timerwheel"
        self.log_path = root / "timerlog"
        self.check_path = root / "config" / "timercheck"
        self.progress_path = root / "config" / PROGRESS_FILE_NAME
        self.wheel: TimerWheel | None = None
        self.timer_log: TimerLog | None = None
        self.checkpoint_file: TimerCheckpointFile | None = None
        self.checkpoint = TimerCheckpoint()
        self.curr_queue_offset = 0
        self.curr_read_ms = 0
        self.curr_write_ms = 0
        self.skip: set[int] = set()         # migrated: wheel queue offsets the old design delivered
        self._earlier = False               # config/timerProgress.json to retire once skip is passed
        self._slot_done: tuple[int, set[int]] = (-1, set())    # a slot being retried: units already put
        self._dirty = False
        self._cleaned_ms = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        if self.wheel_path.exists() or self.check_path.exists() or self.progress_path.exists() \
                or self.store.get_max_offset_in_queue(TIMER_TOPIC, 0) > 0:
            self._open()
        self.store.dispatcher.add_listener(self._on_arrival)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="TimerMessageService", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self.store.dispatcher.remove_listener(self._on_arrival)
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        if self.wheel is not None:
            try:
                self.write_checkpoint()
            except OSError as e:
                log.error("timer: final checkpoint of %s failed: %s", self.check_path, e)
            self.timer_log.shutdown()
            self.wheel.shutdown()
            self.checkpoint_file.shutdown()
            self.wheel = None

    def _open(self) -> None:
        cp = read_timer_checkpoint(self.check_path)
        self.wheel = TimerWheel(self.wheel_path, self.precision_ms)
        self.timer_log = TimerLog(self.log_path, self.timer_log_file_size)
        self.timer_log.load()
        self.checkpoint_file = TimerCheckpointFile(self.check_path)
        self.checkpoint = cp or TimerCheckpoint()
        self._recover(self.checkpoint)

    def _on_arrival(self, topic: str, queue_id: int, next_offset: int, store_ts: int) -> None:
        if topic == TIMER_TOPIC:
            self._wake.set()

    # --- recovery ---------------------------------------------------------------------------------
    def _recover(self, cp: TimerCheckpoint) -> None:
        r = recover_timer(self.store, self.wheel, self.timer_log, cp, now_ms())
        self.curr_read_ms = r.read_time_ms
        self.curr_write_ms = now_ms() // self.precision_ms * self.precision_ms
        self._migrate_progress(r.queue_offset)
        log.info("timer: recovered read time %d, queue offset %d, timerlog end %d", self.curr_read_ms,
                 self.curr_queue_offset, r.timer_log_end)
        self.write_checkpoint()

    def _migrate_progress(self, queue_offset: int) -> None:
        """Honour the earlier design's config/timerProgress.json (store/timer/timer_progress.py)."""
        old = read_earlier_progress(self.progress_path)
        self._earlier = old is not None
        if old is not None:
            queue_offset = max(queue_offset, old.committed)
            self.skip = {o for o in old.delivered if o >= queue_offset}
            log.info("timer: %s: continuing from wheel queue offset %d (%d delivered above it)",
                     self.progress_path, queue_offset, len(self.skip))
        lo, hi = self.store.get_min_offset_in_queue(TIMER_TOPIC, 0), self.store.get_max_offset_in_queue(TIMER_TOPIC, 0)
        self.curr_queue_offset = min(max(queue_offset, lo), hi)

    # --- the service loop -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            wait = self.precision_ms / 1000
            try:
                self.run_once()
                if self.wheel is not None:      # else no timer yet: an arrival wakes the loop
                    nxt = self.curr_write_ms + self.precision_ms
                    wait = max(0.01, min(wait, (nxt - now_ms()) / 1000 + 0.005))
            except StoreClosedError:
                return          # the store closes (it stops its services next)
            except Exception:
                log.exception("timer: enqueue or delivery failed; retrying in %.1f s", wait)
            self._wake.wait(wait)
            self._wake.clear()

    def run_once(self) -> None:
        """One round: enqueue what arrived, deliver what is due, checkpoint if anything changed."""
        if self.wheel is None:
            if self.store.get_max_offset_in_queue(TIMER_TOPIC, 0) <= self.curr_queue_offset:
                return
            self._open()
        self.curr_write_ms = max(self.curr_write_ms, now_ms() // self.precision_ms * self.precision_ms)
        while self.enqueue():
            pass
        self.dequeue()
        if now_ms() - self._cleaned_ms >= CLEAN_INTERVAL_MS:
            self._cleaned_ms = now_ms()
            if self.timer_log.delete_expired(self.store.get_min_phy_offset()):
                self._dirty = True
        if self._dirty:         # idle, the read time is not recorded: empty slots re-read cost nothing
            self.write_checkpoint()

    def write_checkpoint(self) -> None:
        """Flush the timerlog and the wheel, then record the progress in config/timercheck."""
        self.timer_log.flush()
        self.wheel.flush()
        cp = TimerCheckpoint(self.curr_read_ms, self.timer_log.flushed_where, self.curr_queue_offset,
                             self.curr_queue_offset, self.checkpoint.state_version, self.checkpoint.timestamp,
                             self.checkpoint.counter)
        if (cp.last_read_time_ms, cp.last_timer_queue_offset) != (self.checkpoint.last_read_time_ms,
                                                                   self.checkpoint.last_timer_queue_offset):
            cp = next_version(cp)
        self.checkpoint_file.flush(cp)
        self.checkpoint = cp
        self._dirty = False
        if self.skip and self.curr_queue_offset > max(self.skip):
            self.skip = set()
        if self._earlier and not self.skip:
            retire_earlier_progress(self.progress_path, self.check_path)
            self._earlier = False

    # --- enqueue ------------------------------------------------------------------------------------
    def enqueue(self) -> int:
        """Link (or put, if already due) the next batch of parked messages; how many were read."""
        r = self.store.get_message("TIMER_ENQUEUE", TIMER_TOPIC, 0, self.curr_queue_offset, SCAN_BATCH)
        if r.status is not GetMessageStatus.FOUND:
            if r.status in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY):
                log.warning("timer: wheel queue offset %d out of range (%s): going on from %d",
                            self.curr_queue_offset, r.status.name, r.next_begin_offset)
                self.curr_queue_offset = r.next_begin_offset
                self._dirty = True
            return 0
        due_now: list[MessageExt] = []
        for m in r.messages:
            if m.queue_offset in self.skip:
                self._advance_queue(m.queue_offset, due_now)
                continue
            delayed = self._delayed_time(m)
            if delayed < self.curr_write_ms:
                due_now.append(m)
            else:
                self._put_now(due_now)      # in queue order: what is linked comes after them
                self._link(m, delayed)
                self._advance_queue(m.queue_offset, due_now)
        self._put_now(due_now)
        return len(r.messages)

    def _advance_queue(self, queue_offset: int, due_now: list) -> None:
        if not due_now:
            self.curr_queue_offset = queue_offset + 1
            self._dirty = True

    def _delayed_time(self, m: MessageExt) -> int:
        """The message's slot time: TIMER_OUT_MS, or (parked by the earlier design) its delivery time's."""
        for key in (PROPERTY_TIMER_OUT_MS, PROPERTY_TIMER_DELIVER_MS, PROPERTY_START_DELIVER_TIME):
            v = m.properties.get(key)
            if v is None:
                continue
            try:
                t = int(v)
            except ValueError:
                log.warning("timer: %s at wheel queue offset %d (commitlog %d) has a bad %s %r: delivered now",
                            m.msg_id, m.queue_offset, m.commit_log_offset, key, v)
                return 0
            return t if key == PROPERTY_TIMER_OUT_MS else timer_out_ms(t, self.precision_ms)
        log.warning("timer: %s at wheel queue offset %d (commitlog %d) has no TIMER_OUT_MS: delivered now",
                    m.msg_id, m.queue_offset, m.commit_log_offset)
        return 0

    def _put_now(self, due_now: list[MessageExt]) -> None:
        """Put messages already due when read (never linked; a due delete message is not put, as in
        RocketMQ); the queue offset moves past them, or stops at the first that could not be put."""
        if not due_now:
            return
        batch = list(due_now)
        due_now.clear()
        pairs = [(m, self._convert(m, NEVER_ENQUEUED_MS, False)) for m in batch if not self._is_delete(m)]
        todo = [m for m, c in pairs if c is not None]
        k = self._put([c for _m, c in pairs if c is not None], todo)
        self._dirty = True
        if k < len(todo):
            self.curr_queue_offset = todo[k].queue_offset
            raise RuntimeError(f"timer: putting due messages failed at wheel queue offset {todo[k].queue_offset}")
        self.curr_queue_offset = batch[-1].queue_offset + 1

    def _put(self, msgs: list[Message], sources: list[MessageExt]) -> int:
        """Put msgs (their parked originals in sources); the index of the first that failed and may be
        retried (len(msgs) if none). One refused for good (illegal) is logged with where it was parked."""
        if not msgs:
            return 0
        results = self.store.put_messages(msgs, run_hooks=False)
        for i, (r, src) in enumerate(zip(results, sources)):
            if r.ok:
                continue
            if r.status in _NO_RETRY:
                log.error("timer: %s parked at commitlog %d refused by %s (%s): not delivered", src.msg_id,
                          src.commit_log_offset, r.status.name, r.reason)
                continue
            log.error("timer: %s parked at commitlog %d: put failed with %s (%s); retrying", src.msg_id,
                      src.commit_log_offset, r.status.name, r.reason)
            return i
        return len(msgs)

    @staticmethod
    def _convert(m: MessageExt, enqueue_ms: int, roll: bool) -> Message | None:
        """The message to put for a parked one; None (logged, naming it) when it has no usable REAL_TOPIC /
        REAL_QID: it cannot be delivered, and retrying would stop every message behind it."""
        try:
            return unpark(m, enqueue_ms, roll)
        except (KeyError, ValueError) as e:
            log.error("timer: %s parked at commitlog %d cannot be delivered (REAL_TOPIC / REAL_QID: %r): "
                      "skipped", m.msg_id, m.commit_log_offset, e)
            return None

    @staticmethod
    def _is_delete(m: MessageExt) -> bool:
        return PROPERTY_TIMER_DEL_UNIQKEY in m.properties

    def _link(self, m: MessageExt, delayed: int) -> None:
        """TimerMessageStore.doEnqueue: append a unit and make it the slot's last."""
        write = self.curr_write_ms
        magic = MAGIC_DEFAULT
        window = self.roll_window * self.precision_ms
        if delayed - write >= window:
            magic |= MAGIC_ROLL
            if delayed - write - window < self.roll_window // 3 * self.precision_ms:
                delayed = write + self.roll_window // 2 * self.precision_ms
            else:
                delayed = write + window
        delete = self._is_delete(m)
        if delete:
            magic |= MAGIC_DELETE
        slot = self.wheel.get_slot(delayed)
        unit = TimerLogUnit(slot.last_pos, magic, write, delayed - write, m.commit_log_offset, m.store_size,
                            java_string_hash(m.properties.get(codec.PROPERTY_REAL_TOPIC)))
        pos = self.timer_log.append(encode_unit(unit))
        self.wheel.put_slot(delayed, pos if slot.first_pos == -1 else slot.first_pos, pos,
                            slot.num - 1 if delete else slot.num + 1, slot.magic)

    # --- dequeue ------------------------------------------------------------------------------------
    def dequeue(self) -> int:
        """Deliver every slot before the write time; how many messages were put."""
        n = 0
        while self.curr_read_ms < self.curr_write_ms and not self._stop.is_set():
            t = self.wheel.next_slot_time(self.curr_read_ms, self.curr_write_ms)
            if t is None:
                self.curr_read_ms = self.curr_write_ms
                break
            self.curr_read_ms = t
            n += self._dequeue_slot(t)
            self.curr_read_ms = t + self.precision_ms
            self._dirty = True
            self.write_checkpoint()       # the slot is done: not delivered again after a crash
        return n

    def _dequeue_slot(self, t: int) -> int:
        """Put the slot's messages (deleted ones left out), DELIVER_BATCH at a time; raises when a put must
        be retried (the units already put are remembered: a retry does not put them again)."""
        done_t, done = self._slot_done
        if done_t != t:
            done = set()
        units = [(pos, u) for pos, u in self.timer_log.chain(self.wheel.get_slot(t).last_pos, f"slot {t}")
                 if pos not in done and is_magic_ok(u.magic)]
        deleted = {m.properties.get(PROPERTY_TIMER_DEL_UNIQKEY, "")      # delete messages: cancel, never put
                   for _pos, _u, m in self._read(t, [(p, u) for p, u in units if u.is_delete and not u.is_roll])}
        normal = [(p, u) for p, u in units if not u.is_delete or u.is_roll]
        n = 0
        for i in range(0, len(normal), DELIVER_BATCH):
            msgs, sources, positions = [], [], []
            for pos, u, m in self._read(t, normal[i:i + DELIVER_BATCH]):
                key = f"{m.properties.get(codec.PROPERTY_REAL_TOPIC)}+{m.properties.get(codec.PROPERTY_UNIQ_KEY)}"
                if key in deleted:
                    log.info("timer: %s (commitlog %d) cancelled by a delete message", m.msg_id, u.offset_py)
                    continue
                c = self._convert(m, u.curr_write_time_ms, u.is_roll)
                if c is not None:
                    msgs.append(c)
                    sources.append(m)
                    positions.append(pos)
            k = self._put(msgs, sources)
            done.update(positions[:k])
            n += k
            if k < len(msgs):
                self._slot_done = (t, done)
                raise RuntimeError(f"timer: delivering slot {t} failed; retrying")
        self._slot_done = (-1, set())
        return n

    def _read(self, t: int, units: list[tuple[int, TimerLogUnit]]) -> list[tuple[int, TimerLogUnit, MessageExt]]:
        """The parked messages of these units; one not readable is logged, naming it, and left out."""
        out = []
        for pos, u in units:
            m = self.store.look_message_by_offset(u.offset_py, u.size_py)
            if m is None:
                log.error("timer: slot %d: the message of timerlog unit %d (commitlog %d, %d bytes) is not "
                          "readable (removed by cleanup?): not delivered", t, pos, u.offset_py, u.size_py)
            else:
                out.append((pos, u, m))
        return out


def install(store) -> None:
    """The store extension: TimerHook and the TimerMessageService ("timer"), with the store config's
    timerPrecisionMs / timerMaxDelaySec / timerRollWindowSlot / mappedFileSizeTimerLog."""
    precision = store.config.timer_precision_ms
    store.register_put_message_hook(TimerHook(precision, store.config.timer_max_delay_sec))
    store.register_service("timer", TimerMessageService(store, precision))
