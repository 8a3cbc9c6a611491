"""Property-based correctness oracle for lineage capture, storage and tracing.

Hypothesis generates random shapes (1-4 dims), random operators (output shape
and rank independent of the inputs', declared or -- like most user operators --
not; region pairs
written with every ``lwrite`` form, payload pairs whose ``map_p`` is a function
of the pair's cells and payload, composite operators with a default mapping and
payload exceptions, overlapping pairs) and random queries.  Every query is
answered by the real system -- each storage strategy, mapping functions and
black-box re-execution, backward and forward, one step and multi-step -- and
compared to a brute-force oracle computed from the same generated pairs with
plain Python (see ``oracle_ops.py``).

One store is shared per module and each example is one run holding several
copies of the operator (different strategy sets), so an example costs one run
plus many traces.  A "case" is one (example, strategy/method, direction,
query) trace compared with the oracle; ``CASES`` counts them.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import time

import numpy as np
import oracle_ops as oo
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from oracle_ops import Call, OpSpec, Pair, make_op, relation, size_of

import subzero
from subzero import LineageError, Mode, Operator, StrategyError
from subzero.operators import WindowComposite

INPUT_NAMES = ("a", "b", "c")
ENC = {"full": ("fullone", "fullmany"), "pay": ("payone", "paymany"),
       "comp": ("payone", "paymany")}
DIRS = ("backward", "forward")
SHORT = {"full": "full:fullone:backward", "pay": "pay:payone:backward",
         "comp": "comp:payone:backward", "full:fullmany": "full:fullmany:backward",
         "comp:paymany": "comp:paymany:backward", "pay:paymany": "pay:paymany:backward"}

CASES = {"examples": 0, "cases": 0, "nonempty": 0, "skipped_ambiguous": 0, "seconds": 0.0}

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture])


def all_stored(mode: str) -> list[str]:
    return [f"{mode}:{e}:{d}" for e in ENC[mode] for d in DIRS]


def normalize(s: str) -> str:
    return SHORT.get(s, s)


@pytest.fixture
def per_payload_choices(monkeypatch) -> list[bool]:
    """What every backward payload step chose (``relation.per_payload``: True, map_p per
    payload; False, map_p_pairs once), in order, as the steps ran."""
    from subzero.query import relation
    got: list[bool] = []
    real = relation.per_payload

    def per_payload(*a):
        got.append(real(*a))
        return got[-1]
    monkeypatch.setattr(relation, "per_payload", per_payload)
    return got


@pytest.fixture(scope="module")
def ostore(tmp_path_factory):
    st_ = subzero.open_store(tmp_path_factory.mktemp("oracle") / "store")
    yield st_
    st_.close()
    print(f"\n[oracle] {CASES['examples']} examples, {CASES['cases']} checked cases "
          f"({CASES['nonempty']} with a non-empty answer), "
          f"{CASES['skipped_ambiguous']} planner checks skipped (ambiguous), "
          f"{CASES['seconds']:.1f}s in traces")


# =========================================================================== generators

MAXDIM = {1: 40, 2: 12, 3: 6, 4: 4}


@st.composite
def shapes(draw, max_cells: int = 200):
    nd = draw(st.integers(1, 4))
    dims = [draw(st.integers(1, MAXDIM[nd])) for _ in range(nd)]
    while size_of(dims) > max_cells:
        k = int(np.argmax(dims))
        dims[k] -= 1
    return tuple(dims)


@st.composite
def pairs(draw, spec_shapes, focus, one_out=False, nonempty=False, allow_bbox=True):
    out_shape, in_shapes = spec_shapes
    n_out = size_of(out_shape)
    lo, hi = focus
    idx = st.one_of(st.integers(lo, hi), st.integers(0, n_out - 1))
    if one_out:
        out = (draw(idx),)
    else:
        out = tuple(draw(st.lists(idx, min_size=1 if nonempty else 0, max_size=5)))
    kinds = ["explicit", "explicit", "radius"] + (["bbox"] if allow_bbox else [])
    src = draw(st.sampled_from(kinds))
    if src == "explicit":
        ins = tuple(tuple(draw(st.lists(st.integers(0, size_of(s) - 1), max_size=6)))
                    for s in in_shapes)
        return Pair(out, ins=ins)
    return Pair(out, pkind=src, r=draw(st.integers(0, 2)))


@st.composite
def calls(draw, spec_shapes, focus, allow_bbox=True):
    out_shape, in_shapes = spec_shapes
    n_out = size_of(out_shape)
    form = draw(st.sampled_from(["single", "single", "each", "each", "groups", "groups", "dense"]))
    style = draw(st.integers(0, 11))
    if form == "single":
        return Call("single", (draw(pairs(spec_shapes, focus, allow_bbox=allow_bbox)),), style)
    if form == "each":
        ps = draw(st.lists(pairs(spec_shapes, focus, one_out=True, allow_bbox=allow_bbox),
                           min_size=0, max_size=6))
        return Call("each", tuple(ps), style)
    if form == "groups":
        ps = draw(st.lists(pairs(spec_shapes, focus, nonempty=True, allow_bbox=allow_bbox),
                           min_size=1, max_size=5))
        labels = draw(st.lists(st.integers(-40, 40), min_size=len(ps), max_size=len(ps),
                               unique=True))
        unused = [l for l in range(-45, 46) if l not in labels]
        junk = tuple(tuple(draw(st.lists(st.tuples(st.integers(0, size_of(s) - 1),
                                                   st.sampled_from(unused)), max_size=3)))
                     for s in in_shapes)
        return Call("groups", tuple(ps), style, tuple(labels), junk,
                    seed=draw(st.integers(0, 1000)))
    # dense: many one-cell pairs from a seeded generator (crosses record blocks of
    # 256 pairs, many pairs share key cells); emitted with each=True
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    n = int(rng.integers(0, 20) if rng.random() < 0.5 else rng.integers(250, 400))
    outs = rng.integers(0, n_out, n)
    if rng.random() < 0.5:
        k = int(rng.integers(0, 3))
        ins = [rng.integers(0, size_of(s), (n, k)) for s in in_shapes]
        ps = tuple(Pair((int(outs[j]),), ins=tuple(tuple(int(x) for x in a[j]) for a in ins))
                   for j in range(n))
    else:
        r = int(rng.integers(0, 2))
        ps = tuple(Pair((int(o),), pkind="radius", r=r) for o in outs)
    return Call("each", ps, 1 if style % 2 else 2)


@st.composite
def op_specs(draw, kind=None, in_shapes=None, out_shape=None, n_inputs=None):
    kind = kind or draw(st.sampled_from(["full", "pay", "map"]))
    if in_shapes is None:
        n_in = n_inputs or draw(st.integers(1, 3))
        if kind == "map":
            out_shape = out_shape or draw(shapes())
            in_shapes = (out_shape,) * n_in
        else:
            in_shapes = tuple(draw(shapes()) for _ in range(n_in))
    in_shapes = tuple(tuple(s) for s in in_shapes)
    if kind == "map":
        out_shape = in_shapes[0]
        assert all(s == out_shape for s in in_shapes)
    elif out_shape is None:
        out_shape = draw(shapes())
    if kind == "full":
        modes = {"full"} | ({"pay"} if draw(st.booleans()) else set())
    elif kind == "pay":
        modes = {"pay"}
    else:
        modes = {"map"}
        extra = draw(st.sampled_from(["comp", "comp", "comp+full", "comp+pay", "full", ""]))
        modes |= set(x for x in extra.split("+") if x)
    default = None
    if kind == "map":
        dkind = draw(st.sampled_from(["identity", "shift", "roll"]))
        offs = tuple(tuple(draw(st.integers(-2, 2)) for _ in out_shape) for _ in in_shapes)
        default = (dkind, offs)
    n_out = size_of(out_shape)
    lo = draw(st.integers(0, n_out - 1))
    width = draw(st.sampled_from([1, 2, 4, n_out]))
    focus = (lo, min(n_out - 1, lo + width - 1))
    allow_bbox = draw(st.booleans())
    if draw(st.integers(0, 15)) == 0:
        cs = ()                                  # an operator that writes no lineage
    else:
        cs = tuple(draw(st.lists(calls((out_shape, in_shapes), focus, allow_bbox), min_size=1,
                                 max_size=5)))
    has_bbox = any(p.pkind == "bbox" for c in cs for p in c.pairs)
    batched = (not has_bbox) and draw(st.booleans())
    return OpSpec(out_shape, in_shapes, cs, frozenset(modes), default,
                  check_modes=draw(st.booleans()), batched=batched,
                  declared=draw(st.booleans()),
                  pairs_at_once=batched and draw(st.booleans()))


def queries(shape, max_n=12):
    n = size_of(shape)
    return st.one_of(
        st.lists(st.integers(0, n - 1), min_size=0, max_size=min(n, max_n), unique=True),
        st.lists(st.integers(0, n - 1), min_size=1, max_size=min(n, 3), unique=True),
        st.just(list(range(n))))


# =========================================================================== harness

def input_arrays(in_shapes, names=INPUT_NAMES):
    return {names[k]: np.arange(size_of(s), dtype=np.float32).reshape(s)
            for k, s in enumerate(in_shapes)}


def copies_for(spec: OpSpec, one: list[str]) -> dict[str, list[str]]:
    """Operator copies in one run: name -> strategy spellings."""
    m = spec.modes
    out: dict[str, list[str]] = {}
    main = []
    if "full" in m:
        main += all_stored("full")
    if "comp" in m and spec.has_mapping:
        main += all_stored("comp")
        if "pay" in m:
            out["op_pay"] = all_stored("pay")
    elif "pay" in m:
        main += all_stored("pay")
    if "map" in m and spec.has_mapping:
        main.append("map")
    out["op"] = main or ["blackbox"]
    out["op_one"] = one
    out["op_bb"] = ["blackbox"]
    return out


@st.composite
def one_copy_strategies(draw, spec: OpSpec):
    """A random valid strategy set (1-2 strategies, various spellings)."""
    choices = []
    for mode in ("full", "pay", "comp"):
        if mode in spec.modes and (mode != "comp" or spec.has_mapping):
            choices += all_stored(mode) + [s for s in SHORT if s.startswith(mode)]
    if "map" in spec.modes and spec.has_mapping:
        choices.append("map")
    if not choices:
        return ["blackbox"]
    first = draw(st.sampled_from(choices))
    chosen = [first]
    if draw(st.booleans()):
        second = draw(st.sampled_from(choices))
        modes = {normalize(x).split(":")[0] for x in (first, second)}
        if not {"pay", "comp"} <= modes and normalize(second) != normalize(first):
            chosen.append(second)
    return chosen


def kind_of_method(method: str) -> str:
    """Relation a trace step's method (as reported in ``res.steps``) answers with."""
    if method.startswith("stored:"):
        return oo._KIND[method[len("stored:"):].split(":")[0]]
    if method == "map":
        return "map"
    if method.startswith("reexec:"):
        return "comp" if method == "reexec:comp" else "pairs"
    if method == "all-to-all":
        return "all"
    if method == "empty":
        return "pairs"            # empty input set: every relation gives the empty set
    raise AssertionError(f"unknown trace method {method!r}")


