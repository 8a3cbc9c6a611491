"""The local engine: runs a workflow's operators in-process on numpy (or
xarray) values held in memory, capturing lineage as each operator runs.

Only what is specific to running in-process is here; the loop over operators
is :func:`subzero.engines.driver.run_workflow`.  It works on plain data and
the array store it is handed, so an instance-parallel run can drive it inside
a Spark task.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from subzero.capture.runner import run_operator, shape_of
from subzero.engines.base import StepResult
from subzero.engines.progress import Progress
from subzero.model.strategy import Strategy
from subzero.model.workflow import Step, Workflow
from subzero.storage.arrays import ArrayStore


class LocalEngine:
    """Operators run one after another in this process; every array stays in memory
    for the run (the next operator reads it from there, not from the store)."""

    name = "local"

    def __init__(self, arrays: ArrayStore):
        self.arrays = arrays
        self.values: dict[str, Any] = {}

    def load_inputs(self, wf: Workflow, values: Mapping[str, Any]) -> None:
        for name, v in values.items():
            self.values[name] = v if isinstance(v, xr.DataArray) else np.asarray(v)
            self.arrays.write(name, self.values[name])

    def run_step(self, name: str, step: Step, strategies: tuple[Strategy, ...], capture: bool,
                 progress: Progress) -> StepResult:
        ins = [self.values[a] for a in step.inputs]
        t0 = time.perf_counter()
        out, full, pay, ctx = run_operator(name, step.operator, ins, strategies, capture)
        run_s = time.perf_counter() - t0
        arr = out.data if isinstance(out, xr.DataArray) else out
        self.arrays.write(name, out)
        self.values[name] = out
        return StepResult(shape_of(out), str(arr.dtype), int(arr.nbytes),
                          [shape_of(x) for x in ins], full, pay, run_s, ctx.lwrite_seconds,
                          inputs=ins, output=out)

    def close(self) -> None:
        self.values.clear()
