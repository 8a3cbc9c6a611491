"""Storage plans: what ``subzero optimize`` decides, prints and saves.

``optimize()`` is the whole loop: calibrate the machine (once), profile the
workflow (once per workflow and parameters), read the workload (a file, or
the trace log), build and solve the integer program, and save the plan under
a name that ``subzero run --plan NAME`` (or ``Store.run(plan=...)``) uses.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from subzero.errors import BudgetError, OptimizerError, SubZeroError, WorkloadError
from subzero.forked import cores
from subzero.model.strategy import Strategy, default_for, parse
from subzero.model.workflow import load_workflow
from subzero.tuning import WORKLOAD_SPLIT_RUN_S

from . import loadcost
from .budgets import Budgets, fmt_size
from .calibration import ensure_calibration
from .costmodel import CostModel
from .ilp import evaluate, remake_cost, solve
from .planner import QueryPlanner
from .problem import ArrayFact, ArrayFacts, build, unvouched
from .profile import profile_workflow
from .progress import Progress, ProgressArg
from .stats import collect, for_run, required
from .workloads import from_trace_log, measure, read_file, sibling_file


@dataclass
class PlanRow:
    op: str
    strategies: str            # what `subzero run` stores: "map", "blackbox" or "A+B"
    disk: float
    runtime_s: float
    query_s: float             # workload-weighted seconds of this operator's steps


@dataclass
class Plan:
    name: str
    workflow: str
    params: dict
    max_disk: int | None
    max_runtime: float | None
    base_s: float
    rows: list[PlanRow]
    query_s: float
    blackbox_query_s: float
    queries: dict[str, float] = field(default_factory=dict)    # predicted seconds per query
    predicted_bytes: dict[str, dict[str, float]] = field(default_factory=dict)
    solve_s: float = 0.0
    candidates: int = 0
    pruned: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    capture_s: float = 0.0     # paid once by a run that stores anything (LMDB environment)
    #: the workload's pessimistic price the plan was chosen by (each step's prediction times
    #: its error factor, plus any penalty for a query slower than under the defaults)
    priced_s: float = 0.0
    #: of ``max_disk``, the bytes set aside for the arrays a run must keep (its outputs,
    #: as the profiling run stored them); lineage was planned within the rest
    arrays_reserve: int = 0
    #: the intermediate arrays the plan chose to keep or drop (a disk budget's plan):
    #: name -> {"keep": bool, "bytes": what keeping it takes, "remake_s": its remake};
    #: a run with ``--keep auto`` keeps what the plan keeps
    arrays: dict[str, dict] = field(default_factory=dict)
    #: what a ``subzero trace`` process pays once on top of its queries' steps (its first
    #: uses: the lineage store opened, readers made, the query code's first imports), as
    #: the calibration measured it in a fresh process; not in ``query_s``, which prices
    #: the queries
    first_use_s: float = 0.0
    #: of ``first_use_s``, loading the workflow's operators in a trace process (the
    #: modules they come from imported), measured for this workflow (``loadcost``)
    workflow_load_s: float = 0.0
    #: what each of ``queries`` includes for a trace beyond its steps (the store opened,
    #: the answer logged: the calibration's ``trace_query_s``)
    trace_query_s: float = 0.0
    #: the profiling run this call of ``optimize`` made (None: the store's profile was
    #: used): a budget run with the same inputs is made from it (:mod:`subzero.runs.planned`)
    profiled_run: int | None = None

    @property
    def drops(self) -> list[str]:
        """The intermediate arrays the plan does not keep."""
        return [n for n, a in self.arrays.items() if not a.get("keep")]

    @property
    def spare(self) -> list[str]:
        """The arrays the plan keeps, those the workload would miss least per byte first:
        what a run whose arrays came out larger than planned drops to fit its budget."""
        kept = [(a.get("value_s", 0.0) / max(a["bytes"], 1.0), n) for n, a in self.arrays.items()
                if a.get("keep")]
        return [n for _, n in sorted(kept)]

    @property
    def strategies(self) -> dict[str, str]:
        return {r.op: r.strategies for r in self.rows}

    @property
    def disk(self) -> float:
        return sum(r.disk for r in self.rows)

    @property
    def runtime_s(self) -> float:
        return sum(r.runtime_s for r in self.rows) + (self.capture_s if self.disk else 0.0)

    @property
    def runtime_factor(self) -> float:
        return 1.0 + self.runtime_s / self.base_s if self.base_s > 0 else math.nan

    @property
    def blackbox(self) -> bool:
        return all(r.strategies in ("map", "blackbox") for r in self.rows)

    @property
    def _loading(self) -> str:
        """Of the first uses, what loading the operators takes (the table's words)."""
        if not self.workflow_load_s:
            return ""
        return f", {self.workflow_load_s * 1000:.0f} ms of it loading the operators"

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(strategies=self.strategies, disk=self.disk, runtime_s=self.runtime_s,
                 runtime_factor=self.runtime_factor,
                 drops=self.drops if self.arrays else None,
                 spare=self.spare if self.arrays else None)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        keys = cls.__dataclass_fields__
        kw = {k: v for k, v in d.items() if k in keys}
        kw["rows"] = [PlanRow(**r) for r in d["rows"]]
        return cls(**kw)

    def table(self) -> str:
        w = max([len(r.strategies) for r in self.rows] + [10])
        lines = [f"plan {self.name!r} for workflow {self.workflow}"
                 + (f" ({', '.join(f'{k}={v}' for k, v in self.params.items())})" if self.params else "")
                 + f": disk budget {fmt_size(self.max_disk)}, runtime budget "
                 + ("unbounded" if self.max_runtime is None else f"{self.max_runtime:g}x"),
                 f"  {'operator':<16} {'strategies':<{w}} {'disk':>11} {'runtime':>10} {'query cost':>11}"]
        for r in self.rows:
            lines.append(f"  {r.op:<16} {r.strategies:<{w}} {fmt_size(r.disk):>11} "
                         f"{r.runtime_s:9.3f}s {r.query_s * 1000:9.1f}ms")
        budget = "" if self.max_disk is None else f" of {fmt_size(self.max_disk)}"
        rt = "" if self.max_runtime is None else f" (budget {self.max_runtime:g}x)"
        lines.append(f"  {'total':<16} {'':<{w}} {fmt_size(self.disk):>11} {self.runtime_s:9.3f}s "
                     f"{self.query_s * 1000:9.1f}ms")
        used = fmt_size(self.disk)
        if self.arrays or self.arrays_reserve:
            kept = sum(a["bytes"] for a in self.arrays.values() if a.get("keep"))
            used = (f"{fmt_size(self.disk + kept + self.arrays_reserve)} (lineage {used}, "
                    f"intermediate arrays kept {fmt_size(kept)}, outputs and metadata "
                    f"{fmt_size(self.arrays_reserve)})")
        lines.append(f"  disk {used}{budget}; runtime {self.runtime_factor:.2f}x the "
                     f"no-lineage run ({self.base_s:.2f}s){rt}; workload cost "
                     f"{self.query_s * 1000:.1f} ms, {self.blackbox_query_s * 1000:.1f} ms without "
                     f"stored lineage" + (f" (and {self.first_use_s * 1000:.0f} ms once per trace "
                                          f"process{self._loading})" if self.first_use_s else ""))
        if self.arrays:
            kept = [n for n, a in self.arrays.items() if a.get("keep")]
            size = sum(a["bytes"] for a in self.arrays.values() if a.get("keep"))
            lines.append(f"  arrays: keeps {len(kept)} of {len(self.arrays)} intermediates "
                         f"({fmt_size(size)}): {', '.join(kept) or 'none'}; made again when "
                         f"read: {', '.join(self.drops) or 'none'}")
        lines.append(f"  ILP: {self.candidates} candidate strategies after pruning "
                     f"{sum(self.pruned.values())}, solved in {self.solve_s * 1000:.1f} ms")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def parse_pins(pins, wf) -> dict[str, tuple[Strategy, ...]]:
    """``{"op": "spec"}`` or ``["op=spec", ...]`` -> strategies per operator."""
    if pins is None:
        return {}
    items = pins.items() if isinstance(pins, dict) else []
    if not isinstance(pins, dict):
        items = []
        for it in pins:
            op, sep, spec = str(it).partition("=")
            if not sep or not op.strip() or not spec.strip():
                raise OptimizerError(f"malformed `pins` entry {it!r}; write OPERATOR=STRATEGY, e.g. "
                                     f"model=pay:payone:backward")
            items.append((op.strip(), spec.strip()))
    out = {}
    for op, spec in items:
        if op not in wf.steps:
            raise OptimizerError(f"`pins` names unknown operator {op!r}; operators of "
                                 f"{wf.name!r}: {', '.join(wf.steps)}")
        out[op] = parse(spec) if isinstance(spec, str) else tuple(spec)
    return out


def _default_name(wf, budgets: Budgets) -> str:
    disk = "unbounded" if budgets.max_disk is None else fmt_size(budgets.max_disk).replace(" ", "")
    rt = "" if budgets.max_runtime is None else f"-{budgets.max_runtime:g}x"
    return f"{wf.name}-{disk}{rt}"


def _workload(store, model, stats, workload, wf, prog: Progress):
    prun = store.get(stats.profile_run)
    planner = QueryPlanner(CostModel(model.calibration, required(for_run(store, prun), f"run {prun.id}")))
    if workload is None and (logged := from_trace_log(store, wf.name, wf.params)):
        return logged
    f = workload if workload is not None else sibling_file(wf.source)
    if f is not None:
        queries = read_file(f)
        prog.note(f"measuring the workload {Path(f).name} on the profiling run")
        with prog.bar("workload", len(queries), unit="query") as advance:
            return measure(store, prun, queries, planner, advance)
    raise WorkloadError(f"no workload for {wf.name!r}: give a `workload` file, or trace some queries "
                        f"first (the optimizer learns the workload from the trace log)")


def _measure_early(store, cal, wf, workload, run_id: int, prog: Progress, into: dict,
                   idle: bool = False) -> None:
    """The workload file's queries traced on the profiling run ``run_id`` as soon as its
    last operator has ended, while the profiler's children price the strategies it left
    queued (``profile_workflow``'s ``while_pricing``), into ``into["queries"]`` for
    :func:`_optimize` (which measures them itself otherwise: :func:`_workload`).  Their
    steps' sizes are all a plan takes from them.  Measured after the pricing, as they
    were, they kept a core idle for their whole length (0.4 s of a budget run at genomics
    1,000x, 5-6 s at 10,000x).  The planner that answers them prices from the run's own
    statistics (the profile is not saved yet): how a step is answered may differ, not its
    cells.  Nothing when the workload comes from the trace log; a mistake in the workload
    file, or a query that cannot be traced, is left to :func:`_workload` to report.
    ``idle``: the profiler's children have priced everything (its cores are free); then,
    or when the run took ``WORKLOAD_SPLIT_RUN_S`` or more, the queries are shared with
    a forked child (``measure``'s ``split``)."""
    if workload is None and from_trace_log(store, wf.name, wf.params):
        return
    f = workload if workload is not None else sibling_file(wf.source)
    if f is None:
        return
    try:
        queries = read_file(f)
        prun = store.get(run_id)
        stats = for_run(store, prun)
        planner = QueryPlanner(CostModel(cal, stats)) if stats is not None else None
        prog.note(f"measuring the workload {Path(f).name} on the profiling run while its "
                  f"strategies are priced")
        ran = (prun.row.ended or prun.row.started) - prun.row.started
        split = cores() >= 2 and (idle or ran >= WORKLOAD_SPLIT_RUN_S)
        into["queries"] = measure(store, prun, queries, planner, split=split)
    except SubZeroError:
        pass


def optimize(store, workflow, params: dict | None = None, inputs: dict | None = None,
             max_disk=None, max_runtime=None, workload=None, pins=None, name: str | None = None,
             recalibrate: bool = False, reprofile: bool = False, save: bool = True,
             progress: ProgressArg = None, force: bool = True,
             profile_pairs: dict | None = None, profile_sums: dict | None = None,
             defer_reads: bool | None = None) -> Plan:
    """Choose every operator's strategies for the workload within the budgets.

    ``profile_pairs``: a dict that, when this call profiles the workflow, receives the
    lineage pairs its profiler kept in memory (:func:`profile_workflow`'s ``keep_pairs``),
    for the run made from it (``plan.profiled_run``); ``profile_sums`` then receives
    the chunk sums of its arrays as it wrote them (for that run's drops).

    ``defer_reads``: when this call profiles, read at once only the lineage samples of
    each operator's defaults, and the others' only when a solve chooses them
    (``sampleread.Unread``; reading every sample was most of a budget run's pricing).
    By default, when this call is a budget run's (``profile_pairs`` given); a call that
    makes a plan only reads them all, so that plans for other budgets need no profile
    again.  A plan that chooses a strategy an earlier profile left unread profiles
    the workflow again, reading every sample.

    ``force=False`` refuses, before any work, to replace a saved plan of the same name
    (what ``subzero optimize`` does without ``--force``).

    ``progress``: say on stderr what it is doing, with bars and the time left —
    None (the default) when stderr is a terminal, True / False always / never,
    or a function called once per workload query measured."""
    prog = Progress.of(progress)
    wf = load_workflow(workflow, dict(params or {}))
    budgets = Budgets.parse(max_disk, max_runtime)
    pins = parse_pins(pins, wf)
    name = name or _default_name(wf, budgets)
    if save and not force and store.catalog.get_plan(name) is not None:
        raise OptimizerError(f"a plan named {name!r} is saved already; choose another `name` or "
                             f"pass `force=True` to replace it")
    if workload is not None:
        read_file(workload)                        # a malformed file fails before any work
    # what a trace process pays to load these operators, timed in a fresh process while
    # the calibration and the profile go on
    load = loadcost.start(wf)
    try:
        cal = ensure_calibration(store, recalibrate, progress=prog)
        stats = None if reprofile else collect(store, wf.name, wf.params)
        missing = stats is not None and any(
            s.stored and str(s) not in stats.ops[op].strategies
            for op, ss in pins.items() for s in ss)
        profiled, got = None, None
        early: dict[str, list] = {}     # the workload measured while the profile prices
        if stats is None or missing:
            prog.note(f"profiling workflow {wf.name} (one run that prices every operator's "
                      f"strategies)")
            deferred = profile_pairs is not None if defer_reads is None else defer_reads
            got = profile_workflow(store, wf, inputs=inputs, all_ops=missing or bool(pins),
                                   progress=prog.on, keep_pairs=profile_pairs is not None,
                                   defer_reads=deferred, rough=deferred,
                                   while_pricing=lambda run_id, idle: _measure_early(
                                       store, cal, wf, workload, run_id, prog, early, idle))
            profiled = got["run_id"]
            if profile_pairs is not None:
                profile_pairs.update(got["pairs"])
                if profile_sums is not None:
                    profile_sums.update(got["sums"])
        try:
            if got is not None:
                stats = collect(store, wf.name, wf.params)
            plan = _optimize(store, wf, cal, stats, got, budgets, pins, name, workload, prog,
                             save, profiled, load, early.get("queries"))
        finally:
            if got is not None and got["unread"] is not None:
                got["unread"].close()
        if plan is not None:
            return plan
        # a chosen strategy's sample was left unread by an earlier profile: profile again
        prog.note(f"the plan chose strategies whose lineage samples the last profile of "
                  f"{wf.name} did not read: profiling it again")
        return optimize(store, workflow, params, inputs, max_disk, max_runtime, workload, pins,
                        name, recalibrate=False, reprofile=True, save=save, progress=progress,
                        force=True, profile_pairs=profile_pairs, profile_sums=profile_sums,
                        defer_reads=False)
    finally:
        load.close()


def _optimize(store, wf, cal, stats, got, budgets, pins, name, workload, prog, save,
              profiled, load: loadcost.LoadCost | None = None,
              measured: list | None = None) -> Plan | None:
    """:func:`optimize` once the workflow is profiled (``got``: what this call's profile
    returned, or None; ``measured``: the workload's queries as its profile measured them
    while it priced, :func:`_measure_early`); None when a plan chose a strategy whose
    sample an earlier profile left unread (its samples are gone: the workflow is
    profiled again)."""
    model = CostModel(cal, required(stats, f"workflow {wf.name}"))
    reserve = arrays_reserve(store, wf, stats) if budgets.max_disk is not None else 0
    facts = array_facts(store, wf, stats) if budgets.max_disk is not None else None
    whole = budgets
    if reserve and budgets.max_disk is not None:
        if reserve > budgets.max_disk:
            raise BudgetError(f"the disk budget of {fmt_size(budgets.max_disk)} covers a run's "
                              f"arrays and lineage, and the workflow's outputs with the metadata "
                              f"of its other arrays alone take {fmt_size(reserve)} (as its "
                              f"profiling run stored them); give a larger --max-disk")
        budgets = Budgets(budgets.max_disk - reserve, budgets.max_runtime)
    same = {r.id for r in store.catalog.runs() if r.workflow == wf.name and r.params == wf.params}
    model.learn([s for s in store.catalog.trace_steps() if s["run_id"] in same])
    queries = measured if measured is not None else _workload(store, model, stats, workload, wf,
                                                              prog)
    prog.note(f"choosing strategies for {len(queries)} queries within {budgets.describe()} (GLPK)")
    defaults = {name: default_for(step.operator) for name, step in wf.steps.items()}
    unread = got["unread"] if got is not None else None
    read = 0
    while True:
        built, sol, chosen_pins, plain = _choose(model, queries, budgets, pins, defaults, facts)
        need = _unread(model, built, sol)
        if not need:
            break
        lost = next((k for k in need if unread is None or k not in unread), None)
        if lost is not None:
            if got is None:
                return None
            raise OptimizerError(f"the profile of {wf.name!r} wrote a sample of {lost[0]}'s "
                                 f"{lost[1]} and lost it before it was read; profile it again "
                                 f"(`--reprofile`)")
        # a plan is chosen on the samples' own decode rates (and on full prices where the
        # profile priced roughly): read those it chose, choose again
        assert unread is not None and got is not None
        again = sum(1 for k in need if got["ops"][k[0]]["strategies"][k[1]].get("rough"))
        prog.note(f"reading the lineage samples of {len(need)} strategies the plan chose"
                  + (f" ({again} of them priced in full first)" if again else ""))
        for (op, s), fields in unread.read_all(need).items():
            rec = got["ops"][op]["strategies"][s]
            if "bytes" in fields:           # priced again: the rough price goes whole
                rec.clear()
                rec.update(fields)
                model.repriced(op, s, rec)
            else:
                rec.update(fields)
                model.sample_read(op, s, fields["sample"])
            rec.pop("unread", None)
            read += 1
    if read:                    # the profile keeps what was read (a later plan uses it)
        store.catalog.add_profile(got["run_id"], wf.name, wf.params, got["base_s"], got["ops"])
    pins = chosen_pins
    plan = _assemble(store, wf, budgets, stats, model, built, sol, pins, name, save=False,
                     load_s=load.seconds() if load is not None else 0.0)
    plan.max_disk, plan.arrays_reserve = whole.max_disk, reserve
    plan.profiled_run = profiled
    if reserve:
        plan.notes.append(f"{fmt_size(reserve)} of the disk budget is set aside for the "
                          f"workflow's outputs (a run keeps them whatever --keep says); lineage "
                          f"and the intermediate arrays kept were planned within the other "
                          f"{fmt_size(budgets.max_disk)}")
    for op, why in plain.items():
        plan.notes.append(f"{op} stores no lineage: the model cannot vouch for its strategies "
                          f"({why}) and its defaults do not fit the budgets")
    if save:
        store.catalog.save_plan(name, wf.name, plan.as_dict())
    return plan


def _unread(model, built, sol) -> list[tuple[str, str]]:
    """(operator, strategy) of the stored strategies a solution chose whose samples the
    profile has not read."""
    out = []
    for k in sol.chosen:
        c = built.problem.candidates[k]
        info = model.stats.ops.get(c.op)
        for s in parse(c.strategy):
            si = info.strategies.get(str(s)) if info is not None and s.stored else None
            if si is not None and si.unread and (c.op, str(s)) not in out:
                out.append((c.op, str(s)))
    return out


def _choose(model, queries, budgets, pins, defaults, facts):
    """Solve, keep the defaults of operators whose chosen strategies the model cannot
    vouch for, insure: (built, solution, pins, operators left storing nothing -> why)."""
    built = build(model, queries, budgets, pins, defaults, arrays=facts)
    sol = solve(built.problem)
    keep = unvouched(model, built.problem, sol.chosen) if sol.status == "optimal" else {}
    plain: dict[str, str] = {}
    if keep:            # a plan the model cannot vouch for: keep those operators' defaults
        kept = build(model, queries, budgets, pins, defaults, keep_defaults=keep, arrays=facts)
        again = solve(kept.problem)
        if again.status != "optimal":
            # their defaults do not fit the budgets either: those operators store nothing
            # (mapping functions or re-execution), which fits any budget the first plan did
            plain = {op: why for op, why in keep.items() if op not in pins}
            ops = model.stats.ops
            pins = {**pins, **{op: parse("map" if ops[op].has_map else "blackbox")
                               for op in plain}}
            kept = build(model, queries, budgets, pins, defaults, arrays=facts)
            again = solve(kept.problem)
        built, sol = kept, again
    if sol.status != "optimal":
        raise BudgetError(f"no plan fits {budgets.describe()}" + (" with the pinned strategies"
                                                                   if pins else ""))
    insured = _insure(model, queries, budgets, pins, defaults, facts, built, sol)
    if insured is not None:
        built, sol, pins = insured
    return built, sol, pins, plain


def _insure(model, queries, budgets, pins, defaults, facts, built, sol):
    """The plan with the operators' stored defaults added where the budgets have room
    for them after it, or None (nothing to add, or no room): (built, solution, pins).

    A plan is chosen by the model's prices, and a price can be wrong by more than its
    error factor -- a scan that decodes a cold index, a first read in a fresh process.
    A strategy added to a plan only adds methods a trace may choose from, so keeping the
    defaults (each operator's declared strategies, what a run without a plan stores)
    is the insurance that a query the defaults answer well is not left to a scan the
    model misjudged.  It takes only room the plan leaves: operators are insured smallest
    defaults first while their bytes fit; the plan is then solved again with those
    operators' strategies fixed to the plan's own plus their defaults (the arrays it
    keeps, and the other operators, chosen around them), and kept only if that fits."""
    p = built.problem
    have: dict[str, list[Strategy]] = {}
    for k in sol.chosen:
        c = p.candidates[k]
        have.setdefault(c.op, []).append(parse(c.strategy)[0])
    missing: dict[str, list[Strategy]] = {}
    for op, ds in defaults.items():
        info = model.stats.ops.get(op)
        if op in pins or info is None:
            continue
        need = [d for d in ds if d.stored and d not in have.get(op, [])]
        if need and all(str(d) in info.strategies for d in need):
            missing[op] = need
    room = None if budgets.max_disk is None else budgets.max_disk - sol.disk
    add: dict[str, list[Strategy]] = {}
    for op, need in sorted(missing.items(), key=lambda kv: sum(model.disk(kv[0], d) for d in kv[1])):
        size = sum(model.disk(op, d) for d in need)
        if room is not None and size > room:
            continue
        room = None if room is None else room - size
        add[op] = need
    if not add:
        return None
    # every operator that stores lineage keeps what the plan chose (the solve again must
    # not trade one operator's defaults for another's), plus its defaults where added
    fixed = dict(pins)
    for op in set(have) | set(add):
        mapped = (parse("map")[0],) if model.stats.ops[op].has_map else ()
        fixed[op] = mapped + tuple(have.get(op, [])) + tuple(add.get(op, []))
    try:
        again_built = build(model, queries, budgets, fixed, defaults, arrays=facts)
    except SubZeroError:             # e.g. the plan's payload mode and a default's differ
        return None
    again = solve(again_built.problem)
    if again.status != "optimal":
        return None
    # the first plan's reasons stay (an operator it kept the defaults of, unvouched)
    again_built.kept_defaults = {**built.kept_defaults, **again_built.kept_defaults}
    for op in add:
        again_built.kept_defaults[op] = ("the plan left room for them (a plan adds to the "
                                         "defaults where the budgets allow)")
    return again_built, again, fixed


def arrays_reserve(store, wf, stats) -> int:
    """Bytes a run of ``wf`` keeps of arrays whatever its ``--keep`` policy: its outputs
    (arrays no operator reads) and the metadata and checksums of its intermediates,
    as its profiling run stored them (compressed, counted as the run's budget counts
    them: :func:`subzero.runs.keep.array_bytes`); an output the profiling run no longer
    has counts its uncompressed size from the profile."""
    from subzero.runs.keep import reserve
    return reserve(_profile_arrays(store, stats), wf, lambda n: stats.op(n).out_bytes)


def _profile_arrays(store, stats):
    """The profiling run's array store (None: no profiling run, or its folder is gone),
    read by file sizes only (:func:`subzero.runs.keep.array_bytes`)."""
    from subzero.storage.arrays import ArrayStore
    if stats.profile_run is None:
        return None
    try:
        return ArrayStore(store.run_dir(stats.profile_run))
    except SubZeroError:
        return None


def array_facts(store, wf, stats) -> ArrayFacts:
    """The intermediate arrays a run of ``wf`` may drop (:func:`subzero.runs.keep.droppable`),
    as its profiling run stored them: the bytes keeping each takes, its operator's run
    time (what making it again costs), whether it is made again per chunk, and whether
    ``--keep auto`` keeps it whatever the workload (:func:`subzero.runs.keep.preferred`)."""
    from subzero.engines.remake import chunk_halo
    from subzero.runs.keep import drop_saving, droppable, preferred
    from subzero.tuning import DEFAULT_TILE
    arrays = _profile_arrays(store, stats)
    local = {name for name, step in wf.steps.items() if name in stats.ops
             and chunk_halo(step.operator, [tuple(s) for s in stats.ops[name].in_shapes],
                            tuple(stats.ops[name].out_shape)) is not None}
    run_s = {n: stats.op(n).run_s for n in wf.steps if n in stats.ops}
    sizes: dict[str, float] = {}
    for n in droppable(wf):
        info = stats.op(n)
        if info.drop_saves:            # measured as the profiling run computed it
            sizes[n] = float(info.drop_saves)
        else:                          # a profile from before: its run's folder, or its size
            got = drop_saving(arrays, n) if arrays is not None else 0
            sizes[n] = float(got if got > 0 else info.out_bytes)
    prefer = preferred(wf, run_s, sizes)
    out = []
    for n, b in sizes.items():
        shape = tuple(stats.op(n).out_shape)
        cells = int(math.prod(shape)) if shape else 1
        share = math.prod(min(s, DEFAULT_TILE) / s for s in shape if s) if shape else 1.0
        out.append(ArrayFact(n, b, run_s.get(n, 0.0), list(wf.steps[n].inputs), n in local,
                             cells, share, n in prefer))
    return ArrayFacts(out, local)


def _assemble(store, wf, budgets, stats, model, built, sol, pins, name, save,
              load_s: float = 0.0) -> Plan:
    p = built.problem
    chosen = {k: p.candidates[k] for k in sol.chosen}
    # reports use predicted (not pessimistic) seconds of the method a planner would pick
    kept = set(sol.kept)
    # what the workload pays to make dropped arrays again: per option of a step, per query
    extra: dict[tuple[int, int], float] = {}
    of_query: dict[str, float] = {}
    for r in p.reads:
        c = remake_cost(p, r, kept)
        if r.step is not None and r.option is not None:
            extra[(r.step, r.option)] = extra.get((r.step, r.option), 0.0) + c
        elif r.query is not None:
            of_query[r.query] = of_query.get(r.query, 0.0) + c

    def traced(o, more: float = 0.0, fresh: float = model.fresh_step_s) -> float:
        """An option's predicted seconds (``more``: its remakes), a stored read as a
        `subzero trace` pays it (``fresh`` more than the warm model's price)."""
        return o.predicted + more + (fresh if o.cand is not None else 0.0)

    def step_s(k: int, fresh: float = model.fresh_step_s) -> float:
        """Predicted seconds of step ``k`` under the plan."""
        return min(traced(o, extra.get((k, j), 0.0), fresh) for j, o in enumerate(p.steps[k].options)
                   if o.cand is None or o.cand in chosen)
    # the pessimistic price the plan was chosen by, in the same terms
    added = sum(st.weight * (step_s(k) - step_s(k, 0.0)) for k, st in enumerate(p.steps))
    op_cost = dict(built.fixed_cost)
    for k, st in enumerate(p.steps):
        op_cost[st.op] = op_cost.get(st.op, 0.0) + st.weight * step_s(k)
    weights = {b.name: b.weight for b in p.bounds}
    remakes_s = sum(weights.get(q, 1.0) * c for q, c in of_query.items())
    rows, predicted = [], {}
    for op, info in stats.ops.items():
        mine = [c for c in chosen.values() if c.op == op]
        strats = tuple(parse(c.strategy)[0] for c in mine)
        if op in pins:
            spec = "+".join(str(s) for s in pins[op])
        elif mine:
            spec = "+".join((["map"] if info.has_map else []) + [c.strategy for c in mine])
        else:
            spec = "map" if info.has_map else "blackbox"
        predicted[op] = {c.strategy: c.bytes for c in mine}
        rows.append(PlanRow(op, spec, sum(c.bytes for c in mine), model.runtime(op, strats),
                            op_cost.get(op, 0.0)))
    queries = {}
    for qname, steps in built.query_steps.items():
        index = built.step_index.get(qname, [])
        # a trace pays model.trace_query_s beyond its steps (the store opened, the answer
        # logged): the same under every plan, so not part of the choice
        queries[qname] = model.trace_query_s + of_query.get(qname, 0.0) + sum(
            step_s(k) if k is not None else
            min(traced(o) for o in opts if o.cand is None or o.cand in chosen)
            for (_, opts, _), k in zip(steps, index + [None] * (len(steps) - len(index))))
    blackbox = sum(w * min(o.predicted for o in opts if o.cand is None)
                   for steps in built.query_steps.values() for _, opts, w in steps)
    around = model.trace_query_s * sum(weights.get(q, 1.0) for q in queries)
    plan = Plan(name, wf.name, dict(wf.params), budgets.max_disk, budgets.max_runtime, stats.base_s,
                rows, sum(op_cost.values()) + remakes_s + around, blackbox, queries,
                predicted, sol.solve_s,
                len(p.candidates), {r: len(v) for r, v in built.pruned.items()},
                capture_s=model.capture_fixed_s,
                priced_s=sol.query_cost + built.fixed_priced + added + around)
    plan.first_use_s = model.trace_first_s + load_s
    plan.workflow_load_s = load_s
    plan.trace_query_s = model.trace_query_s
    plan.arrays = {a.name: {"keep": i in kept, "bytes": a.bytes, "remake_s": a.remake_s}
                   for i, a in enumerate(built.arrays)}
    if kept:               # what dropping each kept array alone would cost the workload
        base = evaluate(p, sol.chosen, kept)[0]
        for i in kept:
            plan.arrays[built.arrays[i].name]["value_s"] = \
                max(evaluate(p, sol.chosen, kept - {i})[0] - base, 0.0)
    if not chosen:
        small = built.smallest
        if budgets.max_disk is not None and small is not None and small[0] > budgets.max_disk:
            plan.notes.append(f"the disk budget of {fmt_size(budgets.max_disk)} is too small for any "
                              f"stored lineage (the smallest candidate, {small[1]}, needs "
                              f"{fmt_size(small[0])}): black-box plan — operators answer with "
                              f"mapping functions or re-execution")
        else:
            plan.notes.append("black-box plan: no stored lineage makes this workload faster "
                              "within the budgets")
    for reason, ks in built.pruned.items():
        plan.notes.append(f"pruned {len(ks)}: {reason}")
    for op, why in built.kept_defaults.items():
        plan.notes.append(f"kept {op}'s default strategies: {why}")
    if save:
        store.catalog.save_plan(name, wf.name, plan.as_dict())
    return plan


def load_plan(store, name: str) -> Plan:
    d = store.catalog.get_plan(name)
    if d is None:
        names = store.catalog.plan_names()
        raise OptimizerError(f"no plan named {name!r}; " + (f"saved plans: {', '.join(names)}"
                                                             if names else "run `subzero optimize` first"))
    return Plan.from_dict(d)
