"""Tests of the command line and `make bench`/`make demo` tools (src/rmqstore/tools/), as subprocesses."""
