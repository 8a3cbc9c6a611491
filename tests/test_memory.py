"""Bounded memory in-process: the local engine streams tile-parallel operators tile
by tile through the array store and drops each array after its last reader.

Streamed runs (a small tile) are compared with whole-array runs (a tile larger than
the image: every operator runs once on whole arrays): same arrays, same trace
answers, for every kind of operator mixed in one workflow."""

import gc
import weakref

import numpy as np
import pytest
import xarray as xr

from subzero import GLOBAL, Mode, Operator, Workflow, stencil
from subzero.engines.driver import run_workflow
from subzero.engines.local import LocalEngine
from subzero.engines.progress import Progress
from subzero.errors import OperatorError
from subzero.model.cells import window
from subzero.operators import Mean, MeanFilter, Sub, Transpose, Unary
from subzero.runs.launch import resolve_strategies
from subzero.storage.arrays import ArrayStore

SHAPE = (45, 38)            # 3 x 3 tiles of 16, the last ones partial
TILE = 16
WHOLE = 4096                # one tile: every operator runs on whole arrays


class Peaks(Operator):
    """Flags cells whose 3x3 neighbourhood holds a value above ``level``: a flagged
    cell depends on its 3x3 window (Full pairs or a payload), the others on their
    own cell (composite lineage).  Records the shapes ``run`` is given."""

    tiling = stencil(1)

    def __init__(self, level: float):
        self.level = level
        self.seen: list[tuple[int, ...]] = []

    def supported_modes(self):
        return {Mode.FULL, Mode.COMP, Mode.BLACKBOX}

    def run(self, ctx, x):
        self.seen.append(x.shape)
        assert ctx.input_shape(0) == x.shape and ctx.output_shape == x.shape
        big = x > self.level
        near = np.zeros_like(big)
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                src = big[max(0, dy):x.shape[0] + min(0, dy), max(0, dx):x.shape[1] + min(0, dx)]
                near[max(0, -dy):x.shape[0] + min(0, -dy), max(0, -dx):x.shape[1] + min(0, -dx)] |= src
        hits = np.argwhere(near)
        if Mode.COMP in ctx.modes:
            ctx.lwrite(hits, payload=b"\x01", each=True)
        if Mode.FULL in ctx.modes:
            ctx.lwrite(hits, [window(c[None], 1, x.shape) for c in hits], each=True)
        return near.astype(np.uint8)

    def map_b(self, cells, i, ctx):
        return cells

    def map_f(self, cells, i, ctx):
        return cells

    def map_p(self, cells, payload, i, ctx):
        return window(cells, payload[0], ctx.input_shape(i))


class Whole(Operator):
    """A global black-box operator that records the shapes it is given."""

    tiling = GLOBAL

    def __init__(self):
        self.seen: list[tuple[int, ...]] = []

    def run(self, ctx, x):
        self.seen.append(np.shape(x))
        return np.cumsum(np.asarray(x, np.float64), axis=0)


def mixed(peaks: Peaks) -> Workflow:
    """Elementwise, stencil (built-in and user), two-input, aggregate and global
    operators in one workflow."""
    wf = Workflow("mixed")
    a, b = wf.input("a"), wf.input("b")
    lin = wf.add("lin", Unary(np.sqrt), a)
    blur = wf.add("blur", MeanFilter(size=5), lin)
    diff = wf.add("diff", Sub(), blur, b)
    m = wf.add("m", Mean(), diff)
    cen = wf.add("cen", Sub(broadcast="scalar"), diff, m)
    pk = wf.add("peaks", peaks, cen)
    t = wf.add("t", Transpose(), pk)
    wf.add("back", Transpose(), t)
    return wf


def inputs():
    rng = np.random.default_rng(7)
    return {"a": rng.uniform(0, 100, SHAPE).astype(np.float32),
            "b": rng.normal(0, 1, SHAPE)}


STRATEGIES = [
    {},
    {"lin": "full:fullone:backward", "blur": "full:fullmany:forward+map", "diff": "map",
     "peaks": "full+comp:paymany:backward"},
    {"lin": "blackbox", "blur": "blackbox", "diff": "blackbox", "peaks": "comp:payone:forward"},
]

