"""The Spark source's batch parser (spark/records.py) against codec's record-by-record decoding, on random
records: IPv4 and IPv6 hosts, properties strings as written by any producer (keys written twice, empty
items, items without a value separator), any subset of columns. Every row must be codec's answer."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from rmqstore.spark import records as R  # noqa: E402
from rmqstore.store.format import codec, scanner  # noqa: E402

v4_hosts = st.builds(lambda ip, port: f"{ip}:{port}", st.ip_addresses(v=4), st.integers(0, 65535))
v6_hosts = st.builds(lambda ip, port: f"[{ip}]:{port}", st.ip_addresses(v=6), st.integers(0, 65535))
words = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                max_size=8)
names = st.one_of(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a"]), words)
items = st.one_of(st.tuples(names, words).map(lambda kv: f"{kv[0]}\x01{kv[1]}"),    # a pair
                  st.just(""), words,                                            # empty, no separator
                  st.tuples(names, words, words).map(lambda t: f"{t[0]}\x01{t[1]}\x01{t[2]}"))
props_strings = st.lists(items, max_size=6).map("\x02".join)


@st.composite
def record(draw, v6: bool) -> bytes:
    hosts = st.one_of(v4_hosts, v6_hosts) if v6 else v4_hosts
    born_addr, born_port, born_v6 = codec.parse_host(draw(hosts))
    store_addr, store_port, store_v6 = codec.parse_host(draw(hosts))
    sys_flag = (codec.SYSFLAG_BORNHOST_V6 if born_v6 else 0) | (codec.SYSFLAG_STOREHOST_V6 if store_v6 else 0)
    body = draw(st.binary(max_size=40))
    tail = codec.encode_tail(draw(st.sampled_from(["T", "TopicA", "订单Topic"])).encode(),
                             draw(props_strings).encode())
    hs = codec.header_struct(sys_flag)
    return hs.pack(hs.size + len(body) + len(tail), codec.MESSAGE_MAGIC_CODE, codec.body_crc(body),
                   draw(st.integers(0, 7)), 0, draw(st.integers(0, 1 << 40)), draw(st.integers(0, 1 << 50)),
                   sys_flag, draw(st.integers(0, 1 << 42)), born_addr, born_port, draw(st.integers(0, 1 << 42)),
                   store_addr, store_port, 0, 0, len(body)) + body + tail


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.booleans().flatmap(lambda v6: st.lists(record(v6), min_size=1, max_size=12)),
       st.sets(st.sampled_from(R.COLUMNS)).map(lambda s: tuple(c for c in R.COLUMNS if c in s) or None))
def test_batch_rows_are_codecs(recs, columns):
    raw = b"".join(recs)
    buf = np.frombuffer(raw, dtype=np.uint8)
    positions, _, _ = scanner.walk_positions(buf, 0, len(buf))
    assert len(positions) == len(recs)
    rows = R.Records(buf, 1000, positions, len(buf)).batch("broker-x", columns=columns).to_pylist()
    assert all(list(r) == list(columns or R.COLUMNS) for r in rows)
    for r, pos in zip(rows, positions.tolist()):
        d = codec.decode_fields(raw, pos)
        want = {"topic": d.topic, "msgId": codec.create_message_id(d.store_addr, d.store_port, d.physical_offset),
                "bornHost": d.born_host, "storeHost": d.store_host, "body": d.body,
                "properties": sorted(d.properties.items()), "tags": d.properties.get(codec.PROPERTY_TAGS),
                "keys": [k for k in d.properties.get(codec.PROPERTY_KEYS, "").split(codec.KEY_SEPARATOR) if k],
                "queueOffset": d.queue_offset, "commitLogOffset": d.physical_offset, "broker": "broker-x"}
        got = {k: (sorted(v) if k == "properties" else v) for k, v in r.items() if k in want}
        assert got == {k: v for k, v in want.items() if k in got}
