"""Operators whose output shape differs from their first input's -- reductions,
resampling, rank changes -- written as a user would: no ``output_shape``.

Each writes FULL, PAY and COMP lineage with ``ctx.lwrite`` inside ``run`` (and
has mapping functions for MAP / COMP); SubZero learns the output shape only
when ``run`` returns.  Every strategy (FullOne, FullMany, PayOne, PayMany,
backward and forward), mapping functions and black-box re-execution must give
the cells a brute-force oracle gives (pure Python, from ``deps``), on the local
engine and on Spark.
"""

from __future__ import annotations

import contextlib
import io
import itertools

import numpy as np
import pytest

from subzero import LineageError, Mode, Operator, Workflow

FULL4 = [f"full:{e}:{d}" for e in ("fullone", "fullmany") for d in ("backward", "forward")]
PAY4 = [f"pay:{e}:{d}" for e in ("payone", "paymany") for d in ("backward", "forward")]
COMP4 = [f"comp:{e}:{d}" for e in ("payone", "paymany") for d in ("backward", "forward")]

#: operator copy -> (modes it supports, strategies stored, trace preferences and the
#: relation each answers with: "deps" = the operator's relation, "comp" = deps plus the
#: input's origin on the exception cells)
COPIES = {
    "full": ({Mode.FULL}, FULL4, {**{s: "deps" for s in FULL4}, "reexec": "deps"}),
    "pay": ({Mode.PAY}, PAY4, {**{s: "deps" for s in PAY4}, "reexec": "deps"}),
    "comp": ({Mode.COMP, Mode.MAP}, COMP4 + ["map"],
             {**{s: "comp" for s in COMP4}, "reexec": "comp", "map": "deps"}),
    "map": ({Mode.MAP}, ["map"], {"map": "deps", None: "deps"}),
    "bb": ({Mode.FULL}, ["blackbox"], {None: "deps", "reexec": "deps"}),
}


def exception(cells: np.ndarray) -> np.ndarray:
    """Output cells whose COMP lineage is a payload pair (the rest: mapping functions)."""
    return cells.sum(axis=1) % 3 == 0


class ShapeOp(Operator):
    """Base of the shape-changing test operators: ``compute`` is the array work,
    ``back``/``fwd`` the vectorized relation, ``deps`` the oracle's (one output
    cell -> its input cells, plain Python).  ``form`` picks how FULL pairs are
    written, so that every ``lwrite`` spelling meets an unknown output shape."""

    in_shape: tuple[int, ...] = ()
    form = "each"

    def __init__(self, modes=frozenset({Mode.FULL})):
        self.modes_ = set(modes)

    def supported_modes(self):
        return self.modes_ | {Mode.BLACKBOX}

    # -- to define --------------------------------------------------------------------
    def compute(self, x):  # pragma: no cover - abstract
        raise NotImplementedError

    def back(self, cells):  # pragma: no cover - abstract
        """(input cells, row of ``cells`` each belongs to), grouped by row."""
        raise NotImplementedError

    def fwd(self, cells):  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def deps(o: tuple[int, ...]) -> list[tuple[int, ...]]:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- run -----------------------------------------------------------------------------
    def run(self, ctx, x):
        out = self.compute(np.asarray(x))
        cells = np.argwhere(np.ones(out.shape, bool))
        if Mode.FULL in ctx.modes:
            self.write_full(ctx, cells)
        if Mode.PAY in ctx.modes:
            ctx.lwrite(self.spell(cells), payload=b"d", each=True)
        if Mode.COMP in ctx.modes:
            exc = cells[exception(cells)]
            ctx.lwrite(self.spell(exc), payload=b"o", each=True)
        return out

    def spell(self, cells):
        """Output cells as the operator's authors would pass them (1-D outputs:
        a flat array of indices)."""
        return cells[:, 0] if cells.shape[1] == 1 and len(cells) > 1 else cells

    def write_full(self, ctx, cells):
        ins, rows = self.back(cells)
        if self.form == "groups":
            ctx.lwrite_groups(cells, np.arange(len(cells)), (ins, rows))
        elif self.form == "tuples":                  # one pair per call, single tuples
            for k, c in enumerate(cells):
                ctx.lwrite(tuple(int(v) for v in c), [tuple(int(v) for v in r) for r in ins[rows == k]])
        else:                                        # each=True, K input cells per row
            k = len(ins) // max(len(cells), 1)
            ctx.lwrite(self.spell(cells), ins.reshape(len(cells), k, -1), each=True)

    # -- lineage functions ------------------------------------------------------------------
    def map_b(self, cells, i, ctx):
        return self.back(np.asarray(cells, np.int64))[0]

    def map_f(self, cells, i, ctx):
        return self.fwd(np.asarray(cells, np.int64))

    def map_p(self, cells, payload, i, ctx):
        ins = self.back(np.asarray(cells, np.int64))[0]
        if payload == b"o":
            ins = np.concatenate([ins, np.zeros((1, len(ctx.input_shape(i))), np.int64)])
        return ins


