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

from subzero.errors import BudgetError, OptimizerError

from .budgets import Budgets, parse_factor, parse_size
from .calibration import calibrate, ensure_calibration
from .costmodel import CostModel
from .plan import Plan, load_plan, optimize
from .planner import QueryPlanner, planner_for
from .profile import profile_workflow
from .progress import Progress

__all__ = ["optimize", "Plan", "load_plan", "planner_for", "QueryPlanner", "CostModel",
           "calibrate", "ensure_calibration", "profile_workflow", "Budgets", "parse_size",
           "parse_factor", "OptimizerError", "BudgetError", "Progress"]
