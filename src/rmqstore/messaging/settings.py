"""Broker settings StoreConfig has no field for, read from a broker.conf's extra keys."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def broker_setting(config, name: str, default: int) -> int:
    """An integer broker setting from the config's extra (broker.conf) keys, else the default."""
    raw = getattr(config, "extra", {}).get(name)
    if raw is None:
        return default
    try:
        return int(str(raw).strip())
    except ValueError:
        log.warning("%s=%r is not an integer; using %d", name, raw, default)
        return default
