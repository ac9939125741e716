"""The workloads of `make bench` (tools/benchsuite.py), one module per group."""
