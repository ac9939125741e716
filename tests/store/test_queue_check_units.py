"""queue_check.unit_problems reads the records units point at from the commitlog files' bytes: small files
as one concatenated buffer, large ones file by file (queue_check._buffers). Both ways must give every unit
the same code, and no unit may be judged by bytes of the next file: units at record starts, inside
records, at files' readable ends (a file cut mid-record), past the end, of another queue, on random
offsets."""
from __future__ import annotations

import random

import numpy as np

from rmqstore.store.format import codec
from rmqstore.store.recovery import queue_check as QC
from rmqstore.store.format.scanner import walk_positions


def _files(rng: random.Random):
    """Three commitlog files of records (topic T, queue 1, queue offsets counting), the second one's readable
    bytes cut inside a record (its head readable, its topic and properties not); (files as unit_problems takes them, [(commitlog offset, size, qoff)])."""
    size, files, recs, qoff = 4096, [], [], 0
    for base in (0, size, 2 * size):
        buf = b""
        while True:
            body = rng.randbytes(rng.randrange(0, 200))
            r = codec.encode_record(queue_id=1, flag=0, queue_offset=qoff, physical_offset=base + len(buf),
                                    sys_flag=0, born_timestamp=1, born_host="1.2.3.4:5", store_timestamp=2,
                                    store_host="1.2.3.4:6", reconsume_times=0, prepared_transaction_offset=0,
                                    body=body, topic="T", properties={"a": "b"})
            if len(buf) + len(r) > size:
                break
            recs.append((base + len(buf), len(r), qoff))
            buf += r
            qoff += 1
        raw = np.frombuffer(buf + bytes(size - len(buf)), dtype=np.uint8)
        # the second file's readable part ends 5 bytes before the end of one of its records
        readable = len(buf) if base != size else recs[-3][0] - base + recs[-3][1] - 5
        files.append((base, base + size, lambda raw=raw, n=readable: raw[:n]))
    assert len(walk_positions(files[0][2](), 0, len(files[0][2]()))[0]) > 5
    return files, recs


def test_units_get_the_same_codes_from_one_buffer_or_file_by_file(monkeypatch):
    rng = random.Random(5)
    files, recs = _files(rng)
    off, size, logical = [], [], []
    for o, n, q in recs:
        off.append(o), size.append(n), logical.append(q)
    for _ in range(300):                                # random offsets, sizes, queue offsets
        off.append(rng.randrange(-10, 3 * 4096 + 50)), size.append(rng.randrange(1, 300))
        logical.append(rng.randrange(0, len(recs)))
    for f in files:                                     # the last bytes of each file's readable part
        for back in (1, 4, 20, 87, 88, 120):
            end = f[0] + len(f[2]())
            off.append(end - back), size.append(back), logical.append(0)
    off, size, logical = (np.array(a, dtype=np.int64) for a in (off, size, logical))
    order = np.argsort(off, kind="stable")
    off, size, logical = off[order], size[order], logical[order]
    codes = {}
    for mode, limit in (("one buffer", 1 << 30), ("file by file", 0)):
        monkeypatch.setattr(QC, "CONCAT_BYTES", limit)
        codes[mode] = QC.unit_problems(off, size, logical, 1, b"T", files, 0)
        assert (QC.unit_problems(off, size, logical, 2, b"T", files, 0)[codes[mode] == QC.UNIT_OK]
                == QC.UNIT_OTHER_QUEUE).all()
    assert (codes["one buffer"] == codes["file by file"]).all()
    c = codes["one buffer"]
    by = dict(zip(off.tolist(), c.tolist()))
    cut = recs[-3 - sum(1 for o, _, _ in recs if o >= 2 * 4096)]     # the record the second file's cut is in
    assert sum(c == QC.UNIT_OK) >= len(recs) - 3 and by[recs[0][0]] == QC.UNIT_OK
    assert by[cut[0]] == QC.UNIT_NOT_A_RECORD       # its bytes run past the readable end: never the next file's
