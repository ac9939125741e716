"""Files: how the engine holds the files of a store.

Owns: mapped_file (MappedFile and MappedFileQueue: fixed-size memory-mapped files named by their first offset,
20 digits; FileCache for readers), store_fs (stores at URIs: s3://, hdfs://, fsspec; listing and ranged
reads), store_dir (what a store directory is, why a path is not one, and its files named by digits).

May import: nothing of the store (rmqstore.errors only).
Writes: the files' bytes as the rooms above hand them over; no layout of its own.
"""
