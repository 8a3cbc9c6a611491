"""SubZero: fine-grained region lineage for array workflows."""

from .api import Run, Store, open_store
from .cells import window
from .errors import (LineageError, OperatorError, QueryError, StoreError, StrategyError,
                     SubZeroError, WorkflowError)
from .executor import TraceResult
from .modes import Mode
from .operator import AGGREGATE, ELEMENTWISE, GLOBAL, Operator, Tiling, stencil
from .strategy import Strategy
from .workflow import Node, Workflow, load_workflow

__all__ = ["Operator", "Workflow", "Mode", "Node", "Tiling", "ELEMENTWISE", "AGGREGATE", "GLOBAL", "stencil",
           "Store", "Run", "open_store", "load_workflow", "TraceResult", "Strategy", "window",
           "SubZeroError", "WorkflowError", "OperatorError", "LineageError", "StrategyError",
           "QueryError", "StoreError"]
__version__ = "0.1.0"
