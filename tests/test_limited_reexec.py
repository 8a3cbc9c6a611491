"""Re-execution limited to what a query needs (issue 33): a black-box trace re-runs
tile-parallel operators on the boxes of the tiles its cells touch (given each tile's
origin and the statistic the run used), a connected-components operator on a box
enclosing the query's regions, a structural one on the input box its output box
reads, and an operator with a one-cell input on boxes too.  On random boxes, in both
directions, the answers are the cells a whole re-run and stored lineage give."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tile_reexec import seen_after

from subzero import ELEMENTWISE, ExactMedian, Mode, Operator, Workflow, stencil
from subzero.errors import SubZeroWarning
from subzero.model.cells import box
from subzero.operators import ConnectedComponents, Mean, Slice, Sub

SHAPE = (61, 47)        # tile 16: 4 x 3 tiles, the last row and column partial
TILE = 16
STEPS = ("pos", "win", "lab", "cut", "mean", "minus")


class Recording(Operator):
    """Remembers the input shapes every ``run`` got (what re-ran, and how much)."""

    deterministic_lineage = True

    def __init__(self):
        self.seen: list[tuple[int, ...]] = []

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}


class Positional(Recording):
    """Elementwise but position-dependent (as the LSST flags are): adds the cell's row in
    the whole array, so a tile must know its origin."""

    tiling = ELEMENTWISE

    def run(self, ctx, x):
        self.seen.append(np.shape(x))
        rows = ctx.origin[0] + np.arange(np.shape(x)[0])
        if Mode.FULL in ctx.modes:
            c = box((0, 0), np.shape(x))
            ctx.lwrite(c, c, each=True)
        return np.asarray(x) + 0.001 * rows[:, None]


class AboveMedianWindow(Recording):
    """Stencil of radius 1 with a whole-array statistic (the median, exact and
    subtractive): a cell above the median becomes its 3x3 maximum and depends on that
    window; any other keeps its value and depends on itself."""

    tiling = stencil(1)

    def __init__(self):
        super().__init__()
        self.statistic = ExactMedian()

    def run(self, ctx, x):
        x = np.asarray(x, np.float32)
        self.seen.append(x.shape)
        med = ctx.statistic
        p = np.pad(x, 1, mode="edge")
        peak = np.max([p[dy:dy + x.shape[0], dx:dx + x.shape[1]] for dy in range(3)
                       for dx in range(3)], axis=0)
        hot = x > med
        if Mode.FULL in ctx.modes:
            c = box((0, 0), x.shape)
            cold = c[~hot.ravel()]
            ctx.lwrite(cold, cold, each=True)
            h = np.argwhere(hot)
            if len(h):
                off = box((-1, -1), (2, 2))
                cells = (h[:, None, :] + off[None]).reshape(-1, 2)
                ids = np.repeat(np.arange(len(h)), len(off))
                ok = np.all((cells >= 0) & (cells < np.asarray(x.shape)), axis=1)
                ctx.lwrite_groups(h, np.arange(len(h)), (cells[ok], ids[ok]))
        return np.where(hot, peak, x)


class Bright(ConnectedComponents):
    """Regions of cells more than 2 above the whole array's median (small blobs)."""

    min_size = 2

    def __init__(self):
        self.statistic = ExactMedian()
        self.seen: list[tuple[int, ...]] = []

    def foreground(self, values, med):
        self.seen.append(np.shape(values))
        return np.asarray(values) > med + 2.0


