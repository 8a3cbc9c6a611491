"""Re-execution of only the tiles a query touches (issue 12): an elementwise or stencil
operator re-runs on the tiles holding the query's cells (plus their halo), and the
trace answers exactly what stored FULL lineage and a whole re-run answer."""

import numpy as np
import pytest
import xarray as xr

from subzero import ELEMENTWISE, Mode, Operator, Workflow, stencil
from subzero.errors import CorruptArray, QueryError, SubZeroWarning
from subzero.model.cells import box
from subzero.query.tilerun import touched_tiles

SHAPE = (45, 37)       # tile 16: 3 x 3 tiles, the last row and column of tiles partial
TILE = 16
R = 2


def image(seed=3):
    return np.random.default_rng(seed).normal(size=SHAPE)


class Recording(Operator):
    """Remembers the input shapes every ``run`` got (the test's view of what re-ran).
    Its lineage is computed from coordinates, and declared so: one re-run per step
    (an undeclared operator is re-run twice; tests/test_lineage_determinism.py)."""

    deterministic_lineage = True

    def __init__(self):
        self.seen: list[tuple[int, ...]] = []

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def note(self, x):
        self.seen.append(tuple(np.shape(x)))


class Scale(Recording):
    """Elementwise: each cell depends on itself."""

    tiling = ELEMENTWISE

    def run(self, ctx, x):
        self.note(x)
        if Mode.FULL in ctx.modes:
            c = box((0, 0), x.shape)
            ctx.lwrite(c, c, each=True)
        return 2.0 * x + 1.0


class BoxSum(Recording):
    """Stencil of radius R: the sum over the (clipped) window; lineage the window."""

    tiling = stencil(R)

    def run(self, ctx, x):
        self.note(x)
        p = np.pad(x, R)
        out = np.zeros(x.shape)
        for dy in range(2 * R + 1):
            for dx in range(2 * R + 1):
                out += p[dy:dy + x.shape[0], dx:dx + x.shape[1]]
        if Mode.FULL in ctx.modes:
            c = box((0, 0), x.shape)
            ids = np.arange(len(c))
            offs = box((-R, -R), (R + 1, R + 1))
            cells = (c[:, None, :] + offs[None]).reshape(-1, 2)
            groups = np.repeat(ids, len(offs))
            ok = np.all((cells >= 0) & (cells < np.asarray(x.shape)), axis=1)
            ctx.lwrite_groups(c, ids, (cells[ok], groups[ok]))
        return out


class Blend(Recording):
    """Elementwise over two inputs: a[c] - b[c] / 2."""

    tiling = ELEMENTWISE

    def run(self, ctx, a, b):
        self.note(a)
        if Mode.FULL in ctx.modes:
            c = box((0, 0), a.shape)
            ctx.lwrite(c, c, c, each=True)
        return a - 0.5 * b


