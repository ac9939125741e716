"""The put API of MessageStore: put_message and put_messages (RocketMQ's DefaultMessageStore.putMessage(s)):
the put-message hooks, the commitlog's append (or the SYNC_FLUSH group commit), a failed write recorded, a
SYNC_MASTER's answer once its slave holds the messages."""
from __future__ import annotations

import logging
from typing import Iterable, Sequence

from .commit_log import AppendFailed, log_refused
from .hooks import merge_refused
from ..format.message import Message, PutMessageResult, PutMessageStatus
from ..format.message_batch import MessageBatch

log = logging.getLogger("rmqstore.store.store")     # logged under the name of the module it came from


class StorePutAPI:
    """Mixed into MessageStore (store.py), as the read API is (reads/read_api.py): uses its put_hooks,
    group_commit, commit_log, dispatcher, ha, running_flags, record_write_failure() and _replicated()."""

    # --- put ------------------------------------------------------------------------------------
    def put_message(self, msg: Message, *, wait_slave: bool = True) -> PutMessageResult:
        """Append one message (put_messages for one, without the batch's costs). The message is validated
        first (validation.py: refused with MESSAGE_ILLEGAL / PROPERTIES_SIZE_EXCEEDED and a reason); PUT_OK
        means written at the answered offset and dispatched at the answered queue offset; a failed write
        answers SERVICE_NOT_AVAILABLE (not stored) and the store refuses puts from then on. A SYNC_MASTER
        answers once a slave holds the message (store/ha): FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE when
        not (stored on this store all the same); wait_slave=False answers at once (the caller waits:
        ha.when_replicated)."""
        if self._closed or not self.running_flags.writeable:
            return self.put_messages([msg])[0]      # refused there, with the reason logged
        hooks = self.put_hooks
        t = hooks.triggers                  # hooks.wants, inline (empty without hooks)
        if t is None or (msg.properties and not t.isdisjoint(msg.properties)):
            msg = hooks.run(msg)            # the delay rewrite, ... (hooks.py); validated like any other below
            if isinstance(msg, PutMessageResult):
                log_refused((msg,), "put-message hook")
                return msg
        gc = self.group_commit
        if gc is not None:      # SYNC_FLUSH: appended and flushed by the flusher with others' (flush.put)
            result = gc.put(msg)
            if result is not None:
                ha = self.ha
                if ha is not None:
                    ha.notify()
                    if wait_slave and ha.sync_master:
                        return self._replicated([result], [msg])[0]
                return result
        cl = self.commit_log
        e = cl.encode(msg)                  # CommitLog.put_message, one call less (a measured hot path)
        if type(e) is not tuple:
            log_refused((e,))
            return e
        try:
            result = cl.put_encoded(e)
        except OSError as err:
            self.record_write_failure(err)
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, f"write failed: {err}")
        ha = self.ha
        if ha is not None:
            ha.notify()                     # first: a SYNC_MASTER's answer waits for the slave, not the dispatch
        self.dispatcher.wakeup()
        if ha is not None and wait_slave and ha.sync_master:
            return self._replicated([result], [msg])[0]
        return result

    def put_messages(self, msgs: Iterable[Message] | MessageBatch, *, run_hooks: bool = True,
                     delay_rewrite: bool | None = None, wait_slave: bool = True) -> Sequence[PutMessageResult]:
        """Append messages, or a MessageBatch (columns: the fastest way in); with run_hooks (the default)
        each message goes through the put-message hooks first (hooks.py: a DELAY message goes to
        SCHEDULE_TOPIC_XXXX as CommitLog.putMessage does); run_hooks=False is for services re-putting
        messages that went through them (delay_rewrite is its old name). One result per message, each true
        for that message: a refused one does not stop the others, and a write that fails part way answers
        PUT_OK for exactly the records written before it (they are stored and dispatched) and
        SERVICE_NOT_AVAILABLE for the rest. A SYNC_MASTER answers as put_message does (wait_slave)."""
        if delay_rewrite is not None:
            run_hooks = delay_rewrite
        hooks = self.put_hooks if run_hooks else None
        if isinstance(msgs, MessageBatch):
            if hooks is not None and hooks.wants(msgs.properties):
                msgs = msgs.to_messages()
        else:
            msgs = list(msgs)
        if self._closed or not self.running_flags.writeable:
            why = "the store is closed" if self._closed else f"puts are refused: {self.running_flags.why()}"
            if not self._closed:
                log.warning("%s: put refused: %s", self.path, self.running_flags.why())
            return [PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, why) for _ in range(len(msgs))]
        n, refused = len(msgs), None
        if hooks is not None and hooks.hooks and not isinstance(msgs, MessageBatch):
            msgs, refused = hooks.run_all(msgs)
            if refused:
                first = min(refused)
                log.warning("put-message hook refused %d of %d messages of a batch; the first, message %d (%s): %s",
                            len(refused), n, first, refused[first].status.value, refused[first].reason)
                return merge_refused(self._append(msgs, wait_slave), refused, n)
        return self._append(msgs, wait_slave)

    def _append(self, msgs: list[Message] | MessageBatch, wait_slave: bool = True) -> Sequence[PutMessageResult]:
        """put_messages after the hooks: the commitlog's append, a failed write recorded."""
        try:
            results = self.commit_log.put_messages(msgs)
        except AppendFailed as e:
            self.record_write_failure(e.error)
            results = e.results             # the records written before the failure: dispatched below
        except OSError as e:
            self.record_write_failure(e)
            return [PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, f"write failed: {e}")
                    for _ in range(len(msgs))]
        ha = self.ha
        if ha is not None:
            ha.notify()                     # before the dispatcher (the single put's comment)
        self.dispatcher.wakeup()
        if ha is not None and wait_slave and ha.sync_master:
            return self._replicated(results, msgs)
        return results