QUERIES = [("back", [(0, 0), (44, 37), (16, 16), (15, 31)], "a"),
           ("peaks", [(20, 20), (31, 15)], "b"),
           ("a", [(0, 0), (15, 15), (16, 16), (44, 37)], "back"),
           ("b", [(32, 32), (10, 5)], "peaks"),
           ("lin", [(17, 17)], "cen")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import subzero
    st = subzero.open_store(tmp_path_factory.mktemp("mem") / "s")
    out = {}
    for k, strat in enumerate(STRATEGIES):
        for tile in (TILE, WHOLE):
            peaks = Peaks(0.5)
            # every array kept: what the streamed run stored is compared, not values made again
            out[k, tile] = (st.run(mixed(peaks), inputs=inputs(), strategies=strat, tile=tile,
                                   progress=False, keep="all"), peaks)
    yield out
    st.close()


@pytest.mark.parametrize("k", range(len(STRATEGIES)))
def test_streamed_run_stores_the_same_arrays(runs, k):
    streamed, peaks = runs[k, TILE]
    whole, _ = runs[k, WHOLE]
    assert sorted(streamed.array_names()) == sorted(whole.array_names())
    for name in whole.array_names():
        x, y = streamed.array(name), whole.array(name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x.values, y.values, err_msg=name)
    # the user stencil really ran per tile: 9 tiles of at most 16 + 2 halo cells a side
    assert len(peaks.seen) == 9
    assert max(s[0] for s in peaks.seen) <= TILE + 2 and max(s[1] for s in peaks.seen) <= TILE + 2


@pytest.mark.parametrize("k", range(len(STRATEGIES)))
@pytest.mark.parametrize("q", QUERIES, ids=[f"{a}->{c}" for a, _, c in QUERIES])
def test_streamed_run_traces_the_same_cells(runs, k, q):
    start, cells, to = q
    ref = runs[k, WHOLE][0].trace(start, cells, to=to, record=False).cells
    got = runs[k, TILE][0].trace(start, cells, to=to, record=False).cells
    assert len(ref)
    np.testing.assert_array_equal(got, ref)


class Held(Progress):
    """Sees what the engine holds in memory as each operator starts, and its tiles."""

    wants_tasks = True

    def __init__(self, engine: LocalEngine):
        self.engine = engine
        self.held: dict[str, set[str]] = {}
        self.tile_events: dict[str, list[tuple[int, int]]] = {}
        self.current = ""

    def started(self, name):
        self.current = name
        self.held[name] = set(self.engine.values)

    def tiles(self, done, total):
        self.tile_events.setdefault(self.current, []).append((done, total))


def run_engine(tmp_path, wf, values, tile=TILE, capture=False):
    engine = LocalEngine(ArrayStore(tmp_path / "run", tile=tile))
    seen = Held(engine)
    run_workflow(engine, wf, values, resolve_strategies(wf, None), None, capture=capture,
                 progress=seen)
    return engine, seen


def test_arrays_are_dropped_after_their_last_reader(tmp_path):
    engine, seen = run_engine(tmp_path, mixed(Peaks(0.5)), inputs())
    # inputs stay while an operator reads them; streamed outputs are never held
    assert seen.held["lin"] == {"a", "b"}
    assert seen.held["blur"] == {"b"}
    assert seen.held["diff"] == {"b"}
    # m (aggregate, whole) reads diff from the store; diff's other reader streams
    assert seen.held["m"] == set()
    # m's output is one cell: held until cen, its last reader, has run
    assert seen.held["cen"] == {"m"}
    # cen (minus a one-cell input, read whole by every tile) streams; its output is
    # only read by a streamed stencil: not held
    assert seen.held["peaks"] == set()
    assert seen.held["t"] == set()
    assert seen.held["back"] == {"t"}
    assert engine.values == {}
    # progress: the streamed steps report their tiles; whole ones do not
    assert seen.tile_events["lin"] == [(k, 9) for k in range(1, 10)]
    assert seen.tile_events["peaks"][-1] == (9, 9)
    assert "m" not in seen.tile_events and seen.tile_events["cen"][-1] == (9, 9)


def test_a_whole_output_is_released_once_read(tmp_path):
    """Nothing (engine, driver, step results, lineage) pins a whole operator's output
    after its last reader: a weak reference to it dies."""
    refs: list[weakref.ref] = []

    class Source(Whole):
        def run(self, ctx, x):
            out = super().run(ctx, x)
            refs.append(weakref.ref(out))
            return out

    alive: dict[str, bool] = {}

    class Probe(Progress):
        def started(self, name):
            gc.collect()
            alive[name] = bool(refs) and refs[0]() is not None

    wf = Workflow("w")
    a = wf.input("a")
    s = wf.add("src", Source(), a)
    w1 = wf.add("w1", Whole(), s)
    w2 = wf.add("w2", Whole(), s)
    wf.add("w3", Whole(), w2)
    wf.add("w4", Whole(), w1)
    engine = LocalEngine(ArrayStore(tmp_path / "run", tile=TILE))
    run_workflow(engine, wf, {"a": np.ones(SHAPE)}, resolve_strategies(wf, None), None,
                 capture=True, progress=Probe())
    assert alive == {"src": False, "w1": True, "w2": True, "w3": False, "w4": False}


def test_a_streamed_step_never_sees_the_whole_array(tmp_path):
    peaks, whole = Peaks(0.5), Whole()
    wf = Workflow("w")
    a = wf.input("a")
    p = wf.add("peaks", peaks, a)
    wf.add("sum", whole, p)
    engine, seen = run_engine(tmp_path, wf, {"a": np.random.default_rng(1).random((60, 40))},
                              capture=True)
    assert len(peaks.seen) == 4 * 3
    assert all(s[0] <= TILE + 2 and s[1] <= TILE + 2 for s in peaks.seen)
    assert whole.seen == [(60, 40)]          # a global operator still gets the whole array


def test_xarray_and_small_inputs_run_whole(tmp_path):
    """DataArray inputs keep their dims and attrs (the operator sees what it was given);
    0-d inputs keep their shape; a streamed run matches a whole one."""
    got = {}

    class Keep(Operator):
        tiling = stencil(0)

        def run(self, ctx, x, s):
            got.setdefault("types", []).append((type(x).__name__, np.shape(s)))
            return x * 2

    wf = Workflow("w")
    x, s = wf.input("x"), wf.input("s")
    wf.add("k", Keep(), x, s)
    da = xr.DataArray(np.arange(40 * 40.0).reshape(40, 40), dims=("y", "x"), attrs={"unit": "adu"})
    run_engine(tmp_path, wf, {"x": da, "s": np.float64(3)})
    assert got["types"] == [("DataArray", ())]
    out = ArrayStore(tmp_path / "run").read_value("k")
    assert isinstance(out, xr.DataArray) and out.attrs == {"unit": "adu"} and out.dims == ("y", "x")


def test_an_operator_whose_tiles_disagree_on_dtype_is_named(tmp_path):
    class Fickle(Operator):
        tiling = stencil(0)

        def run(self, ctx, x):
            return x.astype(np.float32 if x[0, 0] < 0.5 else np.float64)

    wf = Workflow("w")
    wf.add("fickle", Fickle(), wf.input("a"))
    a = np.zeros(SHAPE)
    a[16:, 16:] = 1
    with pytest.raises(OperatorError, match=r"'fickle' is declared stencil but returned float64 "
                                            r"on tile \[16:32, 16:32\] and float32"):
        run_engine(tmp_path, wf, {"a": a})


def test_an_operator_failing_on_a_tile_names_the_tile(store):
    class Picky(Operator):
        tiling = stencil(0)

        def run(self, ctx, x):
            if x.max() > 1:
                raise ValueError("too bright")
            return x

    wf = Workflow("w")
    wf.add("picky", Picky(), wf.input("a"))
    a = np.zeros(SHAPE)
    a[40, 30] = 2
    with pytest.raises(OperatorError, match=r"operator 'picky' \(Picky\) failed: ValueError: too "
                                            r"bright \(on tile \[32:45, 16:32\] of 9\)"):
        store.run(wf, inputs={"a": a}, tile=TILE, progress=False)
