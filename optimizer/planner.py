"""The query-time planner: per trace step, price every available method with
the cost model and current statistics, run the cheapest first, and give up on
stored lineage for re-execution only when the read has plainly outrun what
the model could have got wrong.

Every prediction carries the error the calibration measured for steps of its
kind and size (``CostModel.margin``: the 90th percentile of measured /
predicted, wider beyond the largest calibrated step).  A read whose pessimistic
price is at most a small share of re-execution (``SAFE_SHARE``) may take that
share: if it overruns it, it is far beyond what the model could have got wrong,
and re-execution costs little more than the time already spent, so the step
stays within about 1 + SAFE_SHARE of black-box.  A read that is not clearly faster than
re-execution is committed to: it is abandoned only after it has taken its own
pessimistic price plus re-execution's, where switching can no longer make the
step much slower than it already is.  That replaces a fixed share of the
predicted re-execution, which at scale switched reads that were merely
mispredicted into re-executions slower than the read would have been.

A read that was abandoned is not retried blindly: its correction is raised to
at least the time it was given over its prediction, so the next step of its kind
prices it as at least that slow.  Observed step times feed corrections per
operator input and method while the process runs.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence

from subzero.model.strategy import Strategy
from subzero.query.methods import Method, Reexec, Stored
from subzero.query.planner import StepInfo, StepStat
from subzero.tuning import CORRECTION_KEEP, CORRECTION_RANGE, DECISIONS_KEPT, MIN_BUDGET_S, SAFE_SHARE

from .costmodel import FEATURES, CostModel, correction_key, method_family
from .stats import for_run


class QueryPlanner:
    """The executor's planner (``Run.trace(planner=...)``) for one run; implements
    :class:`subzero.query.planner.Planner`."""

    def __init__(self, model: CostModel, safe_share: float = SAFE_SHARE,
                 min_budget_s: float = MIN_BUDGET_S):
        self.model = model
        self.safe_share = safe_share
        self.min_budget_s = min_budget_s
        # the latest steps' priced methods, for inspection
        self.decisions: deque[tuple[str, list[tuple[str, float]]]] = deque(maxlen=DECISIONS_KEPT)
        # step -> (the stored method it tries first, its predicted seconds, its budget)
        self._tried: dict[tuple, tuple[Strategy, float, float]] = {}
        # step -> the share of its operator's tiles a re-execution runs (as planned)
        self._tiles: dict[tuple, float] = {}

    def _price(self, step: StepInfo, method: Method, n_out: float) -> float | None:
        return self.model.cost(step.op, method, step.input, step.backward, step.cells_in, n_out,
                               loaded=step.loaded, blocks=step.blocks_in, tiles=step.tiles,
                               runs=step.runs_in)

    def _high(self, step: StepInfo, method: Method, cost: float, n_out: float) -> float:
        """The pessimistic price of a method already priced at ``cost``."""
        m = method.strategy if isinstance(method, Stored) else method.family
        return cost * self.model.high_factor(step.op, m, step.input, step.backward,
                                             step.cells_in, n_out)

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
        priced.sort(key=lambda t: (t[0], t[1]))
        self.decisions.append((step.op, [(m.name, c) for c, _, m in priced]))
        order = [m for _, _, m in priced]
        reexec = next(((c, m) for c, _, m in priced if isinstance(m, Reexec)), None)
        first_cost, _, first = priced[0]
        if not isinstance(first, Stored) or reexec is None:
            return order, None
        hi = self._high(step, first, first_cost, n_out)
        if hi <= self.safe_share * reexec[0]:
            # clearly faster: all the time a switch can afford (the read is then far
            # beyond its own error, and the step within 1 + SAFE_SHARE of re-execution)
            budget = max(self.safe_share * reexec[0], self.min_budget_s)
        else:                                             # not clearly: commit to the read
            budget = max(hi + self._high(step, reexec[1], reexec[0], n_out), self.min_budget_s)
        self._tried[(step.op, step.input, step.backward)] = (first.strategy, first_cost, budget)
        return order, budget

    def observe(self, st: StepStat) -> None:
        """Keep a running correction per operator input and method from what steps took."""
        fam = method_family(st.method)
        method, backward = (st.method if fam == "stored" else fam), st.direction == "backward"
        corr = self.model.corrections
        lo, hi = CORRECTION_RANGE
        tiles = self._tiles.pop((st.op, st.input, backward), 1.0)
        tried = self._tried.pop((st.op, st.input, backward), None)
        if st.note and tried is not None:
            # the read ran out of time: it costs at least its budget, whatever the model
            # said — so the next step of its kind is priced that slow, not retried blindly
            strategy, predicted, budget = tried
            key = (st.op, st.input, correction_key(strategy, backward))
            had = corr.get(key, 1.0)
            if predicted > 0:
                corr[key] = min(hi, max(had, had * budget / predicted))
            return
        key = (st.op, st.input, correction_key(method, backward))
        old = corr.pop(key, None)
        pred = self.model.cost(st.op, method, st.input, backward, st.cells_in, st.cells_out,
                               loaded=True, blocks=st.blocks_in, runs=st.runs_in,
                               tiles=tiles if fam == "reexec" else 1.0)
        if old is not None:
            corr[key] = old
        if not pred or st.seconds <= 0 or st.note:
            return
        ratio = min(hi, max(lo, st.seconds / pred))
        corr[key] = ratio if old is None else CORRECTION_KEEP * old + (1 - CORRECTION_KEEP) * ratio


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