def forced_method(spec: OpSpec, strategies: list[str], prefer: str | None) -> str | None:
    """The method ``prefer`` must force on a step of this operator (None: planner's choice)."""
    if prefer == "reexec":
        if "comp" in spec.modes and spec.has_mapping:
            return "reexec:comp"
        if "full" in spec.modes:
            return "reexec:full"
        if "pay" in spec.modes:
            return "reexec:pay"
        return "map" if spec.has_mapping else "all-to-all"
    if prefer == "map" and spec.has_mapping:
        return "map"
    if prefer in strategies and prefer.count(":") == 2:
        return f"stored:{prefer}"
    return None


class Checker:
    """Runs traces against one run and compares them with the oracle.

    The oracle relation of each step is the one of the method the step
    reports; separately, the method must be the one ``prefer`` forces (or, with
    no preference, one the documented planner rule allows)."""

    def __init__(self, run, specs: dict[str, OpSpec], strategies: dict[str, list[str]]):
        self.run = run
        self.specs = specs
        self.strategies = {k: [normalize(s) for s in v] for k, v in strategies.items()}
        self._mats: dict = {}
        self.n = 0

    def mats(self, op: str, kind: str) -> list[np.ndarray]:
        m = self._mats.get((op, kind))
        if m is None:
            m = self._mats[(op, kind)] = relation(self.specs[op], kind)
        return m

    def trace(self, start, cells, *, to=None, path=None, prefer=None):
        t0 = time.perf_counter()
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                res = self.run.trace(start, cells, to=to, path=path, prefer=prefer, record=False)
        finally:
            CASES["seconds"] += time.perf_counter() - t0
        # nothing is damaged here, so a warning (stored lineage reported damaged,
        # fallback to another method) is a bug
        assert not err.getvalue().strip(), f"unexpected warning during trace: {err.getvalue()}"
        return res

    def step_mats(self, res, prefer) -> dict:
        """(op, input, backward) -> dependency matrix of the method the step used;
        checks the method against ``prefer`` / the planner rule."""
        out = {}
        for s in res.steps:
            backward = s.direction == "backward"
            spec, strategies = self.specs[s.op], self.strategies[s.op]
            if s.method != "empty":
                forced = forced_method(spec, strategies, prefer)
                if forced is not None and s.method != forced:
                    raise AssertionError(f"prefer={prefer!r} on {s.op!r} {strategies} should use "
                                         f"{forced}, the step used {s.method}")
                if forced is None:
                    want = oo.method_kind(spec, strategies, prefer, backward)
                    if want is None:
                        CASES["skipped_ambiguous"] += 1
                    elif kind_of_method(s.method) != want:
                        raise AssertionError(f"planner on {s.op!r} {strategies} ({s.direction}, "
                                             f"prefer={prefer!r}) used {s.method}, expected a "
                                             f"{want} method")
            out[(s.op, s.input, backward)] = self.mats(s.op, kind_of_method(s.method))[s.input]
        return out

    def accessor(self, res, prefer):
        m = self.step_mats(res, prefer)
        # steps not run (empty set, or early stop on a full target) do not matter
        return lambda op, i, backward: m.get((op, i, backward), self.mats(op, "pairs")[i])

    def compare(self, res, expected_bits, shape, what):
        exp = np.argwhere(np.asarray(expected_bits).reshape(shape))
        got = res.cells
        if got.shape != exp.shape or not np.array_equal(got, exp):
            gs = {tuple(c) for c in got.tolist()}
            es = {tuple(c) for c in exp.tolist()}
            raise AssertionError(
                f"{what}: result differs from the oracle\n"
                f"  missing (expected, not returned): {sorted(es - gs)[:20]}\n"
                f"  extra (returned, not expected):   {sorted(gs - es)[:20]}\n"
                f"  steps: {[(s.op, s.input, s.direction, s.method) for s in res.steps]}")
        self.n += 1
        CASES["cases"] += 1
        CASES["nonempty"] += bool(len(exp))