def workflow():
    """x -> pos -> win -> lab (components); win -> cut (a strip) -> mean (one cell);
    minus = win - mean (a one-cell input)."""
    wf = Workflow("limited")
    x = wf.input("x")
    p = wf.add("pos", Positional(), x)
    w = wf.add("win", AboveMedianWindow(), p)
    wf.add("lab", Bright(), w)
    c = wf.add("cut", Slice(np.s_[:, 0:3]), w)
    m = wf.add("mean", Mean(), c)
    wf.add("minus", Sub(broadcast="scalar"), w, m)
    return wf


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import subzero
    st_ = subzero.open_store(tmp_path_factory.mktemp("limited") / "store")
    x = np.random.default_rng(11).normal(size=SHAPE).astype(np.float32)
    full = st_.run(workflow(), inputs={"x": x}, strategies={"lab": "full", "cut": "full",
                                                            "minus": "full", "mean": "full",
                                                            "pos": "full", "win": "full"},
                   tile=TILE, progress=False)
    bb = st_.run(workflow(), inputs={"x": x}, strategies={n: "blackbox" for n in STEPS},
                 tile=TILE, progress=False)
    yield full, bb
    st_.close()


def whole(run, start, cells, to):
    """The same trace through whole re-runs (no tile access)."""
    ex = run.executor()
    saved = ex._tiles
    ex._tiles = lambda name: None
    try:
        return run.trace(start, cells, to=to, prefer="reexec", record=False, shortcut=False)
    finally:
        ex._tiles = saved


def limited(run, start, cells, to):
    run.executor().clear_cache()
    return run.trace(start, cells, to=to, prefer="reexec", record=False, shortcut=False)


def same_three_ways(full, bb, start, to, cells):
    want = full.trace(start, cells, to=to, record=False, shortcut=False).bitmap
    got = limited(bb, start, cells, to)
    assert np.array_equal(got.bitmap, want), (start, to, cells)
    assert np.array_equal(whole(bb, start, cells, to).bitmap, want), (start, to, cells)
    return got


@st.composite
def boxes(draw, shape=SHAPE, most=6):
    lo = [draw(st.integers(0, n - 1)) for n in shape]
    hi = [draw(st.integers(a + 1, min(n, a + most))) for a, n in zip(lo, shape)]
    return box(lo, hi)


@settings(max_examples=25, deadline=None)
@given(cells=boxes())
def test_backward_on_random_boxes(runs, cells):
    full, bb = runs
    for start in ("win", "lab", "minus"):
        got = same_three_ways(full, bb, start, "x", cells)
        assert all(s.method.startswith(("reexec:", "all-to-all", "empty")) for s in got.steps)
    same_three_ways(full, bb, "cut", "x", np.unique(np.minimum(cells, [60, 2]), axis=0))


@settings(max_examples=25, deadline=None)
@given(cells=boxes())
def test_forward_on_random_boxes(runs, cells):
    full, bb = runs
    for to in ("win", "lab", "minus"):
        same_three_ways(full, bb, "x", to, cells)


def test_a_statistic_operator_reruns_a_box_with_the_runs_value(runs):
    """One cell of ``win`` re-runs its 1x1 box and halo, with the median the run kept."""
    full, bb = runs
    seen = seen_after(bb, "win", lambda: limited(bb, "win", [(20, 20)], "pos"))
    assert seen == [(3, 3)]
    rec = {o["name"]: o for o in bb.ops()}
    assert rec["win"].get("rounds") and rec["win"].get("statistic")
    assert rec["lab"].get("rounds") and rec["lab"].get("statistic")   # run whole, kept too


def test_a_statistic_whose_kept_states_are_damaged_is_computed_again(runs):
    """A rounds file that is not the one the record names is not used: the value is
    computed again from the stored input, and the answers stay the same."""
    full, bb = runs
    f = bb.dir / "statistics" / "win.npz"
    saved = f.read_bytes()
    try:
        f.write_bytes(saved[:-8] + b"\0" * 8)
        for cells in ([(20, 20)], [(0, 46), (60, 0)]):
            same_three_ways(full, bb, "win", "x", cells)
    finally:
        f.write_bytes(saved)


def test_position_dependent_tiles_rerun_without_a_warning(runs, recwarn):
    """A tile re-run is told its origin: cells far from the first tile re-run on their
    box alone, and no tile differs from the stored output."""
    full, bb = runs
    seen = seen_after(bb, "pos", lambda: limited(bb, "pos", [(50, 40)], "x"))
    assert seen == [(1, 1)]
    same_three_ways(full, bb, "pos", "x", [(50, 40)])
    assert not [w for w in recwarn if issubclass(w.category, SubZeroWarning)]


