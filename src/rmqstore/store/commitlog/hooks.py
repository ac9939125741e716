"""Put-message hooks and store extensions (RocketMQ 5's DefaultMessageStore.putMessageHookList, HookUtils).

A put-message hook sees each message before it is validated and appended and returns the message to store
(itself, or a new one: the delay rewrite stores a DELAY message in SCHEDULE_TOPIC_XXXX) or a failure
PutMessageResult that refuses it. Hooks are what lets features above the engine (delayed messages, timer
messages) change the put path without the engine importing them: the engine only runs the list.

A store extension is a function `install(store)` that MessageStore.start calls after recovery, before any
put is admitted: it registers hooks (MessageStore.register_put_message_hook) and services
(MessageStore.register_service). Extensions registered with register_default_extension are installed in
every store; the top-level package registers the delay (schedule) extension there, so that a plain
`MessageStore.open` behaves as RocketMQ 4's store, which rewrote delayed messages itself.

The contract (docs/architecture.md, "Layout"):
- hooks run in registration order, each on what the previous one returned; the first refusal stops;
- only messages carrying one of a hook's trigger_properties are given to it (None: every message);
- what a hook returns is validated like any other message: a hook cannot bypass validation;
- a hook's exception propagates to the caller; nothing of that call was written (hooks run first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from ..format.message import Message, PutMessageResult, PutMessageStatus

if TYPE_CHECKING:  # pragma: no cover
    from ..format.message_batch import MessageBatch


class PutMessageHook(Protocol):
    """RocketMQ 5's PutMessageHook (hookName, executeBeforePutMessage)."""
    hook_name: str
    trigger_properties: frozenset[str] | None

    def execute_before_put_message(self, msg: Message) -> Message | PutMessageResult: ...


# install(store) of every store; (name, install) in registration order
StoreExtension = Callable[..., None]
_DEFAULT_EXTENSIONS: dict[str, StoreExtension] = {}


def register_default_extension(name: str, install: StoreExtension) -> None:
    """Install `install(store)` in every MessageStore started from now on (the same name replaces)."""
    _DEFAULT_EXTENSIONS[name] = install


def default_extensions() -> list[StoreExtension]:
    return list(_DEFAULT_EXTENSIONS.values())


@dataclass(frozen=True)
class PutMessageHooks:
    """An immutable hook list (the store swaps it whole: puts read it without a lock)."""
    hooks: tuple = ()
    triggers: frozenset[str] | None = frozenset()    # union of the hooks' trigger properties; None: all

    def with_hook(self, hook: PutMessageHook) -> "PutMessageHooks":
        return PutMessageHooks.of(tuple(h for h in self.hooks if h.hook_name != hook.hook_name) + (hook,))

    def without(self, name: str) -> "PutMessageHooks":
        return PutMessageHooks.of(tuple(h for h in self.hooks if h.hook_name != name))

    @staticmethod
    def of(hooks: tuple) -> "PutMessageHooks":
        triggers: frozenset[str] | None = frozenset()
        for h in hooks:
            t = h.trigger_properties
            triggers = None if t is None or triggers is None else triggers | frozenset(t)
        return PutMessageHooks(hooks, triggers)

    def wants(self, properties) -> bool:
        """Whether a message with these property names (a dict, or a MessageBatch's columns) needs the hooks."""
        if not self.hooks:
            return False
        t = self.triggers
        return t is None or (bool(properties) and not t.isdisjoint(properties))

    def run(self, msg: Message) -> Message | PutMessageResult:
        """The message to store after every hook, or the refusal of the first hook that refused it."""
        for h in self.hooks:
            t = h.trigger_properties
            if t is not None and (not msg.properties or t.isdisjoint(msg.properties)):
                continue
            out = h.execute_before_put_message(msg)
            if type(out) is PutMessageResult:
                if out.status is PutMessageStatus.PUT_OK:
                    raise ValueError(f"put-message hook {h.hook_name} answered PUT_OK for a message it did "
                                     f"not store: a hook refuses with a failure status or returns a message")
                return out
            msg = out
        return msg

    def run_all(self, msgs: list[Message]) -> tuple[list[Message], dict[int, PutMessageResult]]:
        """Every message through the hooks: (the messages to store, {index in msgs: refusal})."""
        out = msgs
        refused: dict[int, PutMessageResult] = {}
        for i, m in enumerate(msgs):
            if not self.wants(m.properties):
                continue
            r = self.run(m)
            if r is m:
                continue
            if out is msgs:
                out = list(msgs)
            if type(r) is PutMessageResult:
                refused[i] = r
            else:
                out[i] = r
        if refused:
            out = [m for i, m in enumerate(out) if i not in refused]
        return out, refused


def batch_needs_hooks(hooks: PutMessageHooks, batch: "MessageBatch") -> bool:
    """A MessageBatch (columns) whose property names include a trigger goes through the hooks message by
    message (it is expanded); any other keeps the columnar path."""
    return hooks.wants(batch.properties)


def merge_refused(results, refused: dict[int, PutMessageResult], n: int) -> list[PutMessageResult]:
    """Results of the stored messages, in order, with the refusals put back in their places (n in all)."""
    if not refused:
        return results
    it = iter(results)
    return [refused[i] if i in refused else next(it) for i in range(n)]