class SumAxis0(ShapeOp):
    """3-D cube -> 2-D image: sum over the first axis."""

    in_shape = (3, 4, 5)

    def compute(self, x):
        return x.sum(axis=0)

    def back(self, cells):
        d = self.in_shape[0]
        rows = np.repeat(np.arange(len(cells)), d)
        first = np.tile(np.arange(d), len(cells))[:, None]
        return np.concatenate([first, cells[rows]], axis=1), rows

    def fwd(self, cells):
        return cells[:, 1:]

    @staticmethod
    def deps(o):
        return [(i, o[0], o[1]) for i in range(3)]


class Downsample2(ShapeOp):
    """2x2 block means (the last blocks clipped): (5, 7) -> (3, 4)."""

    in_shape = (5, 7)
    form = "groups"

    def compute(self, x):
        s = np.add.reduceat(np.add.reduceat(x, np.arange(0, x.shape[0], 2), axis=0),
                            np.arange(0, x.shape[1], 2), axis=1)
        return s / 4.0

    def back(self, cells):
        offs = np.array([(0, 0), (0, 1), (1, 0), (1, 1)])
        ins = (cells[:, None, :] * 2 + offs[None]).reshape(-1, 2)
        rows = np.repeat(np.arange(len(cells)), 4)
        ok = np.all(ins < np.asarray(self.in_shape), axis=1)
        return ins[ok], rows[ok]

    def fwd(self, cells):
        return cells // 2

    @staticmethod
    def deps(o):
        return [(a, b) for a in range(2 * o[0], min(2 * o[0] + 2, 5))
                for b in range(2 * o[1], min(2 * o[1] + 2, 7))]