def test_components_rerun_a_box_enclosing_the_region(runs):
    full, bb = runs
    lab = bb.array("lab").values
    k = int(np.bincount(lab.ravel())[1:].argmax()) + 1
    c = tuple(int(v) for v in np.argwhere(lab == k)[0])
    seen = seen_after(bb, "lab", lambda: limited(bb, "lab", [c], "win"))
    assert seen and all(int(np.prod(s)) < lab.size for s in seen)
    got = limited(bb, "lab", [c], "win")
    assert {tuple(v) for v in got.cells} == {tuple(v) for v in np.argwhere(lab == k)}


def test_a_strip_through_a_slice_reads_the_strip(runs):
    """Backward through the slice, the strip's cells re-run ``win`` on strip boxes
    merged along it (one box per run of tiles), never the whole image."""
    full, bb = runs
    strip = box((0, 0), (SHAPE[0], 3))
    seen = seen_after(bb, "win", lambda: limited(bb, "cut", strip, "x"))
    assert seen == [(SHAPE[0], 3 + 1)]
    same_three_ways(full, bb, "cut", "x", strip)


def test_two_input_step_reruns_once(runs):
    """``minus`` is reached once per input with the same output cells: one re-run."""
    full, bb = runs
    op = bb.workflow.steps["minus"].operator
    calls = []
    saved = type(op).run

    def counting(self, ctx, *ins):
        calls.append(np.shape(ins[0]))
        return saved(self, ctx, *ins)
    type(op).run = counting
    try:
        got = limited(bb, "minus", [(30, 30)], "win")
    finally:
        type(op).run = saved
    assert len(calls) == 1 and calls[0] == (1, 1)
    assert {s.method for s in got.steps if s.op == "minus"} == {"reexec:full"}


class Smoothed(ConnectedComponents):
    """Wrongly declared components: its foreground reads the neighbours (a 3x3 mean,
    padded with -10 beyond the values it is given), so a box's outermost cells are
    background where the whole array's may not be."""

    min_size = 1

    def foreground(self, values, stat):
        v = np.asarray(values, float)
        p = np.pad(v, 1, mode="constant", constant_values=-10.0)
        m = sum(p[dy:dy + v.shape[0], dx:dx + v.shape[1]] for dy in range(3) for dx in range(3))
        return m / 9 > 0.5


def test_a_box_that_differs_reruns_whole_and_answers_right(store):
    """A region crossing the box's sides looks enclosed to the box (its outermost cells
    turned background): the stored labels show it, and the step re-runs whole."""
    x = np.full((40, 40), -1.0)
    x[10:30, 2:38] = 1.0
    wf = Workflow("smooth")
    wf.add("lab", Smoothed(), wf.input("x"))
    ref = store.run(wf, inputs={"x": x}, strategies={"lab": "full"}, progress=False)
    bb = store.run(wf, inputs={"x": x}, strategies={"lab": "blackbox"}, progress=False)
    cells = [(20, 20)]
    with pytest.warns(SubZeroWarning, match="declared components but its re-run on box"):
        got = bb.trace("lab", cells, to="x", prefer="reexec", record=False)
    want = ref.trace("lab", cells, to="x", record=False)
    assert np.array_equal(got.bitmap, want.bitmap) and len(want) > 500


def test_record_names_the_statistic_of_an_operator_run_whole(runs):
    """The components operator runs whole in process: its statistic's value and merged
    states are kept as a tiled operator's are (what a trace re-uses)."""
    _, bb = runs
    rec = json.loads((bb.dir / "run.json").read_text())
    ops = {o["name"]: o for o in rec["ops"]}
    assert ops["lab"]["statistic"] and ops["lab"]["rounds"]
    assert (bb.dir / "statistics" / "lab.npz").is_file()
