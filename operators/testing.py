"""Checking an operator's lineage against what it really does.

The perturbation oracle changes one input cell at a time and watches which
output cells change: those are the real dependencies (on this data).  The
mapping functions must cover them, ``map_b`` and ``map_f`` must describe one
relation, and the Full pairs the operator writes while running (read back
through a SubZero store, and collected again by re-execution) must describe
that same relation.  Relations are dense boolean matrices
``R[output flat index, input flat index]`` — meant for small arrays.

Use it for your own operators too::

    from subzero.operators.testing import check_lineage
    check_lineage(MyOp(), np.random.rand(5, 6), store_dir=tmp_path)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

import numpy as np

import subzero
from subzero.capture.context import Context
from subzero.model.cells import pack, unpack
from subzero.model.strategy import Direction

from .base import as_array


def shapes_of(arrays: Sequence) -> list[tuple[int, ...]]:
    return [as_array(a).shape for a in arrays]


def mapping_context(op, in_shapes, out_shape) -> Context:
    return Context("op", op, frozenset(), in_shapes, out_shape)


def run_plain(op, *arrays) -> np.ndarray:
    """Run ``op`` with no lineage requested, as the engine would."""
    shapes = shapes_of(arrays)
    return as_array(op.run(mapping_context(op, shapes, op.output_shape(*shapes)), *arrays))


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def candidates(x, dtype: np.dtype, rng: np.random.Generator) -> list:
    """Replacement values for one cell: a random change and two extremes, so
    that rank-based operators (min, max, median, thresholds) show the effect."""
    if dtype == np.dtype(bool):
        return [not x]
    if dtype.kind in "USO":                   # labels: another value, and an empty one
        return [v for v in (x + x[:1] + "~" if isinstance(x, str) else "~", "") if v != x]
    if np.issubdtype(dtype, np.integer):      # the dtype's extremes (uint8 too)
        info = np.iinfo(dtype)
        step = np.array(int(x) + int(rng.integers(1, 10))).astype(dtype)   # wraps
        return [v for v in (step, dtype.type(info.max), dtype.type(info.min)) if v != x]
    return [x + float(rng.uniform(1, 10)) * rng.choice([-1, 1]), 1e6, -1e6, np.nan]


def differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.inexact) or np.issubdtype(b.dtype, np.inexact):
        return ~np.isclose(a, b, rtol=1e-7, atol=1e-9, equal_nan=True)
    return a != b


def perturbation_relation(op, arrays: Sequence, i: int, seed: int = 0,
                          nan: bool = True) -> np.ndarray:
    """R[o, j] = changing input-i cell j changed output cell o."""
    arrays = [as_array(a) for a in arrays]
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"):
        base = run_plain(op, *arrays)
    a = arrays[i]
    rel = np.zeros((base.size, a.size), bool)
    for j in range(a.size):
        for v in candidates(a.flat[j], a.dtype, rng):
            if not nan and isinstance(v, float) and np.isnan(v):
                continue
            b = a.copy()
            b.flat[j] = v
            args = list(arrays)
            args[i] = b
            with np.errstate(all="ignore"):
                out = run_plain(op, *args)
            rel[:, j] |= differs(out, base).ravel()
    return rel


def mapping_relation(op, in_shapes, out_shape, i: int, direction: str) -> np.ndarray:
    """R[o, j] from ``map_b`` over every output cell, or ``map_f`` over every input cell.

    Also checks that one batched call returns the union of the single-cell calls.
    """
    ctx = mapping_context(op, in_shapes, out_shape)
    ishape = in_shapes[i]
    rel = np.zeros((_size(out_shape), _size(ishape)), bool)
    backward = direction == Direction.BACKWARD
    src, dst = (out_shape, ishape) if backward else (ishape, out_shape)
    fn = op.map_b if backward else op.map_f
    for k in range(_size(src)):
        res = pack(np.asarray(fn(unpack(np.array([k]), src), i, ctx), np.int64).reshape(-1, len(dst)),
                   dst)
        if backward:
            rel[k, res] = True
        else:
            rel[res, k] = True
    every = pack(np.asarray(fn(unpack(np.arange(_size(src)), src), i, ctx), np.int64)
                 .reshape(-1, len(dst)), dst)
    union = np.zeros(_size(dst), bool)
    union[every] = True
    want = rel.any(axis=0) if backward else rel.any(axis=1)
    assert np.array_equal(union, want), \
        f"{type(op).__name__}.{fn.__name__}(input {i}): the batched call differs from the per-cell calls"
    return rel


def traced_relation(run, step: str, inputs: Sequence[str], i: int, direction: str,
                    prefer: str | None, shortcut: bool = False,
                    sample: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """R[o, j] from single-cell traces of operator ``step`` (input i is array
    ``inputs[i]``), and which start cells were traced (``sample`` spreads a
    few over the array; None traces them all)."""
    shapes = run.shapes()
    out_shape, ishape = shapes[step], shapes[inputs[i]]
    rel = np.zeros((_size(out_shape), _size(ishape)), bool)
    backward = direction == Direction.BACKWARD
    src = out_shape if backward else ishape
    n = _size(src)
    starts = np.arange(n) if sample is None or sample >= n else \
        np.unique(np.linspace(0, n - 1, sample).astype(np.int64))
    for k in starts.tolist():
        cell = unpack(np.array([k]), src)
        res = run.trace(step if backward else inputs[i], cell, path=[(step, i)], prefer=prefer,
                        shortcut=shortcut, record=False)
        if backward:
            rel[k] = res.bitmap.ravel()
        else:
            rel[:, k] = res.bitmap.ravel()
    traced = np.zeros(n, bool)
    traced[starts] = True
    return rel, traced


def _explain(a: np.ndarray, b: np.ndarray, out_shape, in_shape, what_a: str, what_b: str) -> str:
    o, j = np.argwhere(a != b)[0]
    oc = tuple(int(x) for x in unpack(np.array([o]), out_shape)[0])
    jc = tuple(int(x) for x in unpack(np.array([j]), in_shape)[0])
    has = what_a if a[o, j] else what_b
    return f"output cell {oc} <- input cell {jc} is in {has} only ({int((a != b).sum())} differences)"


def check_lineage(op, *arrays, exact: bool = False, full: bool = True,
                  store_dir: str | os.PathLike | None = None, nan: bool = True,
                  seed: int = 0) -> list[np.ndarray]:
    """Assert that ``op``'s lineage is sound on ``arrays``; return its relations.

    * perturbation ⊆ map_b (``exact``: equal) for every input;
    * map_b and map_f give the same relation;
    * ``full``: :func:`check_full` in ``store_dir`` (or a temporary folder).
    """
    arrs = [as_array(a) for a in arrays]
    shapes = shapes_of(arrs)
    out_shape = op.output_shape(*shapes)
    name = type(op).__name__
    rels = []
    for i in range(len(arrs)):
        b = mapping_relation(op, shapes, out_shape, i, Direction.BACKWARD)
        f = mapping_relation(op, shapes, out_shape, i, Direction.FORWARD)
        assert np.array_equal(b, f), f"{name} input {i}: map_b and map_f disagree: " + \
            _explain(b, f, out_shape, shapes[i], "map_b", "map_f")
        p = perturbation_relation(op, arrs, i, seed=seed, nan=nan)
        missed = p & ~b
        assert not missed.any(), f"{name} input {i}: a real dependency is missing: " + \
            _explain(p, b, out_shape, shapes[i], "the perturbation oracle", "the mapping")
        if exact:
            assert np.array_equal(p, b), f"{name} input {i}: mapping is not exact: " + \
                _explain(p, b, out_shape, shapes[i], "the perturbation oracle", "the mapping")
        rels.append(b)
    if full:
        check_full([(op, arrs)], store_dir)
    return rels


#: Stored both ways, so each trace direction reads an index keyed its way (a
#: forward trace over a fullone *backward* index trips a subzero bug when no
#: pair matches; see the xfail test in tests/test_operators_api.py).
FULL_BOTH_WAYS = "full:fullone:backward+full:fullmany:forward"
#: Output cells traced by re-execution per input (each trace re-runs the operator).
REEXEC_SAMPLE = 8


def check_full(cases: Sequence[tuple], store_dir: str | os.PathLike | None = None,
               reexec: bool = True) -> None:
    """For each ``(operator, arrays)``: the Full pairs its ``run`` writes — stored
    by a real run and traced backward and forward, and collected again by
    black-box re-execution — equal its mapping relation (traced with
    ``prefer="map"``, and from ``map_b`` directly).  One store run for all cases.
    """
    if store_dir is None:
        with tempfile.TemporaryDirectory() as d:
            return check_full(cases, d, reexec)
    wf = subzero.Workflow("check")
    values, plan = {}, []
    for k, (op, arrays) in enumerate(cases):
        names = [f"c{k}_in{i}" for i in range(len(arrays))]
        for n, a in zip(names, arrays):
            wf.input(n)
            values[n] = as_array(a)
        wf.add(f"c{k}", op, *names)
        plan.append((f"c{k}", op, names))
    with subzero.open_store(store_dir) as st:
        run = st.run(wf, inputs=values, strategies={step: FULL_BOTH_WAYS for step, _, _ in plan},
                     progress=False)
        shapes = run.shapes()
        for step, op, names in plan:
            in_shapes = [shapes[n] for n in names]
            label = f"{type(op).__name__} (case {step})"
            for i in range(len(names)):
                want = mapping_relation(op, in_shapes, shapes[step], i, Direction.BACKWARD)
                # (what, direction, preferred method, cells to sample or None for all)
                checks: list[tuple[str, str, str | None, int | None]] = [
                    ("Map through the executor", Direction.BACKWARD, "map", None),
                    ("stored Full (fullone, backward index)", Direction.BACKWARD, None, None),
                    ("stored Full (fullmany, forward index)", Direction.FORWARD, None, None)]
                if reexec:      # the same emitter as stored Full: a spread of cells suffices
                    checks.append(("re-execution", Direction.BACKWARD, "reexec", REEXEC_SAMPLE))
                for what, direction, prefer, sample in checks:
                    got, traced = traced_relation(run, step, names, i, direction, prefer,
                                                  sample=sample)
                    w = want.copy()
                    if direction == Direction.BACKWARD:
                        w[~traced] = False
                    else:
                        w[:, ~traced] = False
                    assert np.array_equal(got, w), f"{label} input {i}: {what} differs: " + \
                        _explain(got, w, shapes[step], in_shapes[i], what, "map_b")
