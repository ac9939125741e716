"""Put on the PYTHONPATH of the suite's Spark JVMs (conftest.local_spark, the documentation's blocks that start
Spark: test_readme, the `rebuild --engine spark` processes of test_spark_rebuild). Spark runs Python code in
workers forked from a daemon, `python -m pyspark.daemon MODULE` (one daemon per worker module: the executors'
pyspark.worker and each planner of the Python data source API, lookup/create/plan/write/commit...). The daemon
imports the worker module only after each fork, and a worker that raised (every refused option, data-loss
error or refused row a test checks) exits: the next call forks anew and imports pyspark.sql, numpy, pyarrow,
pandas and rmqstore's data source again, about 1 s of CPU here each time. In such a daemon this module imports
them before any fork, so a forked worker inherits them, as tests/cli_forkserver.py does for the CLI, and
freezes them (gc.freeze): a forked worker runs gc.collect() after each task, which otherwise walks every
inherited object and so copies nearly every page of the daemon's heap into the worker (Spark's Python workers:
61 -> 39 s of CPU over four Spark test modules). What runs in the worker is unchanged. OpenBLAS is held to one
thread so that numpy starts none in the daemon (pyarrow's jemalloc thread handles fork itself).

In every Python process Spark starts (daemons, and the streaming source runners it starts without one),
this module also takes Spark's pyspark.zip and py4j zip off the front of sys.path when they are the ones
inside the installed pyspark package (PyPI's PySpark: SPARK_HOME is the package itself): Python compiles
every module it imports from a zip anew at each start (a zip holds no bytecode cache), about 1 s of CPU per
worker process here; the same files then come from the package, with their cached bytecode. In any other
Python process this module does nothing."""
import os
import sys


def _package_zips_off_the_path() -> None:
    for entry in [e for e in sys.path if e.endswith(".zip")]:
        name = os.path.basename(entry)
        lib = os.path.dirname(entry)                                # <site>/pyspark/python/lib
        pkg = os.path.dirname(os.path.dirname(lib))                 # <site>/pyspark
        site = os.path.dirname(pkg)
        twin = os.path.join(site, "pyspark" if name == "pyspark.zip" else "py4j", "__init__.py")
        if (name == "pyspark.zip" or name.startswith("py4j-")) and os.path.basename(pkg) == "pyspark" \
                and os.path.isfile(twin) and site in sys.path:
            sys.path.remove(entry)


_package_zips_off_the_path()

if "pyspark.daemon" in sys.orig_argv:
    def _preload() -> None:
        import gc
        import importlib
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        argv = sys.orig_argv
        worker = argv[argv.index("pyspark.daemon") + 1:][:1]        # the daemon's worker module
        # and pandas for the executors' workers: pyarrow imports it there on first use (Array.take, to_numpy),
        # 0.4 s of CPU per worker process
        pandas = ["pandas"] if worker == ["pyspark.worker"] else []
        for name in ("pyspark.sql", *pandas, *worker, "rmqstore.spark.datasource"):
            try:
                importlib.import_module(name)
            except Exception:           # the worker imports it again after the fork and reports what fails
                pass
        # what is imported now is never garbage: out of the collector's sight, so that the gc.collect()
        # a forked worker makes after each task neither walks it nor writes to (and so copies) its pages
        gc.freeze()
    _preload()