class Spots(Recording):
    """Composite, stencil of radius 1: a bright cell depends on its 3x3 window (a
    payload pair), every other cell on itself (the mapping functions)."""

    tiling = stencil(1)

    def supported_modes(self):
        return {Mode.COMP, Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        self.note(x)
        p = np.pad(x, 1, mode="edge")
        peak = np.max([p[dy:dy + x.shape[0], dx:dx + x.shape[1]]
                       for dy in range(3) for dx in range(3)], axis=0)
        bright = x > 1.2
        hits = np.argwhere(bright)
        if Mode.COMP in ctx.modes and len(hits):
            ctx.lwrite(hits, payload=b"r1", each=True)
        elif Mode.FULL in ctx.modes:
            c = box((0, 0), x.shape)
            ctx.lwrite(c[~bright.ravel()], c[~bright.ravel()], each=True)
            if len(hits):
                from subzero import window
                ctx.lwrite(hits, [window(h, 1, x.shape) for h in hits], each=True)
        return np.where(bright, peak, x)

    def map_p(self, cells, payload, i, ctx):
        from subzero import window
        return window(cells, 1, ctx.input_shape(i))

    def map_b(self, cells, i, ctx):
        return cells

    def map_f(self, cells, i, ctx):
        return cells


class Noisy(Scale):
    """Tile-parallel but not deterministic (the author forgot to say so)."""

    def run(self, ctx, x):
        return super().run(ctx, x) + np.random.default_rng().normal(size=np.shape(x))


def chain():
    """x -> scale (elementwise) -> box (stencil r=2) -> blend(box, y) -> spots (COMP)."""
    wf = Workflow("tiles")
    x, y = wf.input("x"), wf.input("y")
    s = wf.add("scale", Scale(), x)
    b = wf.add("box", BoxSum(), s)
    m = wf.add("blend", Blend(), b, y)
    wf.add("spots", Spots(), m)
    return wf


OPS = ("scale", "box", "blend", "spots")


@pytest.fixture
def runs(store):
    inputs = {"x": image(3), "y": image(4)}
    full = store.run(chain(), inputs=inputs, strategies={o: "full" for o in OPS}, tile=TILE)
    bb = store.run(chain(), inputs=inputs, strategies={o: "blackbox" for o in OPS}, tile=TILE)
    return full, bb


# tile corners, array edges and corners (where halos are clipped), the interior
QUERIES = [[(0, 0)], [(15, 15)], [(16, 16)], [(15, 16), (16, 15)], [(44, 36)], [(44, 0)],
           [(0, 36)], [(31, 32)], [(20, 5), (40, 30), (2, 33)], [(22, 18)]]


def whole(run, start, cells, **kw):
    """The same trace through whole re-runs (a fresh executor without tile access)."""
    ex = run.executor()
    saved = ex._tiles
    ex._tiles = lambda name: None
    try:
        return run.trace(start, cells, prefer="reexec", record=False, **kw)
    finally:
        ex._tiles = saved


def same_as_stored_and_whole(full, bb, start, to, cells):
    """The tile-limited re-run's answer equals stored FULL lineage's and a whole
    re-run's; returns both traces (tile-limited, stored)."""
    want = full.trace(start, cells, to=to, record=False)
    got = bb.trace(start, cells, to=to, prefer="reexec", record=False)
    assert np.array_equal(got.bitmap, want.bitmap), (start, to, cells)
    assert np.array_equal(whole(bb, start, cells, to=to).bitmap, want.bitmap)
    return got, want


@pytest.mark.parametrize("cells", QUERIES)
def test_backward_equals_stored_and_whole_reexec(runs, cells):
    full, bb = runs
    for start, to in (("spots", "x"), ("spots", "y"), ("box", "scale"), ("blend", "box")):
        got, want = same_as_stored_and_whole(full, bb, start, to, cells)
        assert all(s.method.startswith("reexec:") for s in got.steps), got.steps
        assert len(want) > 0


@pytest.mark.parametrize("cells", QUERIES)
def test_forward_equals_stored_and_whole_reexec(runs, cells):
    full, bb = runs
    for start, to in (("x", "spots"), ("y", "spots"), ("scale", "box"), ("blend", "spots")):
        same_as_stored_and_whole(full, bb, start, to, cells)


def test_composite_step_uses_its_payload_pairs(runs):
    """A bright cell of spots reaches its 3x3 window; a dim one only itself."""
    full, bb = runs
    m = bb.array("blend").values
    bright = np.argwhere(m > 1.2)
    dim = np.argwhere(m <= 1.2)
    for cells, n in ((bright[:1], None), (dim[:1], 1)):
        got = bb.trace("spots", cells, to="blend", prefer="reexec", record=False)
        assert got.steps[0].method == "reexec:comp"
        assert np.array_equal(got.bitmap, full.trace("spots", cells, to="blend", record=False).bitmap)
        if n is not None:
            assert len(got) == n
        else:
            assert len(got) > 1


def seen_after(run, name, fn):
    op = run.workflow.steps[name].operator
    op.seen.clear()
    fn()
    return list(op.seen)


def test_reruns_only_the_tiles_the_query_needs(runs):
    _, bb = runs
    # backward, one cell in the core of the middle tile: the cell's box, read with its halo
    seen = seen_after(bb, "box", lambda: bb.trace("box", [(20, 20)], to="scale",
                                                     prefer="reexec", record=False))
    assert seen == [(1 + 2 * R, 1 + 2 * R)]
    # an elementwise operator reads no halo
    seen = seen_after(bb, "scale", lambda: bb.trace("scale", [(40, 35)], to="x",
                                                       prefer="reexec", record=False))
    assert seen == [(1, 1)]
    # two cells of one tile: their bounding box
    seen = seen_after(bb, "scale", lambda: bb.trace("scale", [(33, 20), (40, 22)], to="x",
                                                       prefer="reexec", record=False))
    assert seen == [(8, 3)]
    # forward, an input cell within R of a tile corner lies in the read region of the
    # four tiles around the corner; the output cells it reaches (within R) lie in the
    # four tiles' cores, and their four boxes, side by side, are re-run as one
    seen = seen_after(bb, "box", lambda: bb.trace("scale", [(17, 15)], to="box",
                                                     prefer="reexec", record=False))
    assert seen == [(1 + 4 * R, 1 + 4 * R)]
    # cells in two distant tiles, at the array's edges: two boxes, halos clipped
    seen = seen_after(bb, "box", lambda: bb.trace("box", [(0, 0), (44, 30)], to="scale",
                                                     prefer="reexec", record=False))
    assert sorted(seen) == [(1 + R, 1 + R), (1 + R, 1 + 2 * R)]
    # a whole re-run would have read the whole image
    seen = seen_after(bb, "box", lambda: whole(bb, "box", [(20, 20)], to="scale"))
    assert seen == [SHAPE]


def test_touched_tiles_clip_at_the_edges():
    q = np.array([0, 44 * 37 + 36])            # (0, 0) and (44, 36)
    assert touched_tiles(SHAPE, (16, 16), 2, q, by_core=True).tolist() == [[0, 0], [2, 2]]
    assert touched_tiles(SHAPE, (16, 16), 2, q, by_core=False).tolist() == [[0, 0], [2, 2]]
    q = np.array([17 * 37 + 15])               # (17, 15): within 2 of four tiles
    assert touched_tiles(SHAPE, (16, 16), 2, q, by_core=False).tolist() == \
        [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert touched_tiles(SHAPE, (16, 16), 20, q, by_core=False).shape == (9, 2)


def test_nondeterministic_tile_parallel_operator_is_caught(store):
    wf = Workflow("noisy")
    wf.add("n", Noisy(), wf.input("x"))
    run = store.run(wf, inputs={"x": image()}, strategies={"n": "blackbox"}, tile=TILE)
    msg = r"operator 'n' is not deterministic: its re-run output differs .*at cell \(\d+, \d+\)"
    # a tile that differs is re-run whole (with a warning), and the whole re-run differs too
    with pytest.raises(QueryError, match=msg), \
            pytest.warns(SubZeroWarning, match=r"'n' is declared elementwise but its re-run "
                                               r"on tile \[20:21, 20:21\] differs"):
        run.trace("n", [(20, 20)], to="x", record=False)
    with pytest.raises(QueryError, match=msg):              # then at once, forward too
        run.trace("x", [(3, 30)], to="n", record=False)
    fresh = store.run(wf, inputs={"x": image()}, strategies={"n": "blackbox"}, tile=TILE)
    with pytest.raises(QueryError, match=msg), pytest.warns(SubZeroWarning):
        fresh.trace("x", [(3, 30)], to="n", record=False)


class Positional(Scale):
    """Declared elementwise, but reads its cells' positions (as a science-region mask in
    array coordinates would): right on the whole array, wrong on any later tile."""

    def run(self, ctx, x):
        return super().run(ctx, x) + np.arange(np.shape(x)[0])[:, None]


def test_misdeclared_position_dependent_operator_reruns_whole_and_answers(store):
    wf = Workflow("positional")
    wf.add("p", Positional(), wf.input("x"))
    # a DataArray input makes the local engine run it whole (it streams numpy tiles),
    # so the stored output is the whole-array one that tiles cannot reproduce
    x = xr.DataArray(image(), dims=("y", "x"))
    bb = store.run(wf, inputs={"x": x}, strategies={"p": "blackbox"}, tile=TILE)
    full = store.run(wf, inputs={"x": x}, strategies={"p": "full"}, tile=TILE)
    # a box in the first row is right: no warning, one box re-run
    got = bb.trace("p", [(0, 3)], to="x", record=False)
    assert np.array_equal(got.bitmap, full.trace("p", [(0, 3)], to="x", record=False).bitmap)
    with pytest.warns(SubZeroWarning, match=r"'p' is declared elementwise but its re-run on tile "
                                            r"\[20:21, 5:6\] differs from the stored output "
                                            r"\(at cell \(20, 5\): .*must be declared global"):
        got = bb.trace("p", [(20, 5)], to="x", record=False)
    assert got.cells.tolist() == [[20, 5]]
    # the executor remembers: the next query re-runs it whole at once, without a warning
    op = bb.workflow.steps["p"].operator
    op.seen.clear()
    got = bb.trace("p", [(40, 30)], to="x", record=False)
    assert got.cells.tolist() == [[40, 30]] and op.seen == [SHAPE]


def test_damaged_chunk_in_a_read_tile_is_named(runs):
    """The tile the re-run reads has a damaged chunk of its input: CorruptArray naming it;
    a query whose tiles avoid the chunk still answers."""
    _, bb = runs
    chunk = bb.dir / "arrays" / "scale.zarr" / "data" / "c" / "2" / "2"
    assert chunk.is_file()
    chunk.write_bytes(b"\0" * chunk.stat().st_size)
    bb.executor().clear_cache()
    ok = bb.trace("box", [(3, 3)], to="scale", prefer="reexec", record=False)
    assert len(ok) == 5 * 5
    with pytest.raises(CorruptArray, match=r"array 'scale' of run \d+ is damaged"):
        bb.trace("box", [(40, 30)], to="scale", prefer="reexec", record=False)


def test_spark_run_traces_through_tiles(store, spark):
    from subzero.operators import Add, MeanFilter
    wf = Workflow("sparktiles")
    x, y = wf.input("x"), wf.input("y")
    m = wf.add("mean", MeanFilter(size=5), x)
    wf.add("sum", Add(), m, y)
    inputs = {"x": image(5), "y": image(6)}
    full = store.run(wf, inputs=inputs, strategies={"mean": "full", "sum": "full"}, tile=TILE)
    sp = store.run(wf, inputs=inputs, strategies={"mean": "blackbox", "sum": "blackbox"},
                   engine="spark", spark=spark, tile=TILE, progress=False)
    for start, cells, to in (("sum", [(16, 16), (44, 0)], "x"), ("x", [(15, 17), (0, 36)], "sum"),
                             ("sum", [(31, 31)], "y")):
        got = sp.trace(start, cells, to=to, prefer="reexec", record=False)
        assert all(s.method == "reexec:full" for s in got.steps), got.steps
        assert np.array_equal(got.bitmap, full.trace(start, cells, to=to, record=False).bitmap)


class Recorder:
    """A query-time planner on the core's protocol: keeps the simple rule's order and
    records what it is told about each step."""

    def __init__(self):
        self.infos = []

    def plan(self, step, methods):
        self.infos.append(step)
        return methods, None

    def observe(self, stat):
        pass


def test_planner_is_told_the_share_of_tiles_a_reexec_runs(runs):
    _, bb = runs
    p = Recorder()
    bb.trace("box", [(20, 20)], to="scale", planner=p, record=False)
    bb.trace("scale", [(17, 15)], to="box", planner=p, record=False)
    bb.trace("box", [(0, 0), (20, 20), (40, 30)], to="scale", planner=p, record=False)
    assert [(s.op, s.backward, s.tiles) for s in p.infos] == \
        [("box", True, 1 / 9), ("box", False, 4 / 9), ("box", True, 3 / 9)]


def test_cost_model_scales_reexec_with_the_tiles_it_runs():
    """Re-execution's run, regenerated-cells and load terms scale with the share of
    tiles it runs; its fixed terms do not, and other methods ignore the share."""
    from subzero.optimizer.costmodel import FEATURES, CostModel
    from subzero.optimizer.stats import OpInfo, WorkflowStats
    info = OpInfo("box", ["scale"], [(1000, 1000)], (1000, 1000), 8_000_000, 2.0,
                  frozenset({"full", "blackbox", "map"}), True, [False], False, False, True,
                  "full", modes={"full": {"run_s": 3.0, "cells": 1e6}})
    cal = {"coef": {f: [1.0] * len(v) for f, v in FEATURES.items()},
           "load_fixed_s": 0.01, "load_byte_s": 1e-9}
    model = CostModel(cal, WorkflowStats("w", {}, 2.0, {"box": info}))

    def cost(method, tiles):
        return model.cost("box", method, 0, True, 10, 10, tiles=tiles)
    whole, quarter = cost("reexec", 1.0), cost("reexec", 0.25)
    fixed = 1 + 20 + 2e6                       # const, io, arr
    assert whole == pytest.approx(fixed + 3.0 + 1e6 + 0.01 + 0.008)
    assert quarter == pytest.approx(fixed + (3.0 + 1e6 + 0.01 + 0.008) / 4)
    assert cost("map", 0.25) == cost("map", 1.0)
