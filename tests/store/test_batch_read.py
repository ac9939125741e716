"""batch_read: the bodies of a queue range cut from the commitlog in bulk, equal to what get_message reads."""
from __future__ import annotations

import contextlib
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st


@contextlib.contextmanager
def _dispatched_store(path, commitlog_file_size, msgs):
    from rmqstore.store.conf.config import StoreConfig
    from rmqstore.store.store import MessageStore

    cfg = StoreConfig(mapped_file_size_commit_log=commitlog_file_size)
    with MessageStore.open(path, cfg, start_services=False) as s:
        assert all(r.ok for r in s.put_messages(msgs))
        while s.dispatcher.do_reput():
            pass
        yield s


def _assert_reads_back(s, msgs, queues, lo, hi):
    """Both forms of every queue equal the bodies put, in order, none skipped; and the range [lo, hi)."""
    from rmqstore.store.reads.batch_read import read_queue_bodies

    for q in range(queues):
        want = [m.body for m in msgs if m.queue_id == q]
        stats = {}
        assert read_queue_bodies(s, "T", q, stats=stats) == want
        assert stats["skipped"] == 0
        values, offsets = read_queue_bodies(s, "T", q, as_buffer=True)
        assert [values[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())] == want
        assert read_queue_bodies(s, "T", q, lo, hi) == want[lo:hi]


def test_batch_read_matches_get_message(tmp_path):
    from rmqstore.store.reads.batch_read import read_queue_bodies
    from rmqstore.tools.bench import generate_messages

    msgs = generate_messages(1500, 37, 3, "T")
    with _dispatched_store(tmp_path / "s", 64 * 1024, msgs) as s:      # many commitlog files
        _assert_reads_back(s, msgs, 3, 10, 20)
        assert read_queue_bodies(s, "nope", 0) == []


def test_batch_read_mixed_lengths_ipv6_hosts_and_damaged_units(tmp_path):
    """Bodies of many lengths (some shared by many messages, some by few, empty ones), IPv6 born and store
    hosts (BODYLENGTH 12 or 24 bytes further on), and a unit whose record was overwritten: skipped, counted."""
    import random

    from rmqstore.store.reads.batch_read import read_queue_bodies
    from rmqstore.store.format.message import Message

    rnd = random.Random(7)
    hosts = ["127.0.0.1:10911", "[2001:db8::1]:10911"]
    msgs = []
    for i in range(3000):
        n = rnd.choice([0, 5, 100, 100, 100, 257, rnd.randrange(1, 3000)])
        msgs.append(Message(topic="T", body=rnd.randbytes(n), queue_id=i % 2, born_host=rnd.choice(hosts),
                            store_host=rnd.choice(hosts)))
    with _dispatched_store(tmp_path / "s", 256 * 1024, msgs) as s:
        _assert_reads_back(s, msgs, 2, 700, 1300)
        # damage the record of queue 0's 10th message: its magic code
        off, size, _ = s.consume_queues.find("T", 0).get_unit(10)
        mf = s.commit_log.queue.find_mapped_file_by_offset(off)
        mf.mm[off - mf.file_from_offset + 4:off - mf.file_from_offset + 8] = b"\0\0\0\0"
        want = [m.body for m in msgs if m.queue_id == 0]
        stats = {}
        assert read_queue_bodies(s, "T", 0, stats=stats) == want[:10] + want[11:]
        assert stats["skipped"] == 1
        values, offsets = read_queue_bodies(s, "T", 0, as_buffer=True)
        assert values == b"".join(want[:10] + want[11:]) and len(offsets) == len(want)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4000), st.sampled_from([0, 1, 7, 100, 100, 100, 300])), max_size=120),
       st.integers(0, 40))
def test_bodies_list_and_buffer_equal_slices(cuts, extra):
    import numpy as np

    from rmqstore.store.reads.batch_read import bodies_buffer, bodies_list

    data = bytes(range(256)) * 20
    cuts = [(a, n) for a, n in cuts] + [(17, 3)] * extra      # a length many bodies share
    starts = np.array([a for a, _ in cuts], dtype=np.int64)
    lens = np.array([n for _, n in cuts], dtype=np.int64)
    arr = np.frombuffer(data, dtype=np.uint8)
    want = [data[a:a + n] for a, n in cuts]
    assert bodies_list(arr, starts, lens) == want
    values, offsets = bodies_buffer(arr, starts, lens)
    assert offsets.tolist() == [0] + list(itertools.accumulate(len(w) for w in want))
    assert values.tobytes() == b"".join(want)


def test_bodies_of_64_kib_and_more():
    """Lengths past 16 bits are ordered without the 16-bit radix key."""
    import numpy as np

    from rmqstore.store.reads.batch_read import bodies_buffer, bodies_list

    data = bytes(range(251)) * 2000
    cuts = [(5, 70_000), (3, 2), (9, 70_000), (1, 65_536), (0, 65_535)] + [(11, 2)] * 20
    starts = np.array([a for a, _ in cuts], dtype=np.int64)
    lens = np.array([n for _, n in cuts], dtype=np.int64)
    want = [data[a:a + n] for a, n in cuts]
    arr = np.frombuffer(data, dtype=np.uint8)
    assert bodies_list(arr, starts, lens) == want
    assert bodies_buffer(arr, starts, lens)[0].tobytes() == b"".join(want)
