"""SubZero: fine-grained region lineage for array workflows."""

from subzero.api import Run, RunOptions, Store, fsck, open_store
from subzero.errors import (
    CodeError,
    LineageError,
    OperatorError,
    QueryError,
    SetupError,
    StoreError,
    StrategyError,
    SubZeroError,
    SubZeroWarning,
    UsageError,
    WorkflowError,
)
from subzero.model.cells import window
from subzero.model.modes import Mode
from subzero.model.operator import AGGREGATE, COMPONENTS, ELEMENTWISE, GATHER, GLOBAL, Operator, Tiling, stencil
from subzero.model.statistic import ExactMAD, ExactMedian, Statistic
from subzero.model.strategy import Direction, Encoding, Strategy
from subzero.model.workflow import Node, Workflow, load_workflow
from subzero.query.trace import TraceResult
from subzero.version import __version__

__all__ = ["Operator", "Statistic", "ExactMedian", "ExactMAD", "Workflow", "Mode", "Node", "Tiling", "ELEMENTWISE",
           "AGGREGATE", "COMPONENTS", "GATHER",
           "GLOBAL", "stencil",
           "Store", "Run", "RunOptions", "open_store", "fsck", "load_workflow", "TraceResult", "Strategy",
           "Direction",
           "Encoding", "window", "SubZeroWarning",
           "SubZeroError", "WorkflowError", "OperatorError", "LineageError", "StrategyError",
           "QueryError", "StoreError", "UsageError", "CodeError", "SetupError", "__version__"]
