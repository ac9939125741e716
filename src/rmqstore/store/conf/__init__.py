"""Configuration: StoreConfig (broker.conf's keys by RocketMQ's names) and the JSON files under `{store}/config/`.

Owns: config (StoreConfig, BrokerRole, loading broker.conf), config_keys (every broker.conf key: honoured,
tuning, default only, store path), config_file (ConfigManager's persistence: temp file, `.bak`, decoders that
name a malformed entry), config_tables (the decoders of topics.json, consumerOffset.json, delayOffset.json,
which the store reads back in its check and a slave's sync).

May import: nothing of the store (rmqstore.errors only).
Writes: `config/*.json` as fastjson writes them (pretty-printed JSON, the previous content kept as `FILE.bak`);
the tables' shapes are in config_tables.py.
"""
