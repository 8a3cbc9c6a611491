"""From statistics, a workload and budgets to the integer program.

Every operator's candidates are the strategies its profile priced.  Before
the solver sees them, candidates that cannot matter are pruned, each with its
reason (pinned strategies are exempt):

* the operator has mapping functions — they answer its steps for free, so
  SubZero prefers them (the paper's built-ins);
* no workload query steps through the operator in the direction its index
  serves;
* it breaks the disk or runtime budget on its own;
* it is never faster than mapping functions or re-execution on any step;
* another strategy of the same mode is at least as small, as fast to write
  and as fast on every step.

An operator whose chosen strategy read its own lineage sample far from what
the calibration predicts (``CostModel.vouched``, ``unvouched``) keeps its
default strategies in the plan (``optimize`` solves again with them required
and exempt from pruning): the plan may add to them, but a step the defaults
answered well can still be answered that way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from subzero.errors import BudgetError, OptimizerError, StrategyError
from subzero.model.modes import Mode
from subzero.model.strategy import Strategy, parse_one
from subzero.tuning import DEFAULTS_TOLERANCE, KEEP_ADHOC_READS, TIE_BREAK

from .budgets import Budgets, fmt_size
from .costmodel import CostModel
from .ilp import ArrayItem, Candidate, Option, Problem, QueryBound, Read, Step
from .workloads import WorkloadQuery

UNANSWERABLE_S = 1e4        # re-executing a non-deterministic operator is impossible


@dataclass
class ArrayFact:
    """An intermediate array a run may drop, as its profiling run measured it."""

    name: str
    bytes: float             # what keeping it adds to the run's disk (its chunks)
    remake_s: float          # its operator's run: seconds to make it again whole
    inputs: list[str]        # the arrays it is made from
    tile_local: bool         # made again per chunk (its operator runs per tile)
    cells: int               # its size in cells
    chunk_share: float       # one chunk's share of it (a small read makes one again)
    #: ``--keep auto`` keeps it whatever the workload (slow to make again, or cheap to keep)
    prefer: bool = False


@dataclass
class ArrayFacts:
    """What the plan needs to choose which intermediate arrays a run keeps."""

    arrays: list[ArrayFact]
    tile_local: set[str] = field(default_factory=set)     # operators that run per tile


@dataclass
class Built:
    problem: Problem
    pruned: dict[str, list[str]] = field(default_factory=dict)     # reason -> ["op strategy"]
    fixed_cost: dict[str, float] = field(default_factory=dict)     # op -> weighted cost, no choice
    fixed_priced: float = 0.0      # the same steps' weighted pessimistic price
    query_steps: dict[str, list[tuple[str, list[Option], float]]] = field(default_factory=dict)
    smallest: tuple[float, str] | None = None                      # cheapest candidate on disk
    #: op -> why its defaults are kept (the model cannot vouch for one of its strategies)
    kept_defaults: dict[str, str] = field(default_factory=dict)
    #: the arrays the plan keeps or drops (``problem.arrays``), and what not keeping each
    #: would cost the workload, by name (what the plan reports)
    arrays: list[ArrayFact] = field(default_factory=list)
    #: per query, the index into ``problem.steps`` of each of its ``query_steps`` (None:
    #: a step with no choice)
    step_index: dict[str, list[int | None]] = field(default_factory=dict)


def _supported(info, s: Strategy) -> bool:
    if s.mode is Mode.MAP:
        return info.has_map
    if s.mode is Mode.BLACKBOX:
        return True
    return s.mode.value in info.supports and (s.mode is not Mode.COMP or info.has_mapping)


def check_pins(model: CostModel, pins: dict[str, tuple[Strategy, ...]]) -> None:
    ops = model.stats.ops
    for op, strats in pins.items():
        if op not in ops:
            raise OptimizerError(f"`pins` names unknown operator {op!r}; operators of "
                                 f"{model.stats.workflow!r}: {', '.join(ops)}")
        info = ops[op]
        for s in strats:
            if not _supported(info, s):
                known = sorted(info.strategies) + (["map"] if info.has_map else []) + ["blackbox"]
                raise StrategyError(f"pinned {op}={s} (`pins`): operator {op!r} does not support {s}; it "
                                    f"supports: {', '.join(known)}")
            if s.stored and str(s) not in info.strategies:
                raise OptimizerError(f"pinned {op}={s} (`pins`): no statistics for it (the profile skips "
                                     f"stored strategies of operators with mapping functions)")


def _option(model: CostModel, op: str, method, args: tuple[int, bool, float, float],
            where: dict, cand: int | None = None, label: str = "") -> Option | None:
    """An option priced twice: pessimistically (what the plan is chosen by: the model
    is trusted only as far as the calibration measured it for steps of this kind and
    size) and as predicted (what the plan reports)."""
    c = model.cost(op, method, *args, **where, fresh=False)   # a workload, not one process
    if c is None:
        return None
    hi = model.high_factor(op, method, *args)
    return Option(cand, c * hi, label or str(method), c)


def _priced(model: CostModel, op: str, method: str, args: tuple[int, bool, float, float],
            where: dict) -> Option:
    """Seconds of a re-execution or mapping step, which every profiled operator can price.

    ``CostModel.cost`` answers None only for an operator without statistics or a stored
    strategy it has not profiled; ``build`` skips the former and asks no strategy here, so
    None means the statistics contradict themselves: say so rather than plan on a guess.
    """
    opt = _option(model, op, method, args, where)
    if opt is None:
        raise OptimizerError(f"the cost model cannot price {method} of operator {op!r}; "
                             f"profile it again (`reprofile=True`)")
    return opt


def build(model: CostModel, queries: list[WorkloadQuery], budgets: Budgets,
          pins: dict[str, tuple[Strategy, ...]] | None = None,
          defaults: dict[str, tuple[Strategy, ...]] | None = None,
          keep_defaults: dict[str, str] | None = None,
          arrays: ArrayFacts | None = None) -> Built:
    """The integer program for ``queries`` within ``budgets``.  ``defaults``: the
    strategies a run stores when none are given; each query is then bounded by its
    price under them (``DEFAULTS_TOLERANCE``), so a plan does not trade one query's
    speed for another's beyond what the model can vouch for.  ``keep_defaults``: op ->
    why; those operators' stored defaults are required in the plan (``unvouched``).
    ``arrays``: intermediate arrays the plan keeps or drops within the disk budget (None:
    the run's ``--keep`` policy alone decides), priced by the remakes of what reads them:
    a re-execution its operator's inputs, a query the values of its answer and the arrays
    its cell selector reads."""
    pins = dict(pins or {})
    check_pins(model, pins)
    stats = model.stats
    max_rt = budgets.runtime_seconds(stats.base_s)
    cands: list[tuple[str, Strategy]] = [(op, s) for op, info in stats.ops.items()
                                         for s in info.candidates()]
    # every step of every query, priced for every method
    raw: dict[tuple, dict] = {}
    built = Built(Problem(list(stats.ops), [], {}, []))
    keys_of: dict[str, list[tuple]] = {}
    default_cost: dict[str, float] = {}
    for q in queries:
        plan_steps = built.query_steps.setdefault(q.name, [])
        keys_of[q.name] = []
        default_cost[q.name] = 0.0
        for st in q.steps:
            if st["method"] in ("all-to-all", "empty") or st["op"] not in stats.ops:
                continue
            op, info = st["op"], stats.ops[st["op"]]
            args = (st["input"], st["direction"] == "backward", st["cells_in"], st["cells_out"])
            where = {"blocks": st.get("blocks_in") or 0, "runs": st.get("runs_in") or 0}
            if info.deterministic or info.has_map:
                always = [_priced(model, op, "reexec", args, where)]
            else:
                always = [Option(None, UNANSWERABLE_S, "reexec")]
            if info.has_map:
                always.append(_priced(model, op, "map", args, where))
            key = (op, *args, where["blocks"], where["runs"])
            ent = raw.get(key)
            if ent is None:
                costs = {k: _option(model, op, s, args, where, k, str(s))
                         for k, (o, s) in enumerate(cands) if o == op}
                mine = [s for s in (defaults or {}).get(op, ()) if s.stored]
                dflt = [o for o in (_option(model, op, s, args, where) for s in mine) if o]
                ent = raw[key] = {"op": op, "weight": 0.0, "always": always, "costs": costs,
                                  "dir": st["direction"],
                                  "default": min(o.cost for o in always + dflt)}
            ent["weight"] += q.weight
            keys_of[q.name].append(key)
            default_cost[q.name] += ent["default"]
            plan_steps.append((op, always + [o for o in ent["costs"].values() if o is not None],
                               q.weight))
    required = _required_defaults(model, cands, budgets, pins, defaults, keep_defaults, built)
    keep = _prune(model, cands, raw, budgets, max_rt, pins, built, required)
    index = {k: j for j, k in enumerate(keep)}
    p = built.problem
    p.candidates = [Candidate(cands[k][0], str(cands[k][1]), cands[k][1].mode.value,
                              model.disk(*cands[k]), model.write_s(*cands[k]) + model.strategy_fixed_s)
                    for k in keep]
    p.fixed_runtime_s = model.capture_fixed_s
    p.gen_s = {(c.op, c.mode): model.gen_s(c.op, c.mode) for c in p.candidates}
    p.max_disk, p.max_runtime_s = budgets.max_disk, max_rt
    p.pinned = {op: [index[k] for k in keep if cands[k][0] == op and cands[k][1] in strats]
                for op, strats in pins.items()}
    p.required = [index[k] for k in required if k in index]
    p.exclusive = [(a, b) for a in range(len(p.candidates)) for b in range(a + 1, len(p.candidates))
                   if p.candidates[a].op == p.candidates[b].op
                   and {p.candidates[a].mode, p.candidates[b].mode} == {"pay", "comp"}]
    step_of: dict[tuple, int] = {}
    fixed_of: dict[tuple, float] = {}
    for key, ent in raw.items():
        opts = list(ent["always"]) + [Option(index[k], o.cost, o.label, o.expected)
                                      for k, o in ent["costs"].items() if k in index and o is not None]
        if len(opts) == len(ent["always"]) and not _reads_arrays(ent, arrays, stats.ops):
            built.fixed_cost[ent["op"]] = built.fixed_cost.get(ent["op"], 0.0) + \
                ent["weight"] * min(o.predicted for o in opts)
            fixed_of[key] = min(o.cost for o in opts)
            built.fixed_priced += ent["weight"] * fixed_of[key]
        else:
            step_of[key] = len(p.steps)
            p.steps.append(Step(ent["op"], ent["weight"], opts))
    if defaults is not None:
        for q in queries:
            p.bounds.append(QueryBound(q.name, q.weight,
                                       [step_of[k] for k in keys_of[q.name] if k in step_of],
                                       sum(fixed_of.get(k, 0.0) for k in keys_of[q.name]),
                                       DEFAULTS_TOLERANCE * default_cost[q.name]))
    built.step_index = {name: [step_of.get(k) for k in keys] for name, keys in keys_of.items()}
    if arrays is not None and arrays.arrays:
        _array_reads(built, arrays, queries, raw, step_of, model)
    for steps in built.query_steps.values():           # reporting: surviving candidates only
        for j, (op, opts, w) in enumerate(steps):
            steps[j] = (op, [Option(index.get(o.cand) if o.cand is not None else None, o.cost,
                                    o.label, o.expected) for o in opts
                             if o.cand is None or o.cand in index], w)
    blackbox = sum(e["weight"] * min(o.cost for o in e["always"]) for e in raw.values())
    total_b = sum(c.bytes for c in p.candidates) + sum(a.bytes for a in p.arrays) or 1.0
    total_r = sum(c.write_s for c in p.candidates) + sum(p.gen_s.values()) or 1.0
    # a small penalty breaks ties (TIE_BREAK): storing every candidate would cost 0.1% of
    # the workload without stored lineage, so megabytes are not spent on microseconds
    p.eps_disk = TIE_BREAK * blackbox / total_b
    p.eps_runtime = TIE_BREAK * blackbox / total_r
    pinned_bytes = sum(c.bytes for k, c in enumerate(p.candidates)
                       if any(k in v for v in p.pinned.values()))
    if budgets.max_disk is not None and pinned_bytes > budgets.max_disk:
        raise BudgetError(f"the pinned strategies alone need {fmt_size(pinned_bytes)}, more than "
                          f"the disk budget of {fmt_size(budgets.max_disk)}")
    return built


def _reexec(ent: dict) -> int | None:
    """The index of a step entry's re-execution option, when it can answer."""
    return next((j for j, o in enumerate(ent["always"])
                 if o.label == "reexec" and o.cost < UNANSWERABLE_S), None)


def _reads_arrays(ent: dict, arrays: ArrayFacts | None, ops: dict) -> bool:
    """Whether re-executing the entry's operator reads an array the plan may drop."""
    if arrays is None or _reexec(ent) is None:
        return False
    names = {a.name for a in arrays.arrays}
    return any(i in names for i in ops[ent["op"]].inputs)


def _array_reads(built: Built, facts: ArrayFacts, queries: list[WorkloadQuery],
                 raw: dict, step_of: dict, model: CostModel) -> None:
    """The plan's arrays and their readers: a re-execution reads its operator's inputs
    over the share of its run the step re-runs (all of them where it is not tile-local);
    a query the values of its answer (over the chunks its cells touch: what `subzero trace`
    prints) and the arrays its ``where`` selector names (whole); an array
    ``--keep auto`` keeps whatever the workload, ``KEEP_ADHOC_READS`` reads per unit of
    the workload's weight.  Made again, an array reads its own inputs: the same share
    where it is tile-local, else whole (``closure``)."""
    p = built.problem
    arrays = facts.arrays
    idx = {a.name: i for i, a in enumerate(arrays)}
    built.arrays = list(arrays)
    p.arrays = [ArrayItem(a.name, a.bytes, a.remake_s, [idx[i] for i in a.inputs if i in idx])
                for a in arrays]

    def factors(direct: list[int], share: float) -> dict[int, float]:
        out: dict[int, float] = {}
        todo = [(a, share) for a in direct]
        while todo:
            a, f = todo.pop()
            f = f if arrays[a].tile_local else 1.0
            if out.get(a, -1.0) >= f:
                continue
            out[a] = f
            todo.extend((b, f) for b in p.arrays[a].inputs)
        return out

    ops = model.stats.ops
    for key, ent in raw.items():
        j = _reexec(ent)
        k = step_of.get(key)
        if j is None or k is None:
            continue
        info = ops[ent["op"]]
        direct = [idx[i] for i in info.inputs if i in idx]
        if not direct:
            continue
        local = ent["op"] in facts.tile_local
        share = min(1.0, ent["always"][j].predicted / info.run_s) if local and info.run_s > 0 \
            else 1.0
        p.reads.append(Read(direct, factors(direct, share), step=k, option=j))
    total = sum(q.weight for q in queries)
    for q in queries:
        # the answer's values (what `subzero trace` prints) over the chunks its cells touch;
        # a `where` selector's arrays whole
        reads = [(q.target, float(q.steps[-1]["cells_out"] if q.steps else 0))]
        reads += [(n, math.inf) for n in q.selects]
        for name, cells in reads:
            a = idx.get(name)
            if a is None:
                continue
            f = arrays[a]
            share = min(1.0, max(cells / max(f.cells, 1), f.chunk_share))
            p.reads.append(Read([a], factors([a], share), weight=q.weight, query=q.name))
    for a, f in enumerate(arrays):
        if f.prefer:
            p.reads.append(Read([a], factors([a], 1.0), weight=KEEP_ADHOC_READS * total))


def _c(ent: dict, k: int) -> float | None:
    """The price of candidate ``k`` on a step entry (None: it cannot answer it)."""
    o = ent["costs"].get(k)
    return None if o is None else o.cost


def _c_inf(ent: dict, k: int) -> float:
    c = _c(ent, k)
    return math.inf if c is None else c


def unvouched(model: CostModel, p: Problem, chosen) -> dict[str, str]:
    """Operators whose chosen strategies (``chosen``: indices into ``p.candidates``) the
    model cannot vouch for (``CostModel.vouched``): op -> why."""
    out: dict[str, str] = {}
    for k in chosen:
        c = p.candidates[k]
        ok, why = model.vouched(c.op, parse_one(c.strategy))
        if not ok and c.op not in out:
            out[c.op] = why
    return out


def _required_defaults(model, cands, budgets, pins, defaults, keep, built) -> set[int]:
    """Candidates (indices into ``cands``) every plan must store: the stored defaults of
    each operator in ``keep`` (op -> why), when they fit the disk budget together (else
    the plan is left to the per-query bounds, and the note says so)."""
    need: set[int] = set()
    for op, why in (keep or {}).items():
        mine = [s for s in (defaults or {}).get(op, ()) if s.stored]
        if op in pins or not mine:
            continue
        ks = [k for k, (o, s) in enumerate(cands) if o == op and s in mine]
        if len(ks) == len(mine):
            need.update(ks)
            built.kept_defaults[op] = why
    if budgets.max_disk is not None and sum(model.disk(*cands[k]) for k in need) > budgets.max_disk:
        for op in list(built.kept_defaults):
            built.kept_defaults[op] += " (its defaults do not fit the disk budget: not kept)"
        return set()
    return need


def _prune(model, cands, raw, budgets, max_rt, pins, built, required=frozenset()) -> list[int]:
    def drop(reason, k):
        built.pruned.setdefault(reason, []).append(f"{cands[k][0]} {cands[k][1]}")

    by_op: dict[str, list[dict]] = {}
    for ent in raw.values():
        by_op.setdefault(ent["op"], []).append(ent)
    keep = []
    for k, (op, s) in enumerate(cands):
        info = model.stats.ops[op]
        if op in pins:
            if s in pins[op]:
                keep.append(k)
            continue
        if k in required:
            keep.append(k)
            continue
        size = model.disk(op, s)
        if built.smallest is None or size < built.smallest[0]:
            built.smallest = (size, f"{op} {s}")
        steps = by_op.get(op, [])
        if info.has_map:
            drop("mapping functions answer it", k)
        elif s.direction not in {e["dir"] for e in steps}:
            drop("no workload query uses its index", k)
        elif budgets.max_disk is not None and size > budgets.max_disk:
            drop("breaks the disk budget on its own", k)
        elif max_rt is not None and model.runtime(op, (s,)) > max_rt:
            drop("breaks the runtime budget on its own", k)
        elif all(_c(e, k) is None or _c(e, k) >= min(o.cost for o in e["always"])
                 for e in steps):
            drop("never faster than mapping or re-execution", k)
        else:
            keep.append(k)
    survivors = []
    for k in keep:                                     # Pareto dominance within a mode
        op, s = cands[k]
        if op in pins or k in required:
            survivors.append(k)
            continue
        steps = by_op.get(op, [])
        mine = (model.disk(op, s), model.write_s(op, s), [_c_inf(e, k) for e in steps])
        dominated = False
        for j in keep:
            o2, s2 = cands[j]
            if j == k or o2 != op or s2.mode is not s.mode:
                continue
            other = (model.disk(o2, s2), model.write_s(o2, s2), [_c_inf(e, j) for e in steps])
            if other[0] <= mine[0] and other[1] <= mine[1] and \
                    all(a <= b for a, b in zip(other[2], mine[2])) and (other != mine or j < k):
                dominated = True
                break
        if dominated:
            drop("dominated by another strategy of the same mode", k)
        else:
            survivors.append(k)
    return survivors