def qbits_of(q, shape):
    b = np.zeros(size_of(shape), bool)
    b[list(q)] = True
    return b


def check_single(chk: Checker, spec: OpSpec, copies: dict[str, list[str]], out_qs, in_qs,
                 flip: bool) -> int:
    use_path = flip
    for copy in copies:
        strategies = chk.strategies[copy]
        prefers = [None] + [s for s in strategies if s.count(":") == 2] + ["reexec"]
        if spec.has_mapping:
            prefers.append("map")
        for prefer in prefers:
            for i in range(spec.n_inputs):
                for backward in (True, False):
                    q_shape = spec.out_shape if backward else spec.in_shapes[i]
                    t_shape = spec.in_shapes[i] if backward else spec.out_shape
                    for q in (out_qs if backward else in_qs[i]):
                        cells = oo.cells_of(sorted(q), q_shape)
                        use_path = not use_path
                        kw = dict(path=[(copy, i)]) if use_path else \
                            dict(to=INPUT_NAMES[i] if backward else copy)
                        start = copy if backward else INPUT_NAMES[i]
                        res = chk.trace(start, cells, prefer=prefer, **kw)
                        if res is None:
                            continue
                        mat = chk.accessor(res, prefer)(copy, i, backward)
                        chk.compare(res, oo.step(mat, qbits_of(q, q_shape), backward), t_shape,
                                    f"{copy} {strategies} prefer={prefer} input {i} "
                                    f"{'backward' if backward else 'forward'} "
                                    f"query={cells.tolist()} kw={kw}")
    return chk.n


# Regression (was a bug): every traced run kept a read-only LMDB environment
# mapping 1 TiB of address space, so ~127 traced runs exhausted a process.


def release(run) -> None:
    """Let go of a run's lineage store once an example is done with it."""
    run.close()


def _run(store, specs, arrays_in, strategies, inputs_of, keep="auto"):
    """``keep``: a policy, or ``("planned", names)``: a disk budget's plan that chose to
    drop ``names`` (the run keeps what no policy drops whatever the plan says)."""
    wf = subzero.Workflow("oracle")
    nodes = {n: wf.input(n) for n in arrays_in}
    for name, spec in specs.items():
        nodes[name] = wf.add(name, make_op(spec), *[nodes[a] for a in inputs_of[name]])
    given = {k: "+".join(v) for k, v in strategies.items()}
    if isinstance(keep, tuple):
        plan = {"name": "drawn", "workflow": "oracle", "strategies": given,
                "max_disk": 10**12, "drops": list(keep[1])}
        return store.run(wf, inputs=arrays_in, plan=plan, progress=False)
    return store.run(wf, inputs=arrays_in, keep=keep, strategies=given, progress=False)