class Upsample2(ShapeOp):
    """Nearest-neighbour 2x upsampling: (3, 4) -> (6, 8); every output cell
    lies outside the first input when its row or column is 3 or more."""

    in_shape = (3, 4)

    def compute(self, x):
        return np.repeat(np.repeat(x, 2, axis=0), 2, axis=1)

    def back(self, cells):
        return cells // 2, np.arange(len(cells))

    def fwd(self, cells):
        offs = np.array([(0, 0), (0, 1), (1, 0), (1, 1)])
        return (cells[:, None, :] * 2 + offs[None]).reshape(-1, 2)

    @staticmethod
    def deps(o):
        return [(o[0] // 2, o[1] // 2)]


class FlattenT(ShapeOp):
    """Transpose then flatten, 2-D -> 1-D: out[k] = x[k % 3, k // 3]; lineage
    written with flat 1-D index arrays (``lwrite(np.arange(n), ...)``)."""

    in_shape = (3, 4)

    def compute(self, x):
        return x.T.ravel()

    def back(self, cells):
        k = cells[:, 0]
        return np.stack([k % 3, k // 3], axis=1), np.arange(len(cells))

    def fwd(self, cells):
        return (cells[:, 1] * 3 + cells[:, 0])[:, None]

    @staticmethod
    def deps(o):
        return [(o[0] % 3, o[0] // 3)]


class Unflatten(ShapeOp):
    """Reshape 1-D -> 2-D: (12,) -> (3, 4); FULL pairs written one call per
    output cell, as single tuples ``lwrite((i, j), [(k,)])``."""

    in_shape = (12,)
    form = "tuples"

    def compute(self, x):
        return x.reshape(3, 4)

    def back(self, cells):
        return (cells[:, 0] * 4 + cells[:, 1])[:, None], np.arange(len(cells))

    def fwd(self, cells):
        k = cells[:, 0]
        return np.stack([k // 4, k % 4], axis=1)

    @staticmethod
    def deps(o):
        return [(4 * o[0] + o[1],)]


OPS = [SumAxis0, Downsample2, Upsample2, FlattenT, Unflatten]


# =========================================================================== oracle

def out_shape_of(cls) -> tuple[int, ...]:
    return cls().compute(np.zeros(cls.in_shape)).shape


def oracle(cls, kind: str) -> dict[tuple, set[tuple]]:
    """Output cell -> input cells, in plain Python."""
    rel = {}
    for o in itertools.product(*[range(n) for n in out_shape_of(cls)]):
        d = set(cls.deps(o))
        if kind == "comp" and sum(o) % 3 == 0:
            d.add((0,) * len(cls.in_shape))
        rel[o] = d
    return rel


def expect(cls, kind: str, cells, backward: bool) -> list[list[int]]:
    rel = oracle(cls, kind)
    q = {tuple(c) for c in cells}
    if backward:
        got = set().union(*[rel[c] for c in q]) if q else set()
    else:
        got = {o for o, ins in rel.items() if ins & q}
    return [list(c) for c in sorted(got)]


def queries(cls):
    """A few output and input cell sets (corners, a cell in the middle, several)."""
    outs = out_shape_of(cls)
    ins = cls.in_shape
    last = lambda s: tuple(n - 1 for n in s)                      # noqa: E731
    mid = lambda s: tuple(n // 2 for n in s)                      # noqa: E731
    return ([[last(outs)], [mid(outs), (0,) * len(outs)]],
            [[(0,) * len(ins)], [last(ins), mid(ins)]])


def traced(run, start, cells, to, prefer):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        res = run.trace(start, cells, to=to, prefer=prefer, record=False)
    assert err.getvalue() == "", err.getvalue()              # nothing here is damaged
    return res.cells.tolist()


def shape_workflow(cls) -> tuple[Workflow, dict[str, str]]:
    wf = Workflow("shapes")
    x = wf.input("x")
    for copy, (modes, _, _) in COPIES.items():
        wf.add(copy, cls(modes), x)
    return wf, {copy: "+".join(s) for copy, (_, s, _) in COPIES.items()}


def check_against_oracle(run, cls) -> int:
    n = 0
    outs, ins = queries(cls)
    for copy, (_, _, prefers) in COPIES.items():
        for prefer, kind in prefers.items():
            for q in outs:
                assert traced(run, copy, q, "x", prefer) == expect(cls, kind, q, True), \
                    (cls.__name__, copy, prefer, "backward", q)
                n += 1
            for q in ins:
                assert traced(run, "x", q, copy, prefer) == expect(cls, kind, q, False), \
                    (cls.__name__, copy, prefer, "forward", q)
                n += 1
    return n


# =========================================================================== tests

@pytest.mark.parametrize("cls", OPS, ids=lambda c: c.__name__)
def test_shape_changing_operator_matches_oracle(store, cls):
    """FULL, PAY, COMP, MAP and BLACKBOX, every encoding and direction."""
    assert not hasattr(cls, "output_shape") or cls.output_shape is Operator.output_shape
    wf, strategies = shape_workflow(cls)
    x = np.arange(np.prod(cls.in_shape), dtype=np.float64).reshape(cls.in_shape)
    run = store.run(wf, inputs={"x": x}, strategies=strategies, progress=False)
    out = run.array("full").values
    assert out.shape == out_shape_of(cls) and np.array_equal(out, cls().compute(x))
    assert check_against_oracle(run, cls) > 0
    pairs = {o["name"]: o["pairs"] for o in run.ops()}
    assert pairs["full"] == pairs["pay"] == int(np.prod(out.shape))


class Opaque(Operator):
    def run(self, ctx, x):
        return x.sum(axis=0)


def test_opaque_shape_changing_operator_is_all_to_all(store):
    """Nothing but ``run``: every output cell depends on every input cell."""
    wf = Workflow("opaque")
    wf.add("m", Opaque(), wf.input("x"))
    run = store.run(wf, inputs={"x": np.ones((3, 4, 5))}, progress=False)
    assert run.array("m").values.shape == (4, 5)
    assert len(run.trace("m", [(1, 1)], to="x", record=False).cells) == 60
    assert len(run.trace("x", [(0, 0, 0)], to="m", record=False).cells) == 20


class ReadsShape(Operator):
    """Reads ``ctx.output_shape`` in run() without defining output_shape."""

    def __init__(self, reduce: bool):
        self.reduce = reduce

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        out = x.sum(axis=0) if self.reduce else x * 2
        cells = np.argwhere(np.ones(ctx.output_shape, bool))[:1]
        ctx.lwrite(cells, cells[:, :x.ndim] if not self.reduce else [(0, 0, 0)])
        return out


def test_reading_a_guessed_output_shape_of_another_shape_is_an_error(store):
    wf = Workflow("t")
    wf.add("r", ReadsShape(reduce=True), wf.input("x"))
    with pytest.raises(LineageError) as e:
        store.run(wf, inputs={"x": np.ones((3, 4, 5))}, strategies={"r": "full"}, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "'r'" in msg and "ReadsShape does not define output_shape" in msg
    assert "(3, 4, 5)" in msg and "(4, 5)" in msg


def test_reading_the_output_shape_of_a_same_shape_operator_still_works(store):
    wf = Workflow("t")
    wf.add("r", ReadsShape(reduce=False), wf.input("x"))
    run = store.run(wf, inputs={"x": np.ones((3, 4))}, strategies={"r": "full"}, progress=False)
    assert run.trace("r", [(0, 0)], to="x", record=False).cells.tolist() == [[0, 0]]


class Declared(Operator):
    """Declares a wrong output_shape and reads it in run()."""

    def output_shape(self, shape):
        return shape

    def run(self, ctx, x):
        assert ctx.output_shape == x.shape
        return x[:2]


def test_a_wrong_declared_output_shape_read_in_run_is_an_error(store):
    wf = Workflow("t")
    wf.add("d", Declared(), wf.input("x"))
    with pytest.raises(LineageError, match=r"'d' read ctx.output_shape \(3, 4\).*Declared.output_shape"
                                           r".*shape \(2, 4\)"):
        store.run(wf, inputs={"x": np.ones((3, 4))}, progress=False)


class BadCells(Operator):
    """Writes lineage that does not fit its real (reduced) output."""

    def __init__(self, out, each=False):
        self.out, self.each = out, each

    def supported_modes(self):
        return {Mode.FULL, Mode.PAY, Mode.BLACKBOX}

    def run(self, ctx, x):
        if self.each:
            ctx.lwrite(self.out, payload=b"p", each=True)
        else:
            ctx.lwrite(self.out, [(0, 0, 0)])
        return x.sum(axis=0)

    def map_p(self, cells, payload, i, ctx):  # pragma: no cover - never reached
        return cells


@pytest.mark.parametrize("out,each,match", [
    ([(1, 2, 3)], False, r"output cells of 3 coordinates, e.g. \(1, 2, 3\), but its output has 2 "
                         r"dimensions \(shape \(4, 5\)\)"),
    ((2, 4, 1), False, r"bad output cells in lwrite: cells have 1 coordinates, the array has 2 "
                       r"dimensions"),                                 # flat: replayed, then checked
    ([(0, 5)], False, r"output cell \(0, 5\), outside its output \(shape \(4, 5\)\)"),
    ((4, 0), True, r"output cell \(4, 0\), outside its output \(shape \(4, 5\)\)"),
    ([(1,)], True, r"output cells of 1 coordinates"),
])
def test_lineage_that_does_not_fit_the_real_output_is_one_clear_error(store, out, each, match):
    """Validated against the real output shape (4, 5), not the guess (5, 4, 5)."""
    wf = Workflow("t")
    wf.add("bad", BadCells(out, each), wf.input("x"))
    with pytest.raises(LineageError, match=match) as e:
        store.run(wf, inputs={"x": np.ones((5, 4, 5))}, strategies={"bad": "pay" if each else "full"},
                  progress=False)
    assert "'bad'" in str(e.value) and "\n" not in str(e.value)


class Reuses(Operator):
    """A 2-D -> 1-D operator that reuses one index array for several lwrite calls."""

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        idx = np.array([0, 1])
        ins = np.array([[0, 0], [0, 1]])
        ctx.lwrite(idx, ins, each=True)
        idx[:] = [2, 3]
        ins[:] = [[1, 0], [1, 1]]
        ctx.lwrite(idx, ins, each=True)
        return x.ravel()


def test_deferred_lineage_is_what_was_written_at_the_call(store):
    """Flat cells wait for the output shape; later changes to the caller's
    arrays must not change them."""
    wf = Workflow("t")
    wf.add("r", Reuses(), wf.input("x"))
    run = store.run(wf, inputs={"x": np.ones((2, 2))}, strategies={"r": "full"}, progress=False)
    for k, cell in enumerate([[0, 0], [0, 1], [1, 0], [1, 1]]):
        assert run.trace("r", [(k,)], to="x", record=False).cells.tolist() == [cell]


def test_cli_error_is_one_line(cli, tmp_path):
    """Through the CLI: exit 2, one line naming the operator."""
    mod = tmp_path / "wf.py"
    mod.write_text(
        "import numpy as np\n"
        "from subzero import Mode, Operator, Workflow\n"
        "class Bad(Operator):\n"
        "    def supported_modes(self):\n"
        "        return {Mode.FULL, Mode.BLACKBOX}\n"
        "    def run(self, ctx, x):\n"
        "        ctx.lwrite([(9, 9)], [(0, 0, 0)])\n"
        "        return x.sum(axis=0)\n"
        "def workflow():\n"
        "    wf = Workflow('w')\n"
        "    wf.add('bad', Bad(), wf.input('x'))\n"
        "    return wf\n")
    np.save(tmp_path / "x.npy", np.ones((3, 4, 5)))
    code, out, err = cli("run", str(mod), "--store", str(tmp_path / "s"), "--input",
                         f"x={tmp_path / 'x.npy'}", "--strategy", "bad=full", "--engine", "local")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "'bad'" in lines[0] and "(9, 9)" in lines[0], err


@pytest.mark.parametrize("cls", OPS, ids=lambda c: c.__name__)
def test_shape_changing_operators_on_spark(spark, store, cls):
    """The Spark engine (one task on the whole array: these operators are
    global) stores the same arrays and lineage as the oracle expects."""
    wf, strategies = shape_workflow(cls)
    x = np.arange(np.prod(cls.in_shape), dtype=np.float64).reshape(cls.in_shape)
    run = store.run(wf, inputs={"x": x}, strategies=strategies, engine="spark", spark=spark,
                    tile=2, progress=False)
    assert np.array_equal(run.array("comp").values, cls().compute(x))
    assert check_against_oracle(run, cls) > 0
