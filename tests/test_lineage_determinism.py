"""Lineage proves itself on re-execution, too (issue 28): under ``blackbox`` a re-run's
output is checked against the stored output, but an operator may compute its output
exactly and draw its lineage at random -- then two identical traces gave different
cells.  An operator declares ``deterministic_lineage``: undeclared (None), a black-box
step re-runs it twice and the two relations must agree on the query's cells; True, one
re-run is trusted; False, re-execution is refused (at ``subzero run`` already).

The property test draws shapes, tilings (whole and tile-limited re-runs), modes (Full
and Pay), queries and directions, and checks both sides: an operator whose lineage is
a function of its inputs answers exactly what its stored lineage answers, and one
whose lineage is drawn afresh on every run is refused, never answered."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import subzero
from subzero import GLOBAL, Mode, Operator, Workflow, stencil
from subzero.cli import cli_terms
from subzero.errors import QueryError, StrategyError
from subzero.model.cells import box

#: lineage: a random half of the window of this radius (at least 8 cells, even at a corner)
RADIUS = {1: 8, 2: 2, 3: 1}
NOT_DETERMINISTIC = "is not deterministic in its lineage: two re-runs on the same inputs gave " \
                    "different lineage for the query's cells"


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit hash, vectorized."""
    z = z.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _subset(seeds: np.ndarray, cells: np.ndarray, shape) -> tuple[np.ndarray, np.ndarray]:
    """For each cell, the window cells whose bit of ``mix(seed + k)`` is set: (cells,
    owning row), clipped to ``shape``.  Half of each window, at random per seed."""
    r = RADIUS[cells.shape[1]]
    offs = box((-r,) * cells.shape[1], (r + 1,) * cells.shape[1])
    k = np.arange(len(offs), dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = _mix(seeds[:, None] + k[None, :] * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    keep = (bits & np.uint64(1)).astype(bool)
    win = cells[:, None, :] + offs[None, :, :]
    keep &= np.all((win >= 0) & (win < np.asarray(shape)), axis=2)
    rows = np.repeat(np.arange(len(cells)), keep.sum(axis=1))
    return win[keep], rows


class Drawn(Operator):
    """Output ``2x + 1``, exactly.  Lineage: each output cell depends on a subset of the
    input window around it (radius ``RADIUS[ndim]``), drawn from a seed -- the input's
    value at the cell (a function of the inputs: deterministic), or, with ``fresh``, that
    value mixed with a number drawn anew on every run (random lineage, exact output)."""

    def __init__(self, mode: Mode, fresh: bool, tiled: bool, declared: bool | None = None,
                 ndim: int = 2):
        self.mode, self.fresh = mode, fresh
        self.tiling = stencil(RADIUS[ndim]) if tiled else GLOBAL
        self.deterministic_lineage = declared
        self.runs = 0

    def supported_modes(self):
        return {self.mode, Mode.BLACKBOX}

    def run(self, ctx, x):
        self.runs += 1
        x = np.ascontiguousarray(x, np.float64)
        if ctx.modes & {Mode.FULL, Mode.PAY}:
            salt = np.random.default_rng().integers(1, 2**62) if self.fresh else 0
            cells = box((0,) * x.ndim, x.shape)
            seeds = x.reshape(-1).view(np.uint64) ^ np.uint64(salt)
            if Mode.FULL in ctx.modes:
                ins, rows = _subset(seeds, cells, x.shape)
                ctx.lwrite_groups(cells, np.arange(len(cells)), (ins, rows))
            if Mode.PAY in ctx.modes:
                ctx.lwrite(cells, payload=[s.tobytes() for s in seeds], each=True)
        return 2.0 * x + 1.0

    def map_p(self, cells, payload, i, ctx):
        seeds = np.full(len(cells), np.frombuffer(payload, np.uint64)[0], np.uint64)
        return _subset(seeds, np.asarray(cells, np.int64), ctx.input_shape(i))[0]


def pair_of(op_bb: Operator, op_stored: Operator) -> Workflow:
    """The same operator twice on one input: ``bb`` (traced by re-execution) and
    ``kept`` (its lineage stored: the oracle)."""
    wf = Workflow("drawn")
    x = wf.input("x")
    wf.add("bb", op_bb, x)
    wf.add("kept", op_stored, x)
    return wf


def image(shape, seed=3):
    return np.random.default_rng(seed).normal(size=shape)


STORED = {Mode.FULL: "full", Mode.PAY: "pay"}


# -- the property ------------------------------------------------------------------------------

@st.composite
def cases(draw):
    ndim = draw(st.sampled_from([1, 2, 3]))
    lo = {1: 40, 2: 6, 3: 5}[ndim]
    shape = tuple(draw(st.integers(lo, lo + 8)) for _ in range(ndim))
    mode = draw(st.sampled_from([Mode.FULL, Mode.PAY]))
    tiled = draw(st.booleans())
    fresh = draw(st.booleans())
    backward = draw(st.booleans())
    cells = draw(st.lists(st.tuples(*[st.integers(0, s - 1) for s in shape]), min_size=3,
                          max_size=6, unique=True))
    return shape, mode, tiled, fresh, backward, cells


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_reexecution_answers_deterministic_lineage_and_refuses_random_lineage(tmp_path_factory, case):
    """Random lineage (half of each window of 8 or more cells, drawn afresh per run)
    differs between two re-runs on 3 or more query cells with probability 1 - 2**-24 or
    more: refused.
    Lineage drawn from the input's values answers exactly what the stored lineage does,
    through whole and tile-limited re-runs alike."""
    shape, mode, tiled, fresh, backward, cells = case
    with subzero.open_store(tmp_path_factory.mktemp("drawn")) as store:
        nd = len(shape)
        run = store.run(pair_of(Drawn(mode, fresh, tiled, ndim=nd), Drawn(mode, fresh, tiled, ndim=nd)),
                        inputs={"x": image(shape)}, tile=4, progress=False,
                        strategies={"bb": "blackbox", "kept": STORED[mode]})
        start, to = ("bb", "x") if backward else ("x", "bb")
        if fresh:
            for _ in range(2):          # two identical traces: refused both times
                with pytest.raises(QueryError, match=NOT_DETERMINISTIC):
                    run.trace(start, cells, to=to, record=False)
            return
        got = run.trace(start, cells, to=to, record=False)
        assert got.steps[-1].method.startswith("reexec"), got.steps
        want = run.trace("kept" if backward else "x", cells, to="x" if backward else "kept",
                         record=False)
        assert {tuple(c) for c in got.cells.tolist()} == {tuple(c) for c in want.cells.tolist()}


# -- the declarations --------------------------------------------------------------------------

def test_two_identical_traces_of_random_lineage_are_refused_with_one_line(cli, tmp_path):
    mod = tmp_path / "drawn_wf.py"
    mod.write_text(
        "import numpy as np\n"
        "from subzero import Mode, Operator, Workflow\n"
        "class Sampled(Operator):\n"
        "    '''Exact output; lineage: one input cell drawn at random per output cell.'''\n"
        "    def supported_modes(self):\n"
        "        return {Mode.FULL, Mode.BLACKBOX}\n"
        "    def run(self, ctx, x):\n"
        "        if Mode.FULL in ctx.modes:\n"
        "            cells = np.argwhere(np.ones(x.shape, bool))\n"
        "            pick = np.random.default_rng().integers(0, len(cells), len(cells))\n"
        "            ctx.lwrite(cells, cells[pick], each=True)\n"
        "        return x * 2\n"
        "def workflow():\n"
        "    wf = Workflow('sampled')\n"
        "    wf.add('pick', Sampled(), wf.input('x', default=np.arange(400.0).reshape(20, 20)))\n"
        "    return wf\n")
    store = tmp_path / "st"
    code, _, err = cli("run", mod, "--store", store, "--strategy", "pick=blackbox", "-q")
    assert code == 0, err
    for _ in range(2):
        code, out, err = cli("trace", "--store", store, "--from", "pick", "--cells", "3,4;5,6;7,8",
                             "--to", "x")
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1, err
        assert "operator 'pick' " + NOT_DETERMINISTIC in lines[0]
        assert "--strategy pick=full" in lines[0] and "deterministic_lineage = False" in lines[0]


@pytest.mark.parametrize("tiled", [False, True])
def test_undeclared_lineage_is_re_run_twice_declared_once(store, tiled):
    shape = (12, 12)
    for declared, runs in ((None, 2), (True, 1)):
        op = Drawn(Mode.FULL, fresh=False, tiled=tiled, declared=declared)
        run = store.run(pair_of(op, Drawn(Mode.FULL, False, tiled)), inputs={"x": image(shape)},
                        tile=4, progress=False, strategies={"bb": "blackbox", "kept": "full"})
        op = run.workflow.steps["bb"].operator
        before = op.runs
        res = run.trace("bb", [(5, 5)], to="x", record=False)
        assert res.steps[0].method == "reexec:full"
        assert op.runs - before == runs, (declared, tiled)


def test_declared_deterministic_lineage_is_trusted_once(store):
    """``deterministic_lineage = True`` is the author's promise: one re-run, its output
    checked, answers (random lineage declared deterministic is then not caught -- the
    declaration is what saves the second re-run)."""
    run = store.run(pair_of(Drawn(Mode.FULL, fresh=True, tiled=False, declared=True),
                            Drawn(Mode.FULL, False, False)), inputs={"x": image((10, 10))},
                    progress=False, strategies={"bb": "blackbox", "kept": "full"})
    assert len(run.trace("bb", [(4, 4), (5, 5), (6, 6)], to="x", record=False)) > 0


def test_lineage_declared_not_deterministic_is_refused_before_the_run(store):
    op = Drawn(Mode.FULL, fresh=True, tiled=False, declared=False)
    with pytest.raises(StrategyError) as e:
        store.run(pair_of(op, Drawn(Mode.FULL, False, False)), inputs={"x": image((8, 8))},
                  strategies={"bb": "blackbox", "kept": "full"})
    msg = str(e.value)
    assert "operator 'bb' (Drawn) is declared not deterministic in its lineage " \
           "(`deterministic_lineage = False`)" in msg and "\n" not in msg
    assert "--strategy bb=full" in cli_terms(msg)
    assert store.runs() == []                     # nothing ran, no failed run recorded
    run = store.run(pair_of(op, Drawn(Mode.FULL, False, False)), inputs={"x": image((8, 8))},
                    strategies={"bb": "full", "kept": "full"}, progress=False)
    a = run.trace("bb", [(3, 3)], to="x", record=False)     # stored: what the run did
    assert a.cellset == run.trace("bb", [(3, 3)], to="x", record=False).cellset
    with pytest.raises(QueryError, match=r"declares its lineage not deterministic"):
        run.trace("bb", [(3, 3)], to="x", prefer="reexec", record=False)


def test_the_library_declares_what_it_knows():
    """Built-in operators compute their lineage from coordinates or their output: declared,
    so black-box traces through them re-run once; an operator of the user's own is not."""
    from subzero.operators import Add, ConnectedComponents, MeanFilter, Slice, WindowComposite
    for cls in (Add, MeanFilter, Slice, ConnectedComponents):
        assert cls.deterministic_lineage is True, cls
    assert WindowComposite.deterministic_lineage is None
    assert Operator.deterministic_lineage is None