def run_workflow(store, specs: dict, arrays_in: dict, strategies: dict, inputs_of: dict,
                 keep: str = "auto"):
    """One run with every operator copy; returns (run, strategies used).  Any
    exception fails the example (pairs without output cells included: once a
    known bug of the *Many encodings, now a regression check).  ``keep``: the run's
    policy (intermediates not kept are made again, checked, when a re-execution
    reads them)."""
    return _run(store, specs, arrays_in, strategies, inputs_of, keep), strategies


# =========================================================================== property tests

def describe(spec: OpSpec) -> None:
    """Hypothesis statistics (pytest --hypothesis-show-statistics)."""
    event(f"out ndim {len(spec.out_shape)}, {spec.n_inputs} input(s)")
    if not spec.declared and spec.out_shape != spec.in_shapes[0]:
        event("output shape undeclared and unlike input 0's"
              + (" (another rank)" if len(spec.out_shape) != len(spec.in_shapes[0]) else ""))
    event(f"modes {'+'.join(sorted(spec.modes))}")
    n = spec.n_pairs()
    event("pairs: " + ("0" if n == 0 else "1-9" if n < 10 else "10-255" if n < 256 else ">=256"))
    for c in spec.calls:
        event(f"call form {c.form}")
    if any(len(set(p.out) & set(q.out)) for c in spec.calls for d in spec.calls
           for p in c.pairs for q in d.pairs if p is not q):
        event("overlapping pairs")


@st.composite
def single_cases(draw):
    spec = draw(op_specs())
    one = draw(one_copy_strategies(spec))
    out_qs = draw(st.lists(queries(spec.out_shape), min_size=1, max_size=2))
    in_qs = [draw(st.lists(queries(s), min_size=1, max_size=2)) for s in spec.in_shapes]
    return spec, one, out_qs, in_qs, draw(st.booleans())


@settings(max_examples=50, **SETTINGS)
@given(case=single_cases())
def test_single_operator_matches_oracle(ostore, case):
    """Every strategy, map and re-execution, both directions, against the oracle."""
    _single_operator_matches_oracle(ostore, case)


@settings(max_examples=150, **SETTINGS)
@given(case=single_cases())
def test_single_operator_matches_oracle_more(ostore, case):
    """150 cases more than the one above (marked slow: CI runs them; `make test` the 50
    above): a seed of their own, as hypothesis derives it from the test's name."""
    _single_operator_matches_oracle(ostore, case)


def _single_operator_matches_oracle(ostore, case):
    spec, one, out_qs, in_qs, flip = case
    describe(spec)
    copies = copies_for(spec, one)
    names = INPUT_NAMES[:spec.n_inputs]
    run, used = run_workflow(ostore, {c: spec for c in copies}, input_arrays(spec.in_shapes),
                             copies, {c: names for c in copies})
    CASES["examples"] += 1
    chk = Checker(run, {c: spec for c in copies}, used)
    try:
        assert check_single(chk, spec, used, out_qs, in_qs, flip) > 0
    finally:
        release(run)


@st.composite
def dag_cases(draw):
    """2-3 random operators, each reading the previous output (plus maybe
    another available array, possibly the same one twice)."""
    n_in = draw(st.integers(1, 2))
    arrays = {INPUT_NAMES[k]: draw(shapes(120)) for k in range(n_in)}
    specs, inputs_of, strategies = {}, {}, {}
    prev = "a"
    for k in range(draw(st.integers(2, 3))):
        kind = draw(st.sampled_from(["full", "pay", "map"]))
        names = [prev]
        cand = [a for a in arrays if kind != "map" or arrays[a] == arrays[prev]]
        if draw(st.booleans()):
            names.append(draw(st.sampled_from(cand)))
        in_shapes = tuple(arrays[a] for a in names)
        spec = draw(op_specs(kind, in_shapes=in_shapes,
                             out_shape=draw(shapes(120)) if kind != "map" else None))
        pool = [s for m in ("full", "pay", "comp") if m in spec.modes and
                (m != "comp" or spec.has_mapping) for s in all_stored(m)]
        if "map" in spec.modes:
            pool.append("map")
        sel = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
        if {s.split(":")[0] for s in sel} >= {"pay", "comp"}:
            sel = [s for s in sel if not s.startswith("pay")]
        if draw(st.integers(0, 4)) == 0:
            sel = ["blackbox"]
        name = f"op{k + 1}"
        specs[name], inputs_of[name], strategies[name] = spec, names, sel
        arrays[name] = spec.out_shape
        prev = name
    last = prev
    qs_back = draw(st.lists(queries(arrays[last]), min_size=1, max_size=2))
    qs_fwd = {a: draw(st.lists(queries(arrays[a]), min_size=1, max_size=2))
              for a in INPUT_NAMES[:n_in]}
    every = sorted({s for v in strategies.values() for s in v if s.count(":") == 2})
    prefers = [None, "reexec"] + ([draw(st.sampled_from(every))] if every else [])
    if any(s.has_mapping for s in specs.values()):
        prefers.append("map")
    keep = draw(st.sampled_from(["auto", "planned", "outputs", "all"]))
    if keep == "planned":          # a plan's choice of intermediates to drop (any subset)
        keep = ("planned", tuple(sorted(draw(st.sets(st.sampled_from(sorted(specs)))))))
    return arrays, specs, inputs_of, strategies, last, qs_back, qs_fwd, prefers, keep


def dag_oracle(specs, inputs_of, mat, arrays, start, qbits, backward):
    """Union over every DAG path (bitmaps propagated in topological order)."""
    order = list(specs)                          # built in topological order
    bms = {start: qbits}
    if backward:
        for op in reversed(order):
            if op not in bms:
                continue
            for i, src in enumerate(inputs_of[op]):
                r = oo.step(mat(op, i, True), bms[op], True)
                bms[src] = bms.get(src, np.zeros(size_of(arrays[src]), bool)) | r
    else:
        for op in order:
            for i, src in enumerate(inputs_of[op]):
                if src in bms:
                    r = oo.step(mat(op, i, False), bms[src], False)
                    bms[op] = bms.get(op, np.zeros(size_of(arrays[op]), bool)) | r
    return bms


