"""`rmqstore ha-truncate STORE (--master HOST:PORT | --to OFFSET) [--dry-run]`: store/ha/truncate.py."""
from __future__ import annotations

import argparse
import json

from ..errors import ConfigError
from ..store.commitlog.commit_log import CommitLog
from ..store.conf.config import StoreConfig
from ..store.ha import truncate


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", help="the slave's store directory (stopped)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--master", metavar="HOST:PORT", help="the master's HA port (listenPort + 1): compare with it")
    how.add_argument("--to", type=int, metavar="OFFSET", help="cut at the last whole record at or below OFFSET")
    p.add_argument("--dry-run", action="store_true", help="say what would be cut, change nothing")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the master (10)")


def run(args: argparse.Namespace, cfg: StoreConfig) -> int:
    from ..store.recovery.recovery import plan_recovery, read_inputs
    end = plan_recovery(read_inputs(args.store), cfg).commitlog.end     # where the valid log ends (read only)
    cl = CommitLog(args.store, cfg)
    cl.load()
    cl.queue.set_positions_from(end)
    try:
        if args.master:
            host, _, port = args.master.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError("--master", args.master, "must be HOST:PORT (the master's HA port)")
            prefix, master_end = truncate.common_prefix(cl, args.master, args.timeout)
            why = f"ha-truncate: differs from master {args.master} from offset {prefix}"
        else:
            if args.to < 0:
                raise ConfigError("--to", args.to, "must not be negative")
            prefix, master_end = args.to, None
            why = f"ha-truncate --to {args.to}"
        plan = truncate.plan_cut(cl, prefix, master_end)
    finally:
        cl.shutdown()
    out = {"store": str(args.store), "end": plan.end, "commonPrefix": plan.prefix, "cutAt": plan.cut_at,
           "cutBytes": plan.cut_bytes, "masterEnd": plan.master_end, "dryRun": bool(args.dry_run)}
    if plan.cut_bytes and not args.dry_run:
        out["quarantined"] = truncate.cut(args.store, cfg, plan, why)
    print(json.dumps(out), flush=True)
    return 0
