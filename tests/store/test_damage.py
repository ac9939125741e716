"""store/commitlog/damage.py: the accepted-damage record `check --repair` writes (config/damagedRanges.json)."""
from __future__ import annotations

import json

import pytest

from rmqstore.errors import CorruptStoreError
from rmqstore.store.commitlog import damage
from rmqstore.store.commitlog.damage import DamagedRange


def _r(off, n):
    return DamagedRange("commitlog/x", off, n, "why", "t")


def test_merged_and_covered_are_pure():
    pairs = damage.merged([_r(100, 10), _r(0, 5), _r(105, 20), _r(50, 0)])
    assert pairs == [(0, 5), (100, 125)]
    assert damage.covered(pairs, 100, 125) and damage.covered(pairs, 0, 5)
    assert not damage.covered(pairs, 99, 101) and not damage.covered(pairs, 120, 130)
    assert damage.overlapping(pairs, 120, 130) and not damage.overlapping(pairs, 5, 100)


@pytest.mark.parametrize("bad", [[1, 2], {"ranges": {}}, {"ranges": [{"offset": -1, "length": 3}]},
                                 {"ranges": [{"offset": 1, "length": True}]}, {"ranges": ["x"]}])
def test_decode_refuses_a_wrong_shape(bad):
    with pytest.raises(ValueError, match="damagedRanges.json"):
        damage.decode(bad)


def test_record_is_atomic_with_a_backup_and_merges(tmp_path):
    damage.record_ranges(tmp_path, [_r(10, 5)])
    damage.record_ranges(tmp_path, [_r(10, 5), _r(40, 2)])            # the same range is kept once
    assert [(r.offset, r.length) for r in damage.load_ranges(tmp_path)] == [(10, 5), (40, 2)]
    f = damage.damage_file(tmp_path)
    assert json.loads(f.with_name(f.name + ".bak").read_text())["ranges"][0]["offset"] == 10
    f.write_text("{not json")                                           # falls back to the .bak
    assert [(r.offset, r.length) for r in damage.load_ranges(tmp_path)] == [(10, 5)]
    f.with_name(f.name + ".bak").write_text("[]")
    with pytest.raises(CorruptStoreError, match="damagedRanges.json"):
        damage.load_ranges(tmp_path)


def test_quarantine_copies_the_bytes_and_logs_a_line(tmp_path):
    (tmp_path / "commitlog").mkdir()
    f = tmp_path / "commitlog" / f"{1000:020d}"
    f.write_bytes(bytes(range(256)) * 4)
    r = damage.quarantine_range(tmp_path, f, 1000, 16, 32, "body CRC mismatch")
    assert (r.offset, r.length, r.file) == (1016, 32, f"commitlog/{f.name}")
    assert (tmp_path / r.quarantined).read_bytes() == bytes(range(16, 48))
    line = json.loads((tmp_path / "quarantine" / "quarantine.jsonl").read_text())
    assert line["offset"] == 1016 and line["length"] == 32 and line["reason"] == "body CRC mismatch" and line["time"]
