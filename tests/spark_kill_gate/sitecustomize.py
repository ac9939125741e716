"""Put on the PYTHONPATH of a killed-writer child of test_spark_write.py (every Python process of that
child's Spark reads it: driver, Spark's Python workers, the worker running the writer's commit). With
RMQSTORE_TEST_GATE="PHASE:FILE:STORE[;PHASE:FILE:STORE...]" the Spark writer's two-phase append
(rmqstore.spark.transaction) to STORE stops in the middle of PHASE: it writes the phase's first chunk and
half of its second one, as usual, then writes FILE (the number of that phase's records written) and sleeps
until the test kills the driver (Spark's shutdown then ends this worker). So the kill lands mid-phase however
fast the machine is, and the records written before it are known exactly. RMQSTORE_TEST_CHUNK=N makes the
writer's chunks N messages (transaction.CHUNK): the phases and their cuts are the same with fewer rows.
Without those variables: nothing. It also does what spark_worker_preload/sitecustomize.py does (Python
finds one sitecustomize: this one)."""
import os
import runpy

runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "spark_worker_preload",
                            "sitecustomize.py"))

_SPEC = os.environ.get("RMQSTORE_TEST_GATE")


def _install(spec: str) -> None:
    import time
    from rmqstore.spark import transaction as T
    T.CHUNK = int(os.environ.get("RMQSTORE_TEST_CHUNK", T.CHUNK))
    what = {"PREPARING": "appending half messages", "COMMITTING": "appending commit records"}
    gates = {}                            # store path -> (what to stop in, gate file, state)
    for item in spec.split(";"):
        phase, gate, store = item.split(":", 2)
        gates[os.path.realpath(store)] = (what[phase], gate, {"calls": 0, "written": 0})
    put_all = T._put_all

    def gated(store, msgs, w, delay_rewrite):
        stop_in, gate, state = gates.get(os.path.realpath(str(store.path)), (None, None, None))
        if w != stop_in:
            return put_all(store, msgs, w, delay_rewrite)
        state["calls"] += 1
        if state["calls"] < 2:
            out = put_all(store, msgs, w, delay_rewrite)
            state["written"] += len(msgs)
            return out
        half = len(msgs) // 2
        put_all(store, msgs[:half] if isinstance(msgs, list) else msgs.slice(0, half), w, delay_rewrite)
        state["written"] += len(msgs) // 2
        tmp = gate + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(state["written"]))
        os.rename(tmp, gate)
        time.sleep(900)                   # killed long before (the test's deadlines are shorter)
        os._exit(3)

    T._put_all = gated


if _SPEC:
    _install(_SPEC)
