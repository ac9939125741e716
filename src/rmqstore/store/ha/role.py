"""The role a store last served in, kept in `config/brokerRole.json` ({"brokerRole": "SLAVE", "master": ...}).

A slave's log must only ever grow by its master's bytes: a message appended to it by anything else (a `rmqstore
load` or a Spark write into the stopped slave's directory, without its broker.conf) would make it diverge
from its master for good. So a store opened as a SLAVE records it here; a store opened later with no
brokerRole whose record says SLAVE refuses puts as a slave does; a store opened (and started) with brokerRole
set to a master role is the operator's promotion: the record goes, with a warning. RocketMQ ignores the file.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

FILE = "brokerRole.json"


def path(root: str | Path) -> Path:
    return Path(root) / "config" / FILE


def was_slave(root: str | Path) -> str | None:
    """The master the store was last a slave of ("" when unknown), or None when it was not a slave."""
    p = path(root)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("%s: unreadable (%s): taken as a SLAVE's record", p, e)
        return ""
    return str(d.get("master") or "") if isinstance(d, dict) and d.get("brokerRole") == "SLAVE" else None


def record_slave(root: str | Path, master: str | None) -> None:
    p = path(root)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(FILE + ".tmp")
    tmp.write_text(json.dumps({"brokerRole": "SLAVE", "master": master or ""}), encoding="utf-8")
    os.replace(tmp, p)


def promoted(root: str | Path, role: str) -> None:
    """Started with its services as a master: the SLAVE record goes (the operator's promotion)."""
    master = was_slave(root)
    if master is None:
        return
    log.warning("%s: was a SLAVE%s, now starts as %s (promoted)", root, f" of {master}" if master else "", role)
    path(root).unlink(missing_ok=True)