@settings(max_examples=70, **SETTINGS)
@given(case=dag_cases())
def test_multi_step_traces_match_composed_oracle(ostore, case):
    """Paths through 2-3 operators and DAG traces (union over every path), whatever
    the run keeps of its intermediates (``keep``: re-executions read them made again)."""
    arrays, specs, inputs_of, strategies, last, qs_back, qs_fwd, prefers, keep = case
    inputs = {a: np.arange(size_of(arrays[a]), dtype=np.float32).reshape(arrays[a])
              for a in arrays if a in INPUT_NAMES}
    run, used = run_workflow(ostore, specs, inputs, strategies, inputs_of, keep)
    CASES["examples"] += 1
    event(f"{len(specs)} operators, {sum(len(v) for v in inputs_of.values())} edges, keep {keep}")
    try:
        chk = Checker(run, specs, used)
        chain = list(specs)
        upstream, todo = set(), [last]          # arrays with a path to the last operator
        while todo:
            for src in inputs_of.get(todo.pop(), []):
                if src not in upstream:
                    upstream.add(src)
                    todo.append(src)
        for prefer in prefers:
            # backward: along the main chain (path) and to every other array (DAG union)
            for q in qs_back:
                qbits = qbits_of(q, arrays[last])
                cells = oo.cells_of(sorted(q), arrays[last])
                path = [(op, 0) for op in reversed(chain)]
                res = chk.trace(last, cells, path=path, prefer=prefer)
                mat, exp = chk.accessor(res, prefer), qbits
                for op in reversed(chain):
                    exp = oo.step(mat(op, 0, True), exp, True)
                chk.compare(res, exp, arrays["a"], f"backward path {path} prefer={prefer} {used}")
                for tgt in [a for a in arrays if a in upstream]:
                    res = chk.trace(last, cells, to=tgt, prefer=prefer)
                    bms = dag_oracle(specs, inputs_of, chk.accessor(res, prefer), arrays, last,
                                     qbits, True)
                    chk.compare(res, bms.get(tgt, np.zeros(size_of(arrays[tgt]), bool)),
                                arrays[tgt], f"backward {last}->{tgt} prefer={prefer} {used}")
            # forward: along the main chain from "a", and from every input to the last op
            for src, qlist in qs_fwd.items():
                if src not in upstream:
                    with pytest.raises(subzero.QueryError, match="not connected"):
                        run.trace(src, [(0,) * len(arrays[src])], to=last, record=False)
                    continue
                for q in qlist:
                    qbits = qbits_of(q, arrays[src])
                    cells = oo.cells_of(sorted(q), arrays[src])
                    if src == "a":
                        path = [(op, 0) for op in chain]
                        res = chk.trace("a", cells, path=path, prefer=prefer)
                        mat, exp = chk.accessor(res, prefer), qbits
                        for op in chain:
                            exp = oo.step(mat(op, 0, False), exp, False)
                        chk.compare(res, exp, arrays[last],
                                    f"forward path {path} prefer={prefer} {used}")
                    res = chk.trace(src, cells, to=last, prefer=prefer)
                    bms = dag_oracle(specs, inputs_of, chk.accessor(res, prefer), arrays, src,
                                     qbits, False)
                    chk.compare(res, bms.get(last, np.zeros(size_of(arrays[last]), bool)),
                                arrays[last], f"forward {src}->{last} prefer={prefer} {used}")
        assert chk.n > 0
    finally:
        release(run)


# =========================================================================== targeted tests

class ListOp(Operator):
    """Writes a fixed list of region pairs (FULL) -- for targeted tests."""

    def __init__(self, pairs_, modes=(Mode.FULL,), out_shape=None):
        self.pairs_ = pairs_
        self.modes_ = set(modes)
        self.out_shape = out_shape

    def supported_modes(self):
        return self.modes_ | {Mode.BLACKBOX}

    def output_shape(self, *input_shapes):
        return self.out_shape or tuple(input_shapes[0])

    def run(self, ctx, *inputs):
        for out, *ins in self.pairs_:
            ctx.lwrite(np.asarray(out).reshape(-1, len(self.output_shape(*[np.shape(x) for x in inputs]))),
                       *[np.asarray(c, np.int64).reshape(-1, np.ndim(x)) for c, x in zip(ins, inputs)])
        return np.zeros(self.output_shape(*[np.shape(x) for x in inputs]))


FULL4 = all_stored("full")
PAY4 = all_stored("pay")
COMP4 = all_stored("comp")


def trace_all(run, op, cells, prefers, backward=True, to="a"):
    out = {}
    for p in prefers:
        r = run.trace(op, cells, to=to, prefer=p, record=False) if backward else \
            run.trace(to, cells, to=op, prefer=p, record=False)
        out[p] = r.cells.tolist()
    return out


def test_same_key_cell_in_two_pairs_merges(tmp_path):
    store = subzero.open_store(tmp_path / "s")
    pairs_ = [([(0, 0)], [(1, 1)]), ([(0, 0)], [(2, 2)]), ([(0, 0), (1, 0)], [(3, 3)])]
    wf = subzero.Workflow("t")
    a = wf.input("a")
    wf.add("op", ListOp(pairs_), a)
    run = store.run(wf, inputs={"a": np.zeros((4, 4))}, strategies={"op": "+".join(FULL4)},
                    progress=False)
    for p, got in trace_all(run, "op", [(0, 0)], FULL4 + ["reexec"]).items():
        assert got == [[1, 1], [2, 2], [3, 3]], p
    for p, got in trace_all(run, "op", [(1, 0)], FULL4 + ["reexec"]).items():
        assert got == [[3, 3]], p
    for p, got in trace_all(run, "op", [(2, 2), (3, 3)], FULL4 + ["reexec"], backward=False).items():
        assert got == [[0, 0], [1, 0]], p
    store.close()


