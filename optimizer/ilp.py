"""The integer program of the SubZero paper, solved with GLPK (swiglpk).

Minimise   sum_k w_k sum_j c_kj y_kj  +  eps_d * disk  +  eps_r * runtime
over       x_c  in {0,1}   store candidate strategy c
           b_o  in {0,1}   operator o stores nothing (black-box; always possible)
           m_oM in {0,1}   operator o runs lineage mode M (its lineage work is paid once)
           y_kj in [0,1]   query step k is answered by option j
           + P sum_q w_q s_q                    (soft bounds: a query no slower than the defaults)
subject to sum_j y_kj = 1                     every step is answered
           y_kj <= x_c                        ... by a stored strategy only if it is stored
           sum_c x_c + b_o >= 1,  x_c + b_o <= 1   at least one strategy per operator
           x_c <= m_o,mode(c)                 storing c runs its mode
           x_a + x_b <= 1                     strategies that cannot be stored together
           sum_c bytes_c x_c <= MaxDISK
           sum gen_oM m_oM + sum write_c x_c + F z <= MaxRUNTIME
           x_c <= z                           (z: the run stores anything; F its fixed cost)
           pinned x fixed
           sum_{k in q} sum_j c_kj y_kj - s_q <= bound_q - fixed_q,  s_q >= 0   per bounded query q.

and, per intermediate array ``a`` a run may drop (``Problem.arrays``):

           k_a  in {0,1}   the run keeps array a (its chunks count on the disk row: bytes_a k_a)
           n_ra in [0,1]   read r has to make array a again (a is dropped and r needs it)
           + sum_r w_r sum_a f_ra remake_a n_ra + eps_d * sum_a bytes_a k_a
           n_ra >= act_r - k_a      for the arrays r reads itself (act_r: y_kj of the option
                                    that reads them -- a re-execution reads its operator's
                                    inputs -- or 1 for a read every plan makes)
           n_rb >= n_ra - k_b       for b an input of a: making a again reads b, made again
                                    in turn when it is not kept either.

So an array is priced like lineage: the bytes it keeps against the seconds of the
remakes the workload would pay without it (``f_ra``: the share of its operator's
run a read makes again: its tiles' share where the operators run per tile, else 1).

``y`` selects the cheapest stored strategy per step: the paper's min over an
operator's strategies, linearised.  ``c`` is the price the plan is chosen by (the
optimizer passes pessimistic prices: prediction times its measured error), each
option also keeps its expected cost for reports.  A query bound (the query's price
under the workflow's default strategies, times ``subzero.tuning.DEFAULTS_TOLERANCE``)
is soft: exceeding it costs ``P`` (``subzero.tuning.BOUND_PENALTY``) times the excess,
so a budget too small for the defaults still has a plan.  Options with no candidate
(mapping functions, re-execution) are always available.  With ``x`` integral the best
``y`` is integral, so only ``x``, ``b`` and ``m`` are integer variables.
``brute_force`` enumerates every combination instead; tests check both agree.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import swiglpk as glp

from subzero.errors import BudgetError
from subzero.tuning import BOUND_PENALTY


@dataclass
class Candidate:
    op: str
    strategy: str
    mode: str
    bytes: float
    write_s: float


@dataclass
class Option:
    cand: int | None       # candidate that must be stored, or None (mapping, re-execution)
    cost: float            # seconds the plan is chosen by (pessimistic)
    label: str = ""
    expected: float | None = None    # predicted seconds (None: ``cost``)

    @property
    def predicted(self) -> float:
        return self.cost if self.expected is None else self.expected


@dataclass
class Step:
    op: str
    weight: float
    options: list[Option]


@dataclass
class ArrayItem:
    """An intermediate array a run may keep or drop (``subzero.runs.keep``)."""

    name: str
    bytes: float           # what keeping it adds to the run's disk (its chunks)
    remake_s: float        # seconds to make it again whole (its operator's run)
    inputs: list[int] = field(default_factory=list)   # droppable arrays it is made from


@dataclass
class Read:
    """Arrays a trace step or query reads (``arrays``, indices into ``Problem.arrays``),
    made again when not kept.  ``step``/``option``: read only when that option answers
    step ``step`` (a re-execution reads its operator's inputs), weighted as the step
    is; ``step`` None: read whatever the plan, with ``weight`` (a query's values, an
    array read outside traces), counted in query ``query``'s bound.  ``factor``: per
    array the read may have to make again (the arrays' closure through their dropped
    inputs), the share of its remake the read pays."""

    arrays: list[int]
    factor: dict[int, float]
    step: int | None = None
    option: int | None = None
    weight: float = 0.0
    query: str | None = None


@dataclass
class QueryBound:
    """A query's steps (indices into ``Problem.steps``, repeats allowed), the cost of
    its steps that have no choice, and the most its priced cost should be."""

    name: str
    weight: float
    steps: list[int]
    fixed: float
    bound: float


@dataclass
class Problem:
    ops: list[str]
    candidates: list[Candidate]
    gen_s: dict[tuple[str, str], float]          # (op, mode) -> lineage work, paid once
    steps: list[Step]
    max_disk: float | None = None
    max_runtime_s: float | None = None
    pinned: dict[str, list[int]] = field(default_factory=dict)   # op -> its stored candidates
    exclusive: list[tuple[int, int]] = field(default_factory=list)
    eps_disk: float = 0.0                        # tie-breaking penalty per byte
    eps_runtime: float = 0.0                     # ... per second of runtime overhead
    fixed_runtime_s: float = 0.0                 # paid once by a run that stores anything
    bounds: list[QueryBound] = field(default_factory=list)
    #: candidates every plan stores (an operator's defaults the model cannot vouch against)
    required: list[int] = field(default_factory=list)
    #: intermediate arrays the plan keeps or drops, and what reads them
    arrays: list[ArrayItem] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)

    def cands_of(self, op: str) -> list[int]:
        return [k for k, c in enumerate(self.candidates) if c.op == op]


@dataclass
class Solution:
    chosen: list[int]
    objective: float
    query_cost: float
    disk: float
    runtime_s: float
    solve_s: float
    status: str = "optimal"
    kept: list[int] = field(default_factory=list)     # arrays kept (indices into Problem.arrays)


def remake_cost(p: Problem, r: Read, kept) -> float:
    """Seconds read ``r`` pays to make again what it reads and ``kept`` does not keep
    (each array once: made again, it is read from there)."""
    need, seen, total = [a for a in r.arrays if a not in kept], set(), 0.0
    while need:
        a = need.pop()
        if a in seen:
            continue
        seen.add(a)
        total += r.factor.get(a, 1.0) * p.arrays[a].remake_s
        need.extend(b for b in p.arrays[a].inputs if b not in kept)
    return total


def evaluate(p: Problem, chosen, kept=None) -> tuple[float, float, float, float]:
    """(objective, query cost, disk, runtime) of storing exactly ``chosen`` and keeping
    the arrays ``kept`` (None: every array)."""
    chosen = set(chosen)
    kept = set(range(len(p.arrays))) if kept is None else set(kept)
    extra: dict[tuple[int, int], float] = {}      # (step, option) -> its reads' remakes
    of_query: dict[str | None, float] = {}        # query -> its own reads' remakes
    q = 0.0
    for r in p.reads:
        c = remake_cost(p, r, kept)
        if r.step is None:
            q += r.weight * c
            of_query[r.query] = of_query.get(r.query, 0.0) + c
        else:
            assert r.option is not None
            extra[(r.step, r.option)] = extra.get((r.step, r.option), 0.0) + c
    best = [min(o.cost + extra.get((k, j), 0.0) for j, o in enumerate(st.options)
                if o.cand is None or o.cand in chosen) for k, st in enumerate(p.steps)]
    q += sum(st.weight * c for st, c in zip(p.steps, best))
    q += sum(BOUND_PENALTY * qb.weight * max(0.0, qb.fixed + of_query.get(qb.name, 0.0)
                                             + sum(best[k] for k in qb.steps) - qb.bound)
             for qb in p.bounds)
    disk = sum(p.candidates[k].bytes for k in chosen) + sum(p.arrays[a].bytes for a in kept)
    modes = {(p.candidates[k].op, p.candidates[k].mode) for k in chosen}
    rt = sum(p.gen_s.get(m, 0.0) for m in modes) + sum(p.candidates[k].write_s for k in chosen)
    rt += p.fixed_runtime_s if chosen else 0.0
    return q + p.eps_disk * disk + p.eps_runtime * rt, q, disk, rt


def _feasible(p: Problem, disk: float, rt: float) -> bool:
    tol = 1e-9
    return ((p.max_disk is None or disk <= p.max_disk * (1 + tol) + tol)
            and (p.max_runtime_s is None or rt <= p.max_runtime_s * (1 + tol) + tol))


def brute_force(p: Problem) -> Solution:
    """Every combination of candidates (tests, and a check on tiny instances)."""
    t0 = time.perf_counter()
    excl = {frozenset(e) for e in p.exclusive}
    per_op = []
    for op in p.ops:
        if op in p.pinned:
            per_op.append([tuple(p.pinned[op])])
            continue
        ks = p.cands_of(op)
        must = set(p.required) & set(ks)
        subsets = [s for r in range(len(ks) + 1) for s in itertools.combinations(ks, r)
                   if not any(frozenset(pair) in excl for pair in itertools.combinations(s, 2))
                   and must <= set(s)]
        per_op.append(subsets)
    best = None
    keeps = [s for r in range(len(p.arrays) + 1)
             for s in itertools.combinations(range(len(p.arrays)), r)]
    for combo in itertools.product(*per_op):
        chosen = [k for s in combo for k in s]
        for kept in keeps:
            obj, q, disk, rt = evaluate(p, chosen, kept)
            if _feasible(p, disk, rt) and (best is None or obj < best[0] - 1e-12):
                best = (obj, q, disk, rt, sorted(chosen), list(kept))
    if best is None:
        return Solution([], math.inf, math.inf, 0, 0, time.perf_counter() - t0, "infeasible")
    return Solution(best[4], best[0], best[1], best[2], best[3], time.perf_counter() - t0,
                    kept=best[5])


def closure(p: Problem, arrays) -> list[int]:
    """``arrays`` and every array they are made from, through their inputs."""
    out: list[int] = []
    need = list(arrays)
    while need:
        a = need.pop()
        if a not in out:
            out.append(a)
            need.extend(p.arrays[a].inputs)
    return sorted(out)


class _Builder:
    def __init__(self):
        self.cols: list[tuple[str, float, float, float, bool]] = []   # name, obj, lo, hi, integer
        self.rows: list[tuple[dict[int, float], float, float]] = []    # coefs, lo, hi

    def col(self, name, obj, lo=0.0, hi=1.0, integer=True) -> int:
        self.cols.append((name, obj, lo, hi, integer))
        return len(self.cols)

    def row(self, coefs: dict[int, float], lo=-math.inf, hi=math.inf) -> None:
        self.rows.append((coefs, lo, hi))


def _bounds(lo, hi):
    if lo == hi:
        return glp.GLP_FX
    if math.isinf(lo) and math.isinf(hi):
        return glp.GLP_FR
    if math.isinf(hi):
        return glp.GLP_LO
    if math.isinf(lo):
        return glp.GLP_UP
    return glp.GLP_DB


def solve(p: Problem) -> Solution:
    """Solve the integer program with GLPK's branch and cut.

    The answer is checked against the budgets exactly (``evaluate``).  GLPK's MIP
    presolver accepts a row broken by up to about 1e-3 in absolute terms: where pinned or
    required candidates are fixed it folds them into the runtime row, whose seconds are
    of that size (a budget of a few milliseconds), and could call a plan "optimal" that
    breaks the runtime budget by most of a millisecond.  Such an answer is solved again
    without the presolver, the runtime row in units of the budget (GLPK's tolerances then
    relative to it) and its bound moved in by more than the simplex's tolerance."""
    t0 = time.perf_counter()
    b, x, kk = _program(p)
    status, values = _glpk(b)
    chosen: list[int] = []
    kept: list[int] = []

    def read(values) -> tuple[list[int], list[int]]:
        return ([k for k in range(len(p.candidates)) if values[x[k] - 1] > 0.5],
                [a for a in range(len(p.arrays)) if values[kk[a] - 1] > 0.5])
    if status == "optimal":
        chosen, kept = read(values)
        if not _feasible(p, *evaluate(p, chosen, kept)[2:]):
            b, x, kk = _program(p, strict=True)
            status, values = _glpk(b, presolve=False)
            if status == "optimal":
                chosen, kept = read(values)
    solve_s = time.perf_counter() - t0
    if status != "optimal":
        return Solution([], math.inf, math.inf, 0, 0, solve_s, status)
    obj, q, disk, rt = evaluate(p, chosen, kept)     # exact, free of GLPK's tolerances
    return Solution(chosen, obj, q, disk, rt, solve_s, kept=kept)


#: how far the runtime row's bound moves in (a share of the budget) when the program is
#: solved without the presolver: beyond the simplex's primal tolerance (1e-7, relative
#: to a bound of 1), so an answer it accepts keeps to the budget exactly
STRICT_RUNTIME_MARGIN = 1e-6


def _program(p: Problem, strict: bool = False) -> tuple[_Builder, list[int], list[int]]:
    """The program's columns and rows, the column of each candidate's ``x`` and of
    each array's ``k``.
    ``strict``: the runtime row in units of the budget, its bound moved in by
    ``STRICT_RUNTIME_MARGIN`` (for a solve without the presolver)."""
    b = _Builder()
    x = [b.col(f"x{k}", p.eps_disk * c.bytes + p.eps_runtime * c.write_s)
         for k, c in enumerate(p.candidates)]
    modes = sorted({(c.op, c.mode) for c in p.candidates})
    m = {om: b.col(f"m{j}", p.eps_runtime * p.gen_s.get(om, 0.0)) for j, om in enumerate(modes)}
    z = b.col("z", p.eps_runtime * p.fixed_runtime_s)
    bb = {}
    for i, op in enumerate(p.ops):
        pins = p.pinned.get(op)
        bounds = (0.0, 1.0) if pins is None else ((0.0, 0.0) if pins else (1.0, 1.0))
        bb[op] = b.col(f"b{i}", 0.0, *bounds)
    for k, c in enumerate(p.candidates):
        pins = p.pinned.get(c.op)
        if pins is not None:                       # pinned operator: exactly its pins
            fixed = 1.0 if k in pins else 0.0
            b.cols[x[k] - 1] = (*b.cols[x[k] - 1][:2], fixed, fixed, True)
        elif k in p.required:
            b.cols[x[k] - 1] = (*b.cols[x[k] - 1][:2], 1.0, 1.0, True)
        b.row({x[k]: 1.0, m[(c.op, c.mode)]: -1.0}, hi=0.0)
        b.row({x[k]: 1.0, z: -1.0}, hi=0.0)
        b.row({x[k]: 1.0, bb[c.op]: 1.0}, hi=1.0)
    for op in p.ops:
        b.row({**{x[k]: 1.0 for k in p.cands_of(op)}, bb[op]: 1.0}, lo=1.0)
    for ka, kb in p.exclusive:
        b.row({x[ka]: 1.0, x[kb]: 1.0}, hi=1.0)
    kk = [b.col(f"k{a}", p.eps_disk * item.bytes) for a, item in enumerate(p.arrays)]
    if p.max_disk is not None:
        b.row({**{x[k]: c.bytes for k, c in enumerate(p.candidates)},
               **{kk[a]: item.bytes for a, item in enumerate(p.arrays)}}, hi=float(p.max_disk))
    if p.max_runtime_s is not None:
        unit, hi = 1.0, float(p.max_runtime_s)
        if strict and hi > 0:
            unit, hi = hi, 1.0 - STRICT_RUNTIME_MARGIN
        b.row({**{x[k]: c.write_s / unit for k, c in enumerate(p.candidates)},
               **{m[om]: p.gen_s.get(om, 0.0) / unit for om in modes}, z: p.fixed_runtime_s / unit},
              hi=hi)
    ys = []
    for s, st in enumerate(p.steps):
        cols = [b.col(f"y{s}_{j}", st.weight * opt.cost, integer=False)
                for j, opt in enumerate(st.options)]
        ys.append(cols)
        b.row({col: 1.0 for col in cols}, lo=1.0, hi=1.0)
        for col, opt in zip(cols, st.options):
            if opt.cand is not None:
                b.row({col: 1.0, x[opt.cand]: -1.0}, hi=0.0)
    # reads: n_ra >= act_r - k_a for what r reads, n_rb >= n_ra - k_b up the inputs
    in_bound: dict[str | None, dict[int, float]] = {}     # query -> its own reads' n coefs
    by_step: dict[int, dict[int, float]] = {}             # step -> its options' reads' n coefs
    for i, r in enumerate(p.reads):
        weight = r.weight if r.step is None else p.steps[r.step].weight
        n = {a: b.col(f"n{i}_{a}", weight * r.factor.get(a, 1.0) * p.arrays[a].remake_s,
                      integer=False) for a in closure(p, r.arrays)}
        act = {} if r.step is None or r.option is None else {ys[r.step][r.option]: 1.0}
        for a in r.arrays:       # n + k - y >= 0, or n + k >= 1 for a read every plan makes
            b.row({n[a]: 1.0, kk[a]: 1.0, **{c: -v for c, v in act.items()}},
                  lo=0.0 if act else 1.0)
        for a, col in n.items():
            for inp in p.arrays[a].inputs:
                b.row({n[inp]: 1.0, col: -1.0, kk[inp]: 1.0}, lo=0.0)
        into = in_bound.setdefault(r.query, {}) if r.step is None \
            else by_step.setdefault(r.step, {})
        for a, col in n.items():
            into[col] = into.get(col, 0.0) + r.factor.get(a, 1.0) * p.arrays[a].remake_s
    for qb in p.bounds:
        slack = b.col(f"s_{qb.name}", BOUND_PENALTY * qb.weight, 0.0, math.inf, integer=False)
        coefs: dict[int, float] = {slack: -1.0, **in_bound.get(qb.name, {})}
        for k in qb.steps:
            for col, opt in zip(ys[k], p.steps[k].options):
                coefs[col] = coefs.get(col, 0.0) + opt.cost
            for col, v in by_step.get(k, {}).items():
                coefs[col] = coefs.get(col, 0.0) + v
        b.row(coefs, hi=qb.bound - qb.fixed)
    return b, x, kk


def _glpk(b: _Builder, presolve: bool = True):
    lp = glp.glp_create_prob()
    try:
        glp.glp_set_obj_dir(lp, glp.GLP_MIN)
        glp.glp_add_cols(lp, len(b.cols))
        for j, (name, obj, lo, hi, integer) in enumerate(b.cols, start=1):
            glp.glp_set_col_name(lp, j, name)
            glp.glp_set_obj_coef(lp, j, obj)
            glp.glp_set_col_bnds(lp, j, _bounds(lo, hi), lo, hi)
            if integer:
                glp.glp_set_col_kind(lp, j, glp.GLP_BV if (lo, hi) == (0.0, 1.0) else glp.GLP_IV)
        if b.rows:
            glp.glp_add_rows(lp, len(b.rows))
        nz = sum(len(c) for c, _, _ in b.rows)
        ia, ja, ar = glp.intArray(nz + 1), glp.intArray(nz + 1), glp.doubleArray(nz + 1)
        n = 0
        for i, (coefs, lo, hi) in enumerate(b.rows, start=1):
            glp.glp_set_row_bnds(lp, i, _bounds(lo, hi), 0.0 if math.isinf(lo) else lo,
                                 0.0 if math.isinf(hi) else hi)
            for j, v in coefs.items():
                n += 1
                ia[n], ja[n], ar[n] = i, j, float(v)
        glp.glp_load_matrix(lp, n, ia, ja, ar)
        if not presolve:        # branch and cut then starts from the LP relaxation's optimum
            smcp = glp.glp_smcp()
            glp.glp_init_smcp(smcp)
            smcp.msg_lev = glp.GLP_MSG_OFF
            ret = glp.glp_simplex(lp, smcp)
            if ret == 0 and glp.glp_get_status(lp) in (glp.GLP_NOFEAS, glp.GLP_INFEAS):
                return "infeasible", None
            if ret != 0 or glp.glp_get_status(lp) != glp.GLP_OPT:
                raise BudgetError(f"GLPK could not solve the storage plan's relaxation (code {ret}, "
                                  f"status {glp.glp_get_status(lp)})")
        parm = glp.glp_iocp()
        glp.glp_init_iocp(parm)
        parm.presolve = glp.GLP_ON if presolve else glp.GLP_OFF
        parm.msg_lev = glp.GLP_MSG_OFF
        ret = glp.glp_intopt(lp, parm)
        st = glp.glp_mip_status(lp)
        if ret == glp.GLP_ENOPFS or st == glp.GLP_NOFEAS:
            return "infeasible", None
        if ret != 0 or st not in (glp.GLP_OPT, glp.GLP_FEAS):
            raise BudgetError(f"GLPK could not solve the storage plan (code {ret}, status {st})")
        values = [glp.glp_mip_col_val(lp, j) for j in range(1, len(b.cols) + 1)]
        return "optimal", values
    finally:
        glp.glp_delete_prob(lp)
