"""The query-time planner: per trace step, price every available method with
the cost model and current statistics, run the cheapest first, and give up on
stored lineage for re-execution once reading it has cost more than
re-executing is predicted to.

That switch bounds the damage of a wrong guess.  A stored read may take half
the predicted re-execution, or twice its own predicted cost when that is more
(never more than the predicted re-execution), so a query stays within about
1.5x of black-box when stored lineage is useless for it (a forward-only index
asked backward, say; the paper allowed 2x), and a read predicted close to
re-execution is not abandoned over a small misprediction.  A read that timed
out is skipped for the next few steps of the same kind (re-execution goes
first), then tried again: the timeout may have been a stall of the machine.
Observed step times feed back into corrections per operator input and method
while the process runs.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence

from subzero.model.strategy import Strategy
from subzero.query.methods import Method, Reexec, Stored
from subzero.query.planner import StepInfo, StepStat
from subzero.tuning import MIN_BUDGET_S, STORED_SLACK, SWITCH_FACTOR, TOO_SLOW_STEPS

from .costmodel import CORRECTION_RANGE, FEATURES, CostModel, correction_key, method_family
from .stats import for_run


class QueryPlanner:
    """The executor's planner (``Run.trace(planner=...)``) for one run; implements
    :class:`subzero.query.planner.Planner`."""

    def __init__(self, model: CostModel, switch_factor: float = SWITCH_FACTOR,
                 min_budget_s: float = MIN_BUDGET_S):
        self.model = model
        self.switch_factor = switch_factor
        self.min_budget_s = min_budget_s
        # the latest steps' priced methods, for inspection
        self.decisions: deque[tuple[str, list[tuple[str, float]]]] = deque(maxlen=100)
        self._tried: dict[tuple, Strategy] = {}    # step -> the stored method it tries first
        # (op, input, method) that ran out of time -> steps left before it is tried again
        self._too_slow: dict[tuple, int] = {}
        # step -> the share of its operator's tiles a re-execution runs (as planned)
        self._tiles: dict[tuple, float] = {}

    def _price(self, step: StepInfo, method: Method, n_out: float) -> float | None:
        return self.model.cost(step.op, method, step.input, step.backward, step.cells_in, n_out,
                               loaded=step.loaded, blocks=step.blocks_in, tiles=step.tiles)

    def plan(self, step: StepInfo,
             methods: Sequence[Method]) -> tuple[Sequence[Method], float | None]:
        """Methods cheapest first, and the seconds after which reading stored lineage
        should switch to re-execution (None: never)."""
        n_out = self.model.predict_out(step.op, step.input, step.backward, step.cells_in)
        self._tiles[(step.op, step.input, step.backward)] = step.tiles
        priced: list[tuple[float, int, Method]] = []
        for k, m in enumerate(methods):
            c = self._price(step, m, n_out)
            if c is None:                       # no statistics: keep the simple rule
                return methods, None
            priced.append((c, k, m))
        reexec = next((c for c, _, m in priced if isinstance(m, Reexec)), None)
        if reexec is not None:     # timed out lately: after re-execution for a few steps
            for j, (c, k, m) in enumerate(priced):
                if not isinstance(m, Stored):
                    continue
                key = (step.op, step.input, correction_key(m.strategy, step.backward))
                left = self._too_slow.get(key)
                if left:
                    priced[j] = (max(c, 1.05 * reexec), k, m)
                    if left > 1:
                        self._too_slow[key] = left - 1
                    else:                # then try it again: the timeout may have been a stall
                        del self._too_slow[key]
        priced.sort(key=lambda t: (t[0], t[1]))
        self.decisions.append((step.op, [(m.name, c) for c, _, m in priced]))
        order = [m for _, _, m in priced]
        budget = None
        first = order[0]
        if isinstance(first, Stored) and reexec is not None:
            # the read may take its share of re-execution, or twice its own predicted
            # cost when that is more (a read predicted close to re-execution would
            # otherwise be abandoned by a small misprediction and pay both), never
            # more than the predicted re-execution itself
            budget = max(reexec * self.switch_factor, self.min_budget_s,
                         min(STORED_SLACK * priced[0][0], reexec))
            self._tried[(step.op, step.input, step.backward)] = first.strategy
        return order, budget

    def observe(self, st: StepStat) -> None:
        """Keep a running correction per operator input and method from what steps took."""
        fam = method_family(st.method)
        method, backward = (st.method if fam == "stored" else fam), st.direction == "backward"
        key = (st.op, st.input, correction_key(method, backward))
        corr = self.model.corrections
        old = corr.pop(key, None)
        tiles = self._tiles.pop((st.op, st.input, backward), 1.0)
        pred = self.model.cost(st.op, method, st.input, backward, st.cells_in, st.cells_out,
                               loaded=True, blocks=st.blocks_in,
                               tiles=tiles if fam == "reexec" else 1.0)
        if old is not None:
            corr[key] = old
        tried = self._tried.pop((st.op, st.input, backward), None)
        if st.note and tried is not None:
            # stored lineage ran out of time: a repeated query re-executes at once
            # instead of paying twice
            self._too_slow[(st.op, st.input, correction_key(tried, backward))] = TOO_SLOW_STEPS
            return
        if not pred or st.seconds <= 0 or st.note:
            return
        lo, hi = CORRECTION_RANGE
        ratio = min(hi, max(lo, st.seconds / pred))
        corr[key] = ratio if old is None else 0.7 * old + 0.3 * ratio


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
    same = {r.id for r in store.catalog.runs()
            if r.workflow == run.row.workflow and r.params == run.row.params}
    steps = [s for s in store.catalog.trace_steps() if s["run_id"] in same]
    model.learn(steps)
    return QueryPlanner(model)
