"""Native thread pools (OpenMP, BLAS) on one thread while a trace re-runs an operator
on a small box, and as they were after (issue 33: black-box at CCD scale): on boxes of
a star's size the threads only wait for each other.  Whole runs keep every thread."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from subzero import ELEMENTWISE, Mode, Operator, Workflow
from subzero.errors import OperatorError
from subzero.query.threads import one_native_thread, one_thread_for
from subzero.tuning import SERIAL_BOX_CELLS


def _threads() -> dict[str, int]:
    """Each native pool of this process (by its library's path) and its threads."""
    return {p["filepath"]: p["num_threads"] for p in threadpool_info()}


def test_pools_run_one_thread_within_and_their_own_after():
    with threadpool_limits(2):           # two threads to begin with, whatever the machine
        before = _threads()
        assert before and set(before.values()) == {2}
        with one_native_thread():
            assert set(_threads().values()) == {1}
        assert _threads() == before


def test_pools_get_their_threads_back_when_the_rerun_raises():
    with threadpool_limits(2):
        before = _threads()
        with pytest.raises(ZeroDivisionError), one_native_thread():
            1 / 0  # noqa: B018
        assert _threads() == before


def test_only_a_small_box_is_held_to_one_thread():
    with threadpool_limits(2):
        with one_thread_for(SERIAL_BOX_CELLS + 1):
            assert set(_threads().values()) == {2}
        with one_thread_for(SERIAL_BOX_CELLS):
            assert set(_threads().values()) == {1}


LOADED_INSIDE = textwrap.dedent("""
    import json, sys
    import numpy
    from threadpoolctl import threadpool_info
    from subzero.query.threads import one_native_thread

    def openmp():
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "openmp"]
    if sys.argv[1] == "inside":
        with one_native_thread():
            import astroscrappy  # noqa: F401  (its extension modules bring libgomp)
            within = openmp()
    else:
        import astroscrappy  # noqa: F401
        within = None
    print(json.dumps({"within": within, "after": openmp()}))
""")


def _openmp_threads(where: str) -> dict:
    p = subprocess.run([sys.executable, "-c", LOADED_INSIDE, where], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_library_loaded_inside_runs_one_thread_and_its_default_after():
    """astroscrappy's OpenMP runtime loads with its extension modules, inside the block:
    it is held to one thread from then on, and has its own default after."""
    default = _openmp_threads("outside")["after"]
    assert default, "astroscrappy brought no OpenMP runtime"
    got = _openmp_threads("inside")
    assert got["within"] == [1] * len(default)
    assert got["after"] == default


class Counting(Operator):
    """Elementwise; remembers, per run, its input's shape and the fewest threads any of
    the process's native pools had while it ran."""

    tiling = ELEMENTWISE
    deterministic_lineage = True

    def __init__(self):
        self.seen: list[tuple[tuple[int, ...], int]] = []
        self.fail = False

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        if self.fail:
            raise RuntimeError("re-run failed")
        self.seen.append((np.shape(x), min(_threads().values())))
        if Mode.FULL in ctx.modes:
            cells = np.argwhere(np.ones(np.shape(x), bool))
            ctx.lwrite(cells, cells, each=True)
        return np.asarray(x) * 2


def test_a_box_rerun_runs_one_thread_and_a_whole_run_every_thread(tmp_path):
    import subzero
    wf = Workflow("threads")
    wf.add("double", Counting(), wf.input("x"))
    store = subzero.open_store(tmp_path / "store")
    try:
        run = store.run(wf, inputs={"x": np.arange(64 * 48, dtype=np.float32).reshape(64, 48)},
                        strategies={"double": "blackbox"}, tile=16, engine="local",
                        progress=False)
        op = run.workflow.steps["double"].operator
        with threadpool_limits(2):          # two threads to begin with, whatever the machine
            before = _threads()
            op.seen.clear()
            res = run.trace("double", [(20, 20)], to="x", prefer="reexec", record=False)
            assert res.cells.tolist() == [[20, 20]]
            assert op.seen == [((1, 1), 1)]           # one cell's box, on one thread
            assert _threads() == before
            op.fail = True
            run.executor().clear_cache()
            with pytest.raises(OperatorError, match="re-run failed"):
                run.trace("double", [(30, 30)], to="x", prefer="reexec", record=False)
            assert _threads() == before
            op.fail = False
            op.seen.clear()
            run.executor().clear_cache()
            run.trace("double", np.argwhere(np.ones((64, 48), bool)), to="x", prefer="reexec",
                      record=False)
            assert op.seen and all(n == 2 for _, n in op.seen), op.seen   # whole: every thread
    finally:
        store.close()