def traced(run, start, cells, to, prefer=None):
    """Cells reached, as a list; fails on any warning (nothing here is damaged)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        res = run.trace(start, cells, to=to, prefer=prefer, record=False)
    assert err.getvalue() == "", err.getvalue()
    return res.cells.tolist()


def one_op_run(tmp_path, op, strategy, shape=(3, 5)):
    store = subzero.open_store(tmp_path / "s")
    wf = subzero.Workflow("t")
    wf.add("op", op, wf.input("a"))
    run = store.run(wf, inputs={"a": np.ones(shape)}, strategies={"op": strategy}, progress=False)
    return store, run


def test_same_key_cell_in_two_payload_pairs_merges(tmp_path):
    calls_ = (Call("single", (Pair((0,), ins=((5,),)),)),
              Call("each", (Pair((0,), ins=((10,),)), Pair((0,), pkind="radius", r=0)), 3),
              Call("groups", (Pair((0, 1), ins=((15,),)),), 1, (4,), ((),)))
    spec = OpSpec((4, 5), ((4, 5),), calls_, frozenset({"pay", "full"}))
    store, run = one_op_run(tmp_path, make_op(spec), "+".join(PAY4 + FULL4), shape=(4, 5))
    for p in PAY4 + FULL4 + ["reexec"]:
        assert traced(run, "op", [(0, 0)], "a", p) == [[0, 0], [1, 0], [2, 0], [3, 0]], p
        assert traced(run, "op", [(0, 1)], "a", p) == [[3, 0]], p
        assert traced(run, "a", [(3, 0)], "op", p) == [[0, 0], [0, 1]], p
        assert traced(run, "a", [(0, 0), (1, 0)], "op", p) == [[0, 0]], p
    store.close()


class NothingOp(Operator):
    """Declares lineage modes but writes no lineage at all."""

    def __init__(self, modes):
        self.modes_ = set(modes)

    def supported_modes(self):
        return self.modes_ | {Mode.BLACKBOX}

    def run(self, ctx, a):
        return a * 2

    def map_p(self, cells, payload, i, ctx):  # pragma: no cover - never called
        raise AssertionError("no payload was written")


class NothingMapOp(NothingOp):
    def map_b(self, cells, i, ctx):
        return cells

    def map_f(self, cells, i, ctx):
        return cells


@pytest.mark.parametrize("modes,strategies,expect", [
    ({Mode.FULL}, FULL4, []),
    ({Mode.PAY}, PAY4, []),
    ({Mode.COMP, Mode.MAP}, COMP4, [[0, 0], [2, 4]]),      # composite: the default everywhere
])
def test_empty_lineage(tmp_path, modes, strategies, expect):
    op = (NothingMapOp if Mode.MAP in modes else NothingOp)(modes)
    store, run = one_op_run(tmp_path, op, "+".join(strategies))
    q = [(0, 0), (2, 4)]
    for p in strategies + ["reexec"]:
        assert traced(run, "op", q, "a", p) == expect, p
        assert traced(run, "a", q, "op", p) == expect, p
    store.close()


@pytest.mark.parametrize("direction", DIRS)
@pytest.mark.parametrize("strategy", FULL4 + PAY4)
def test_query_on_cells_without_lineage(tmp_path, strategy, direction):
    """Query cells that no pair touches: empty result, no crash.  Regression: a
    FullOne query in its non-indexed direction used to raise IndexError in
    StrategyReader.scan_keys when no pair matched (fixed in 1ef584f)."""
    spec = OpSpec((3, 3), ((3, 3),), (Call("single", (Pair((4,), ins=((0, 1),)),)),),
                  frozenset({"full", "pay"}))
    store, run = one_op_run(tmp_path, make_op(spec), strategy, shape=(3, 3))
    if direction == "backward":
        assert traced(run, "op", [(2, 2), (0, 0)], "a") == []
        assert traced(run, "op", [(2, 2), (1, 1)], "a") == [[0, 0], [0, 1]]
    else:
        assert traced(run, "a", [(2, 2), (1, 1)], "op") == []
        assert traced(run, "a", [(0, 1)], "op") == [[1, 1]]
    store.close()


@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_one_dimensional_arrays(tmp_path, n):
    """1-D arrays (the R-tree needs >= 2 dims internally), every strategy, both ways."""
    rng = np.random.default_rng(n)
    ps = []
    for j in range(min(3 * n, 60)):
        out = tuple(int(x) for x in rng.integers(0, n, int(rng.integers(1, 4))))
        if j % 4 == 0:
            ps.append(Pair(out, pkind="radius" if j % 8 else "bbox", r=int(rng.integers(0, 3))))
        else:
            ps.append(Pair(out, ins=(tuple(int(x) for x in rng.integers(0, n, int(rng.integers(0, 4)))),)))
    one = tuple(Pair(p.out[:1], p.ins, p.pkind, p.r) for p in ps[::2])
    calls_ = (Call("each", one, 0), Call("groups", tuple(ps[1::2]), 1,
                                         tuple(range(len(ps[1::2]))), ((),)))
    specs = {"full": OpSpec((n,), ((n,),), calls_, frozenset({"full", "pay"})),
             "comp": OpSpec((n,), ((n,),), calls_, frozenset({"comp", "map"}),
                            default=("shift", ((1,),)))}
    strategies = {"full": FULL4 + PAY4, "comp": COMP4 + ["map"]}
    store = subzero.open_store(tmp_path / "s")
    run, used = run_workflow(store, specs, {"a": np.zeros(n, np.float32)}, strategies,
                             {"full": ["a"], "comp": ["a"]})
    chk = Checker(run, specs, used)
    for q in ([0], [n - 1], list(range(0, n, 3)), list(range(n))):
        qb = qbits_of(q, (n,))
        cells = [(x,) for x in q]
        for op in specs:
            for p in [None] + used[op] + ["reexec", "map"]:
                for backward in (True, False):
                    res = chk.trace(op, cells, to="a", prefer=p) if backward else \
                        chk.trace("a", cells, to=op, prefer=p)
                    chk.compare(res, oo.step(chk.accessor(res, p)(op, 0, backward), qb,
                                             backward), (n,), f"1-D {op} {p} {backward} {q}")
    assert chk.n > 0
    store.close()


class BadPayloadOp(Operator):
    """Its map_p returns cells outside the input array."""

    def supported_modes(self):
        return {Mode.PAY, Mode.BLACKBOX}

    def run(self, ctx, a):
        ctx.lwrite([(0, 0), (1, 1)], payload=b"X", each=True)
        return a

    def map_p(self, cells, payload, i, ctx):
        return np.asarray(cells) + np.asarray(ctx.input_shape(i))


# Regression (was a bug): an out-of-bounds map_p on a forward re-execution
# surfaced as an IndexError instead of a LineageError naming map_p.


def _oob_params(direction):
    out = []
    for s in PAY4 + ["blackbox"]:
        out.append(pytest.param(s))
    return out


class BadPairsOp(BadPayloadOp):
    """A payload of its own per pair, a batched map_p that is right and a map_p_pairs of
    its own that returns cells outside the input: an operator whose vectorized version
    is wrong."""
    map_p_batched = True

    def run(self, ctx, a):
        cells = np.argwhere(np.ones(np.shape(a), bool))
        ctx.lwrite(cells, payload=[b"X%d" % k for k in range(len(cells))], each=True)
        return a

    def map_p(self, cells, payload, i, ctx):
        return cells

    def map_p_pairs(self, cells, offsets, payloads, pay_ids, i, ctx):
        return np.asarray(cells) + np.asarray(ctx.input_shape(i)), \
            np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


@pytest.mark.parametrize("strategy", _oob_params("backward"))
def test_map_p_pairs_out_of_bounds_is_an_error_backward(tmp_path, strategy, monkeypatch,
                                                          per_payload_choices):
    """The same through a vectorized map_p_pairs (a step over pairs of payloads of their
    own calls it, not map_p; from 2 distinct payloads here, so that a read's first small
    batch of pairs takes it too): a LineageError naming map_p, never a silent answer."""
    from subzero.query import relation
    monkeypatch.setattr(relation, "PAYLOAD_CALLS_VECTORIZED", 2)
    calls = per_payload_choices
    store = subzero.open_store(tmp_path / "s")
    wf = subzero.Workflow("t")
    wf.add("op", BadPairsOp(), wf.input("a"))
    with pytest.raises(LineageError, match="map_p.*outside"):
        run = store.run(wf, inputs={"a": np.zeros((5, 5))}, strategies={"op": strategy},
                        progress=False)
        run.trace("op", np.argwhere(np.ones((5, 5), bool)), to="a", record=False)
    store.close()
    if strategy.endswith(":backward"):      # its backward step ran, through map_p_pairs (a
        assert False in calls               # forward index is refused when it is stored)


@pytest.mark.parametrize("strategy", _oob_params("backward"))
def test_map_p_out_of_bounds_is_an_error_backward(tmp_path, strategy):
    """map_p returning cells outside the input must be a LineageError naming map_p,
    at run time or at trace time -- never a crash or a silent answer."""
    store = subzero.open_store(tmp_path / "s")
    wf = subzero.Workflow("t")
    wf.add("op", BadPayloadOp(), wf.input("a"))
    with pytest.raises(LineageError, match="map_p.*outside"):
        run = store.run(wf, inputs={"a": np.zeros((3, 3))}, strategies={"op": strategy},
                        progress=False)
        run.trace("op", [(0, 0)], to="a", record=False)
    store.close()


@pytest.mark.parametrize("strategy", _oob_params("forward"))
def test_map_p_out_of_bounds_is_an_error_forward(tmp_path, strategy):
    store = subzero.open_store(tmp_path / "s")
    wf = subzero.Workflow("t")
    wf.add("op", BadPayloadOp(), wf.input("a"))
    with pytest.raises(LineageError, match="map_p.*outside"):
        run = store.run(wf, inputs={"a": np.zeros((3, 3))}, strategies={"op": strategy},
                        progress=False)
        run.trace("a", [(0, 0)], to="op", record=False)
    store.close()


# Regression (was a bug): a *Many encoding crashed the run on a pair with no
# output cells.


@pytest.mark.parametrize("strategy", ["full:fullmany:backward", "pay:paymany:backward"])
def test_many_encoding_with_a_pair_without_output_cells(tmp_path, strategy):
    calls_ = (Call("single", (Pair((4,), ins=((0,),)),)),
              Call("single", (Pair((), ins=((8,),)),)))      # a pair with no output cells
    spec = OpSpec((3, 3), ((3, 3),), calls_, frozenset({"full", "pay"}))
    store, run = one_op_run(tmp_path, make_op(spec), strategy, shape=(3, 3))
    assert traced(run, "op", [(1, 1)], "a") == [[0, 0]]
    assert traced(run, "a", [(2, 2)], "op") == []
    store.close()


class CosmicLike(WindowComposite):
    """Like the DESIGN example: FULL pairs only for hits, COMP payloads only for
    hits (identity elsewhere).  With no hits, FULL lineage is empty."""

    lineage_modes = frozenset({Mode.FULL, Mode.COMP, Mode.MAP, Mode.BLACKBOX})

    def run(self, ctx, image):
        hits = np.argwhere(image > 100)
        if Mode.COMP in ctx.modes:
            ctx.lwrite(hits, payload=b"\x01", each=True)
        if Mode.FULL in ctx.modes:
            ctx.lwrite(hits, [subzero.window(c, 1, image.shape) for c in hits], each=True)
        return image


@pytest.mark.parametrize("strategy", ["full:fullmany:backward", "full:fullmany:forward"])
def test_empty_many_space_is_not_damaged(tmp_path, strategy):
    """Regression (fixed in 1ef584f): a *Many strategy with no pairs wrote no R-tree, the
    reader called it damaged, warned, and fell back to re-execution -- which re-ran this
    operator in COMP mode and answered with the mapping functions ([[1, 1]]) instead of
    the empty FULL lineage."""
    store, run = one_op_run(tmp_path, CosmicLike(), strategy, shape=(4, 4))   # no hits
    assert traced(run, "op", [(1, 1)], "a") == []
    assert traced(run, "a", [(1, 1)], "op") == []
    store.close()


_MANY_RUNS = r"""
import sys, tempfile
import numpy as np
import subzero
from subzero import Mode, Operator

