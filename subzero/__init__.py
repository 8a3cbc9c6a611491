"""SubZero: fine-grained region lineage for array workflows.

The names below are loaded when first used (PEP 562), not when ``subzero`` is
imported: ``import subzero`` (and so the ``subzero`` command, which lives in this
package) costs what Python's start-up does, and a command pays only for the
libraries it needs (xarray, scipy, astropy, pyspark, matplotlib stay unloaded by
a trace that does not use them; tests/test_imports.py holds this).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from subzero.lazy import attach
from subzero.version import __version__

if TYPE_CHECKING:
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
    from subzero.model.operator import (
        AGGREGATE,
        COMPONENTS,
        ELEMENTWISE,
        GATHER,
        GLOBAL,
        Operator,
        Tiling,
        stencil,
    )
    from subzero.model.statistic import ExactMAD, ExactMedian, Statistic
    from subzero.model.strategy import Direction, Encoding, Strategy
    from subzero.model.workflow import Node, Workflow, load_workflow
    from subzero.query.trace import TraceResult
    from subzero.run import Run
    from subzero.runs.fsck import fsck
    from subzero.runs.options import RunOptions
    from subzero.store import Store, open_store

#: where each public name lives
_HOME: dict[str, str] = {
    # each from its own module, so that opening a store does not import running
    "Run": "subzero.run", "RunOptions": "subzero.runs.options", "fsck": "subzero.runs.fsck",
    **dict.fromkeys(["Store", "open_store"], "subzero.store"),
    **dict.fromkeys(["CodeError", "LineageError", "OperatorError", "QueryError", "SetupError",
                     "StoreError", "StrategyError", "SubZeroError", "SubZeroWarning",
                     "UsageError", "WorkflowError"], "subzero.errors"),
    "window": "subzero.model.cells",
    "Mode": "subzero.model.modes",
    **dict.fromkeys(["AGGREGATE", "COMPONENTS", "ELEMENTWISE", "GATHER", "GLOBAL", "Operator",
                     "Tiling", "stencil"], "subzero.model.operator"),
    **dict.fromkeys(["ExactMAD", "ExactMedian", "Statistic"], "subzero.model.statistic"),
    **dict.fromkeys(["Direction", "Encoding", "Strategy"], "subzero.model.strategy"),
    **dict.fromkeys(["Node", "Workflow", "load_workflow"], "subzero.model.workflow"),
    "TraceResult": "subzero.query.trace",
}

__all__ = ["Operator", "Statistic", "ExactMedian", "ExactMAD", "Workflow", "Mode", "Node", "Tiling", "ELEMENTWISE",
           "AGGREGATE", "COMPONENTS", "GATHER",
           "GLOBAL", "stencil",
           "Store", "Run", "RunOptions", "open_store", "fsck", "load_workflow", "TraceResult", "Strategy",
           "Direction",
           "Encoding", "window", "SubZeroWarning",
           "SubZeroError", "WorkflowError", "OperatorError", "LineageError", "StrategyError",
           "QueryError", "StoreError", "UsageError", "CodeError", "SetupError", "__version__"]

__getattr__, __dir__ = attach(__name__, _HOME, __all__)
