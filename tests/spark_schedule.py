"""How `make test` hands test modules to its pytest-xdist workers (conftest.pytest_xdist_make_scheduler).

As `--dist loadfile` (a module per worker at a time, in collection order: conftest sorts the longest first),
with one difference: the modules that start this worker's Spark session (conftest.local_spark) all go to one
worker (SPARK_WORKERS). A worker's first such module starts a JVM and warms it (its start, the first read,
write and stream: about 40 s of CPU here), and every other worker that did so would pay that again on the
same two cores; the Spark modules take about 280 s on their worker, about half the run, while the other
workers take the other modules, and the Spark worker takes those too once the Spark modules are handed out.
Measured in runs of the same hour: two Spark workers 548 s and 1016 s of CPU, one 492 s and 929 s (with a
duplicated crash test gone: about 17 s of CPU of the difference)."""
from __future__ import annotations

from pathlib import Path

from xdist.scheduler import LoadFileScheduling

SPARK_WORKERS = 1
TESTS = Path(__file__).resolve().parent


def session_modules() -> set[str]:
    """The test modules (paths relative to the repository, as in node ids) that call local_spark."""
    return {str(p.relative_to(TESTS.parent)) for p in TESTS.rglob("test_*.py")
            if "local_spark(" in p.read_text(encoding="utf-8")}


class SparkSessionScheduling(LoadFileScheduling):
    def __init__(self, config, log=None):
        super().__init__(config, log)
        self.spark_scopes = session_modules()
        self.spark_nodes: set = set()

    def remove_node(self, node):
        """A worker that died: another may start Spark in its place."""
        self.spark_nodes.discard(node)
        return super().remove_node(node)

    def _assign_work_unit(self, node) -> None:
        may_spark = node in self.spark_nodes or len(self.spark_nodes) < SPARK_WORKERS
        scope = next((s for s in self.workqueue if may_spark or s not in self.spark_scopes), None)
        if scope is None:               # only Spark modules are left, for the Spark workers
            if not self._pending_of(self.assigned_work.get(node, {})):
                node.shutdown()
            return
        work_unit = self.workqueue.pop(scope)
        if scope in self.spark_scopes:
            self.spark_nodes.add(node)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])
