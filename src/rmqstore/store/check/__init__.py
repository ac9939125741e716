"""`rmqstore check`: every record with its CRC, every consume queue unit and index entry against its record,
the checkpoint and config files; and the background check that finishes what a fast open skipped.

Owns: check (check_store: the whole run, CheckReport), check_commitlog, check_derived (consume queues,
index), check_files (checkpoint, config files, links, file kinds; quarantine of config files), check_report
(CheckReport, Problem, progress), background_check (store.service("background_check") once serving),
unit_repair (store.service("unit_repair"): a unit a read found damaged, repaired on the open store).

May import: format, conf, files, state, commitlog, consumequeue, index, recovery.
Writes: nothing when checking; quarantines a malformed config file (FILE.corrupt-<time>, its `.bak` restored).
The repair that rebuilds through a MessageStore is store/repair/.
"""
