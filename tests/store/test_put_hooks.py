"""Put-message hooks (store/commitlog/hooks.py, RocketMQ 5's putMessageHookList) and the import structure they allow:
the engine runs hooks and never imports the messaging layer; the delay rewrite is a hook the schedule
extension registers."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from rmqstore.store.format import codec
from rmqstore.store.format.message import Message, PutMessageResult, PutMessageStatus
from rmqstore.store.format.message_batch import MessageBatch
from rmqstore.store.store import MessageStore
from store_checks import small_config

SRC = Path(__file__).resolve().parents[2] / "src" / "rmqstore"


class Redirect:
    """Moves messages carrying REDIRECT to that topic; refuses those whose REDIRECT is 'no'."""
    hook_name = "redirect"
    trigger_properties = frozenset({"REDIRECT"})

    def __init__(self):
        self.seen = 0

    def execute_before_put_message(self, msg):
        self.seen += 1
        to = msg.properties["REDIRECT"]
        if to == "no":
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, "redirect refused")
        return dataclasses.replace(msg, topic=to)


def test_hook_rewrites_refuses_and_is_skipped_for_other_messages(tmp_path):
    with MessageStore.open(tmp_path / "s", small_config()) as store:
        hook = Redirect()
        store.register_put_message_hook(hook)
        names = [h.hook_name for h in store.put_message_hook_list]
        assert names[0] == "schedule" and names[-1] == "redirect"      # registration order
        r = store.put_message(Message("A", b"1", properties={"REDIRECT": "B"}))
        assert r.ok and store.look_message_by_offset(r.append_result.wrote_offset).topic == "B"
        no = store.put_message(Message("A", b"2", properties={"REDIRECT": "no"}))
        assert no.status is PutMessageStatus.MESSAGE_ILLEGAL and no.reason == "redirect refused"
        assert store.put_message(Message("A", b"3", properties={"K": "v"})).ok
        assert hook.seen == 2                      # not called for a message without its trigger
        # a list: the refused one answered in its place, the others stored
        rs = store.put_messages([Message("A", b"4"), Message("A", b"5", properties={"REDIRECT": "no"}),
                                 Message("A", b"6", properties={"REDIRECT": "C"})])
        assert [x.status for x in rs] == [PutMessageStatus.PUT_OK, PutMessageStatus.MESSAGE_ILLEGAL,
                                          PutMessageStatus.PUT_OK]
        assert store.look_message_by_offset(rs[2].append_result.wrote_offset).topic == "C"
        # a MessageBatch whose columns carry the trigger goes through the hook message by message
        rb = store.put_messages(MessageBatch("A", [b"7", b"8"], properties={"REDIRECT": ["D", "no"]}))
        assert [x.status for x in rb] == [PutMessageStatus.PUT_OK, PutMessageStatus.MESSAGE_ILLEGAL]
        # run_hooks=False: stored as given
        raw = store.put_messages([Message("A", b"9", properties={"REDIRECT": "no"})], run_hooks=False)
        assert raw[0].ok
        store.unregister_put_message_hook("redirect")
        assert store.put_message(Message("A", b"10", properties={"REDIRECT": "no"})).ok
        assert store.wait_dispatched(10)
        assert store.get_max_offset_in_queue("B", 0) == 1 and store.get_max_offset_in_queue("D", 0) == 1


def test_a_hook_cannot_bypass_validation(tmp_path):
    class Evil:
        hook_name = "evil"
        trigger_properties = None           # every message

        def execute_before_put_message(self, msg):
            return dataclasses.replace(msg, topic="../escape")

    with MessageStore.open(tmp_path / "s", small_config()) as store:
        store.register_put_message_hook(Evil())
        r = store.put_message(Message("A", b"x"))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "topic" in r.reason
    assert not (tmp_path / "escape").exists()


def test_plain_store_gets_the_delay_extension_and_refuses_bad_real_topics(tmp_path):
    with MessageStore.open(tmp_path / "s", small_config()) as store:
        assert store.schedule_service is not None and store.service("schedule") is store.schedule_service
        r = store.put_message(Message("Real", b"x", properties={"DELAY": "2"}))
        assert r.ok
        assert store.look_message_by_offset(r.append_result.wrote_offset).topic == codec.SCHEDULE_TOPIC
        # a delayed message the store would refuse at delivery is refused now, not answered PUT_OK
        bad = store.put_message(Message("bad/topic", b"x", properties={"DELAY": "2"}))
        assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL and "delayed" in bad.reason
    with MessageStore.open(tmp_path / "t", small_config(), start_services=False) as store:
        assert store.schedule_service is not None                  # registered, not started
        r = store.put_message(Message("Real", b"x", properties={"DELAY": "1"}))
        assert store.look_message_by_offset(r.append_result.wrote_offset).topic == codec.SCHEDULE_TOPIC


def _imports(path: Path, package: str) -> set[str]:
    """Every module path.py imports, at any level (function-level and TYPE_CHECKING imports included)."""
    mod = package.split(".")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod[:len(mod) - node.level + 1] if path.name == "__init__.py" else mod[:len(mod) - node.level]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_engine_does_not_import_messaging_and_services_do_not_import_the_facade():
    for name in ("store", "commitlog/commit_log", "durability/flush", "durability/cleanup", "commitlog/hooks",
                 "durability/parts", "format/message", "format/message_batch", "format/validation",
                 "state/running_flags"):
        got = _imports(SRC / "store" / f"{name}.py", "rmqstore.store." + name.replace("/", "."))
        assert not any(m.startswith("rmqstore.messaging") for m in got), (name, got)
        if name != "store":
            assert "rmqstore.store.store" not in got, name     # services get their parts, not the facade


def test_messaging_has_no_import_cycle():
    graph = {}
    for p in (SRC / "messaging").glob("*.py"):
        mod = "rmqstore.messaging" + ("" if p.stem == "__init__" else "." + p.stem)
        graph[mod] = {m for m in _imports(p, mod if p.stem != "__init__" else "rmqstore.messaging")
                      if m.startswith("rmqstore.messaging.")}
    graph = {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for t in graph[m]:
            assert state.get(t) != 1, " -> ".join(path + [t])
            if t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])
