"""The official Node 5.x client (rocketmq-client-nodejs, installed by `make test` into .node/ when npm is
there) against a real `rmqstore serve`: its Producer and SimpleConsumer (tests/node_client.js)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import REPO

pytest.importorskip("grpc")
pytest.importorskip("rocketmq.grpc_protocol")

NODE_MODULES = REPO / ".node" / "node_modules"


@pytest.mark.skipif(shutil.which("node") is None or not (NODE_MODULES / "rocketmq-client-nodejs").exists(),
                    reason="needs node and `make test`'s .node/node_modules/rocketmq-client-nodejs")
def test_node_producer_and_simple_consumer(tmp_path):
    from rmqstore.broker.server import ServerProcess
    with ServerProcess(tmp_path / "store", {"autoCreateTopicEnable": "true"}) as srv:
        r = subprocess.run(["node", str(REPO / "tests" / "node_client.js"), srv.grpc_addr, "T_NODE", "G_NODE", "20"],
                           capture_output=True, text=True, timeout=180,
                           env={**os.environ, "RMQ_NODE_MODULES": str(NODE_MODULES), "HOME": str(tmp_path)})
        assert r.returncode == 0, r.stderr[-3000:] + srv.log_tail()
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert len(out["sent"]) == 20
        assert sorted(out["received"]) == sorted(out["sent"])        # each exactly once
        assert sorted(out["bodies"]) == sorted(f"node {i}" for i in range(20))
        # what the client itself reports: it found every body whole (its digest check; with a CRC32 digest in
        # upper-case hex it flagged every message corrupted, and its FIFO consumer discards those)
        views = {v["id"]: v for v in out["views"]}
        assert [v for v in views.values() if v["corrupted"]] == []
        for i, mid in enumerate(out["sent"]):
            assert views[mid]["tag"] == "N" and views[mid]["keys"] == [f"nk{i}"], views[mid]
            assert views[mid]["properties"].get("idx") == str(i), views[mid]
