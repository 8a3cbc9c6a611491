"""SubZero's storage-budget optimizer: statistics -> cost model -> GLPK integer
program -> storage plan, and the query-time planner.

    import subzero
    from subzero import optimizer
    store = subzero.open_store(".subzero")
    plan = optimizer.optimize(store, "workflows/genomics.py", max_disk="20MB")
    print(plan.table())
    run = store.run("workflows/genomics.py", plan=plan.name)
    run.planner = optimizer.planner_for(run)     # per-step cost-based method choice
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from subzero.lazy import attach

if TYPE_CHECKING:
    from subzero.errors import BudgetError, OptimizerError

    from .budgets import Budgets, parse_factor, parse_size
    from .calibration import calibrate, ensure_calibration
    from .costmodel import CostModel
    from .plan import Plan, load_plan, optimize
    from .planner import QueryPlanner, planner_for
    from .profile import profile_workflow
    from .progress import Progress

#: where each public name lives: loaded on first use (PEP 562), so that a trace that
#: only asks for the query-time planner does not import scipy (the calibration) or
#: GLPK (the integer program)
_HOME: dict[str, str] = {
    "BudgetError": "subzero.errors", "OptimizerError": "subzero.errors",
    "Budgets": ".budgets", "parse_factor": ".budgets", "parse_size": ".budgets",
    "calibrate": ".calibration", "ensure_calibration": ".calibration",
    "CostModel": ".costmodel",
    "Plan": ".plan", "load_plan": ".plan", "optimize": ".plan",
    "QueryPlanner": ".planner", "planner_for": ".planner",
    "profile_workflow": ".profile",
    "Progress": ".progress",
}

__all__ = ["optimize", "Plan", "load_plan", "planner_for", "QueryPlanner", "CostModel",
           "calibrate", "ensure_calibration", "profile_workflow", "Budgets", "parse_size",
           "parse_factor", "OptimizerError", "BudgetError", "Progress"]

__getattr__, __dir__ = attach(__name__, _HOME, __all__)