class One(Operator):
    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}
    def run(self, ctx, a):
        ctx.lwrite([(1, 1)], [(0, 0)])
        return a

store = subzero.open_store(tempfile.mkdtemp())
for k in range(int(sys.argv[1])):
    wf = subzero.Workflow("t")
    wf.add("op", One(), wf.input("a"))
    run = store.run(wf, inputs={"a": np.zeros((3, 3))}, strategies={"op": "full"}, progress=False)
    assert run.trace("op", [(1, 1)], to="a", record=False).cells.tolist() == [[0, 0]]
    del run
print("ok")
"""


def test_many_traced_runs_in_one_process(tmp_path):
    """A long-lived process (notebook, service, this test suite) runs and traces many
    runs; the runs it no longer references must not exhaust the process.  Runs in a
    subprocess so a failure cannot poison the test process."""
    script = tmp_path / "many_runs.py"
    script.write_text(_MANY_RUNS)
    p = subprocess.run([sys.executable, str(script), "200"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


class FullOnly(Operator):
    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, a):
        return a


@pytest.mark.parametrize("spec", ["pay", "comp", "map", "comp:payone:forward",
                                  "full:fullone:backward+pay:paymany:forward"])
def test_unsupported_strategy_is_rejected(tmp_path, spec):
    store = subzero.open_store(tmp_path / "s")
    wf = subzero.Workflow("t")
    a = wf.input("a")
    wf.add("op", FullOnly(), a)
    with pytest.raises(StrategyError, match="does not support"):
        store.run(wf, inputs={"a": np.zeros((2, 2))}, strategies={"op": spec}, progress=False)
    store.close()


@pytest.mark.parametrize("spec", ["full:fulltwo:backward", "full:fullone:sideways", "pay+comp",
                                  "blackbox+full", "full:fullone:backward:x", ""])
def test_malformed_strategy_is_rejected(tmp_path, spec):
    store = subzero.open_store(tmp_path / "s")
    wf = subzero.Workflow("t")
    a = wf.input("a")
    wf.add("op", oo.SpecOp(OpSpec((2, 2), ((2, 2),), (), frozenset({"full", "pay"}))), a)
    with pytest.raises(StrategyError):
        store.run(wf, inputs={"a": np.zeros((2, 2))}, strategies={"op": spec}, progress=False)
    store.close()


@pytest.mark.parametrize("kind,at_once", [("full", False), ("pay", False), ("map", False),
                                          ("full", True), ("pay", True)])
def test_large_arrays_cross_block_boundaries(tmp_path, kind, at_once, monkeypatch,
                                             per_payload_choices):
    """> 4096 cells (several key blocks) and > 2 * REC_PAIRS pairs (several record
    blocks, decoded together when a read first meets them, here three at a time so
    that batches end between blocks).  ``at_once``: the operator has a ``map_p_pairs``
    of its own, which backward payload steps over these pairs (most with a payload of
    their own) call once instead of ``map_p`` per payload."""
    from subzero.storage import encodings
    monkeypatch.setattr(encodings, "DECODE_BLOCKS", 3)
    chosen = per_payload_choices
    rng = np.random.default_rng({"full": 1, "pay": 2, "map": 3}[kind])
    shape = (70, 70)
    n = size_of(shape)
    ps = []
    for j in range(2400):
        out = tuple(int(x) for x in rng.integers(0, n, int(rng.integers(1, 3))))
        if j % 3 == 0:
            ps.append(Pair(out, pkind="radius", r=int(rng.integers(0, 2))))
        else:
            ps.append(Pair(out, ins=(tuple(int(x) for x in rng.integers(0, n, 3)),)))
    ones = tuple(p for p in ps if len(p.out) == 1)
    multi = tuple(p for p in ps if len(p.out) > 1)
    calls_ = (Call("each", ones, 3),
              Call("groups", multi, 1, tuple(range(len(multi))), ((),), seed=5))
    modes = {"full": {"full", "pay"}, "pay": {"pay"}, "map": {"map", "comp"}}[kind]
    default = ("shift", ((1, -1),)) if kind == "map" else None
    spec = OpSpec(shape, (shape,), calls_, frozenset(modes), default, batched=True,
                  pairs_at_once=at_once)
    strategies = {"full": FULL4 + PAY4, "pay": PAY4, "map": COMP4 + ["map"]}[kind]
    store = subzero.open_store(tmp_path / "s")
    run, used = run_workflow(store, {"op": spec}, {"a": np.zeros(shape, np.float32)},
                             {"op": strategies}, {"op": ["a"]})
    chk = Checker(run, {"op": spec}, used)
    qrng = np.random.default_rng(7)
    qs = [qrng.choice(n, 25, replace=False), np.arange(0, n, 97), np.arange(4000, 4200)]
    for prefer in [None] + [s for s in used["op"] if s.count(":") == 2] + ["reexec", "map"]:
        for q in qs:
            qb = qbits_of(q, shape)
            cells = oo.cells_of(sorted(q.tolist()), shape)
            for backward in (True, False):
                res = chk.trace("op", cells, to="a", prefer=prefer) if backward else \
                    chk.trace("a", cells, to="op", prefer=prefer)
                chk.compare(res, oo.step(chk.accessor(res, prefer)("op", 0, backward), qb,
                                         backward), shape, f"large {backward} {prefer}")
    store.close()
    if kind != "map":        # both ways of calling the operator were taken, as its kind says
        assert (False in chosen) == at_once and True in chosen
