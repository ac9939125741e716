"""The index: message keys and unique keys to commitlog offsets (RocketMQ's IndexService and IndexFile).

Owns: index_file (IndexService: the files, a put per dispatched record, queryMessage; IndexFile: one file's
hash slots and entries).

May import: format, files.
Writes: `{store}/index/<yyyyMMddHHmmssSSS>` files: a 40-byte header (codec.INDEX_HEADER), hash slots of 4 bytes
(codec.INDEX_SLOT), 20-byte entries (codec.INDEX_ENTRY: key hash, commitlog offset, time diff, previous
entry), big-endian, all in format/codec.py.
"""
