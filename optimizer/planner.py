"""The query-time planner: per trace step, price every available method with
the cost model and current statistics, run the cheapest first, and give up on
stored lineage for re-execution only when switching cannot cost more than
staying.

Every prediction carries the error the calibration measured for steps of its
kind and size (``CostModel.margin``: the 90th percentile of measured /
predicted, wider beyond the largest calibrated step).  A stored read gets a
:class:`~subzero.query.planner.ReadBudget`: it is left alone within its own
pessimistic price, and never given up once half done; past that it switches
when its CPU time alone has reached five times re-execution's pessimistic price
(switching then costs at most 1.2x staying, whatever is left of the read), or
when its measured progress says the rest of it costs at least twice that
price.  A step whose method by the simple rule is priced under ``PLAN_FLOOR_S``
(its central price: what another method could save in expectation) runs that
method priced alone, and among methods priced within that much of the cheapest the
simple rule's order decides: choosing among methods of a fraction of a
millisecond saves less than pricing them costs, and at that size the model's error
decides more than the methods do.  Whatever their size, the operator's declared
defaults (which a plan keeps where the budget allows) are displaced only by a method
priced under them by more than ``PLAN_TIE`` (25%): one priced a little under them
would displace them as often for the worse as for the better, and a plan's query must
not be slower than the defaults'.  Such a read is not timed either (no budget: it
could be given up only past its pessimistic price and ``MIN_BUDGET_S``).  Budgets
count the CPU time of the read's own work, so a busy machine, which stretches wall
time, does not trip them; first-use costs (imports, opening the lineage store) are
never counted (``subzero.query.warmup``).  That replaces a share of the predicted
re-execution measured in wall time, which on a loaded machine gave up 2-10 ms reads
for re-executions of seconds.

The planner learns from every warm step, in CPU seconds (a step that met cold caches,
``StepStat.cold``, is not what its method costs): observed / predicted corrects
the model per operator input and method while the process runs
(``CORRECTION_KEEP``), clamped to ``CORRECTION_RANGE``.  A switched step teaches
both ways: the abandoned read by what it would have cost by its progress (at
least the time it ran), the re-execution by its own time, without the read's.
A read abandoned but nearly cheap moves its correction down again; a re-execution
that proved slow moves its own up, so the next step of the kind stays on the
read.  The trace log keeps both (``StepStat.abandoned``), and ``planner_for``
learns them back as the median of the latest ratios per key
(``CostModel.learn``): bounded, and robust to one odd step.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence

from subzero.query.methods import Method, Reexec, Stored
from subzero.query.planner import ReadBudget, StepInfo, StepStat
from subzero.tuning import (
    CORRECTION_KEEP,
    CORRECTION_RANGE,
    DECISIONS_KEPT,
    MIN_BUDGET_S,
    PLAN_FLOOR_S,
    PLAN_TIE,
)

from .costmodel import FEATURES, CostModel, correction_key, method_family, own_seconds, read_ratio
from .stats import for_run


class QueryPlanner:
    """The executor's planner (``Run.trace(planner=...)``) for one run; implements
    :class:`subzero.query.planner.Planner`."""

    def __init__(self, model: CostModel, min_budget_s: float = MIN_BUDGET_S,
                 floor_s: float = PLAN_FLOOR_S, tie: float = PLAN_TIE):
        self.model = model
        self.min_budget_s = min_budget_s
        self.floor_s = floor_s
        self.tie = tie
        # the latest steps' priced methods, for inspection
        self.decisions: deque[tuple[str, list[tuple[str, float]]]] = deque(maxlen=DECISIONS_KEPT)
        # step -> what the planner was told of it (the share of its operator's tiles a
        # re-execution runs, as planned, is asked of it only when a re-execution ran)
        self._steps: dict[tuple, StepInfo] = {}

    def _price(self, step: StepInfo, method: Method, n_out: float) -> float | None:
        # the share of tiles prices re-execution alone: worked out only for it
        return self.model.cost(step.op, method, step.input, step.backward, step.cells_in, n_out,
                               loaded=step.loaded, blocks=step.blocks_in,
                               tiles=step.tiles if isinstance(method, Reexec) else 1.0,
                               runs=step.runs_in)

    def _high(self, step: StepInfo, method: Method, cost: float, n_out: float) -> float:
        """The pessimistic price of a method already priced at ``cost``."""
        m = method.strategy if isinstance(method, Stored) else method.family
        return cost * self.model.high_factor(step.op, m, step.input, step.backward,
                                             step.cells_in, n_out)

    def plan(self, step: StepInfo,
             methods: Sequence[Method]) -> tuple[Sequence[Method], ReadBudget | None]:
        """Methods cheapest first, and when reading stored lineage first should switch to
        re-execution (None: never)."""
        n_out = self.model.predict_out(step.op, step.input, step.backward, step.cells_in)
        self._steps[(step.op, step.input, step.backward)] = step
        first = methods[0] if methods else None
        if first is not None and not isinstance(first, Reexec):
            # a read or mapping priced under floor_s runs as the simple rule says: another
            # method could save at most what it costs -- in expectation its price (its
            # pessimistic one is for when to give a read up) -- less than pricing them all
            cost = self._price(step, first, n_out)
            if cost is not None and cost < self.floor_s:
                # and it is not timed: it would be given up only past its pessimistic
                # price and MIN_BUDGET_S, for a re-execution of milliseconds at least, and
                # pricing that re-execution, with the timer around the read, cost a third
                # of such a step in a fresh process
                self.decisions.append((step.op, [(first.name, cost)]))
                return methods, None
        priced: list[tuple[float, int, Method]] = []
        for k, m in enumerate(methods):
            c = self._price(step, m, n_out)
            if c is None:                       # no statistics: keep the simple rule
                return methods, None
            priced.append((c, k, m))
        priced.sort(key=lambda t: (t[0], t[1]))
        # among methods priced within floor_s of the cheapest the simple rule's order
        # decides: below that the model's error, not the method, does (at genomics 1x a
        # scan of the other index priced 0.23 ms against a lookup's 0.60 took 0.80 ms;
        # with the rule's first priced out by the R-tree's import, a Pay scan priced 0.28
        # ms against a FullOne lookup's 0.47 took 3.7 ms)
        rule = min((t for t in priced if t[0] <= priced[0][0] + self.floor_s),
                   key=lambda t: t[1])
        # the operator's defaults (a plan keeps them where it can) are displaced only by a
        # method priced under them by more than PLAN_TIE: one priced a little under them
        # is as likely slower, and a query under a plan slower than under the defaults is
        # what a plan must not be (genomics 100x: BQ0's extract step took a scan priced
        # about as the backward index it ran on under the defaults: 1.28x their time)
        info = self.model.stats.ops.get(step.op)
        defaults = info.defaults if info is not None else ()
        own = [t for t in priced if isinstance(t[2], Stored) and str(t[2].strategy) in defaults]
        if own and rule not in own:
            mine = min(own, key=lambda t: t[1])
            if mine[0] <= rule[0] * self.tie:
                rule = mine
        priced.sort(key=lambda t: t is not rule)
        self.decisions.append((step.op, [(m.name, c) for c, _, m in priced]))
        order = [m for _, _, m in priced]
        reexec = next(((c, m) for c, _, m in priced if isinstance(m, Reexec)), None)
        first_cost, _, first = priced[0]
        if not isinstance(first, Stored) or reexec is None:
            return order, None
        return order, self._budget(step, self._high(step, first, first_cost, n_out),
                                   reexec[1], reexec[0], n_out)

    def _budget(self, step: StepInfo, high: float, reexec: Method, reexec_cost: float,
                n_out: float) -> ReadBudget:
        """When a read whose pessimistic price is ``high`` is given up for ``reexec``."""
        return ReadBudget(after=max(high, self.min_budget_s),
                          reexec=self._high(step, reexec, reexec_cost, n_out))

    def observe(self, st: StepStat) -> None:
        """Correct the model from what a step's own work took (CPU seconds); a switched
        step corrects its abandoned read and its re-execution apart."""
        backward = st.direction == "backward"
        info = self._steps.pop((st.op, st.input, backward), None)
        if st.cold:          # cold caches: what the method costs warm is not what it took
            return
        own = own_seconds(st.cpu, st.seconds)
        if st.abandoned:
            self._learn(st, st.abandoned, backward, 1.0, read=(st.abandoned_s, st.done))
            own = max(own - st.abandoned_s, 0.0)
        fam = method_family(st.method)
        if own > 0:
            tiles = info.tiles if fam == "reexec" and info is not None else 1.0
            self._learn(st, st.method if fam == "stored" else fam, backward, tiles, own=own)

    def _learn(self, st: StepStat, method, backward: bool, tiles: float, own: float = 0.0,
               read: tuple[float, float] | None = None) -> None:
        """Move the correction of (operator, input, method) toward measured / predicted
        (``own`` seconds, or for an abandoned ``read`` its (CPU seconds, share done):
        ``read_ratio``), by CORRECTION_KEEP, within CORRECTION_RANGE."""
        corr = self.model.corrections
        key = (st.op, st.input, correction_key(method, backward))
        old = corr.pop(key, None)
        pred = self.model.cost(st.op, method, st.input, backward, st.cells_in, st.cells_out,
                               loaded=True, blocks=st.blocks_in, runs=st.runs_in, tiles=tiles,
                               fresh=False)
        if old is not None:
            corr[key] = old
        if not pred:
            return
        lo, hi = CORRECTION_RANGE
        r, floor = read_ratio(*read, pred) if read is not None else (own / pred, 0.0)
        if r is None:                     # only a floor: what it cost at least
            new = max(1.0 if old is None else old, floor)
        else:
            r = min(hi, max(lo, r))
            new = r if old is None else CORRECTION_KEEP * old + (1 - CORRECTION_KEEP) * r
        corr[key] = min(hi, max(lo, new, floor))


def planner_for(run, calibration: dict | None = None) -> QueryPlanner | None:
    """A planner for ``run`` from the store's calibration of this host and the run's
    statistics; None when the machine was never calibrated (the executor then uses
    its simple rule)."""
    store = run.store
    cal = calibration or store.catalog.latest_calibration(os.uname().nodename)
    if cal is None or cal.get("features") != {f: list(v) for f, v in FEATURES.items()}:
        return None                           # never calibrated, or for another cost model
    stats = for_run(store, run)
    if stats is None:
        return None
    model = CostModel(cal, stats)
    model.prepare(run.executor().v.strategies)
    same = {r.id for r in store.catalog.runs()
            if r.workflow == run.row.workflow and r.params == run.row.params}
    steps = [s for s in store.catalog.trace_steps() if s["run_id"] in same]
    model.learn(steps)
    return QueryPlanner(model)
