"""Put on the PYTHONPATH of the suite's Spark JVMs (conftest.local_spark, and the README blocks that start
Spark: test_readme). Spark runs Python code in workers forked from a daemon, `python -m pyspark.daemon MODULE`
(one daemon per worker module: the executors' pyspark.worker and each planner of the Python data source API,
lookup/create/plan/write/commit...). The daemon imports the worker module only after each fork, and a worker
that raised (every refused option, data-loss error or refused row a test checks) exits: the next call forks
anew and imports pyspark.sql, numpy, pyarrow and rmqstore's data source again, about 1 s of CPU here each
time. In such a daemon this module imports them before any fork, so a forked worker inherits them, as
tests/cli_forkserver.py does for the CLI; what runs in the worker is unchanged. OpenBLAS is held to one
thread so that numpy starts none in the daemon (pyarrow's jemalloc thread handles fork itself). In any other
Python process this module does nothing."""
import sys

if "pyspark.daemon" in sys.orig_argv:
    def _preload() -> None:
        import importlib
        import os
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        argv = sys.orig_argv
        worker = argv[argv.index("pyspark.daemon") + 1:][:1]        # the daemon's worker module
        for name in ("pyspark.sql", *worker, "rmqstore.spark.datasource"):
            try:
                importlib.import_module(name)
            except Exception:           # the worker imports it again after the fork and reports what fails
                pass
    _preload()
