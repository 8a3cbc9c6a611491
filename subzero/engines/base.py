"""What an engine is: the part of running a workflow that differs between
running it in-process and on Spark.

The driver loop (:mod:`subzero.engines.driver`) does everything else — order,
statistics, lineage under the disk budget, timing, progress — so that both
engines, and every instance of an instance-parallel run, follow one loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from subzero.capture.buffer import Pairs
from subzero.engines.progress import Progress
from subzero.model.strategy import Strategy
from subzero.model.workflow import Step, Workflow


@dataclass
class StepResult:
    """One operator's run as an engine reports it: plain data.  The output array
    itself is already in the run's array store."""

    out_shape: tuple[int, ...]
    dtype: str
    nbytes: int
    in_shapes: list[tuple[int, ...]]
    full: Pairs | None              # captured Full pairs (None: none asked for)
    pay: Pairs | None               # captured payload pairs
    run_s: float                    # operator wall time, lwrite calls included
    lwrite_s: float                 # time inside lwrite
    tiles: int = 1                  # tasks the operator ran as
    #: the lineage the tasks wrote as shards themselves (Spark), for the driver to
    #: commit; None when the pairs are in ``full`` and ``pay``
    shards: list | None = None
    #: pairs captured (None: count ``full`` and ``pay``)
    pairs: int | None = None
    #: the input and output values, where the engine holds them in memory (the local
    #: engine); the optimizer's profiling hook needs them
    inputs: list | None = None
    output: Any = None


class Engine(Protocol):
    """Runs a workflow's operators, one :meth:`run_step` at a time, in the order the
    driver gives, over one run's array store."""

    #: "local" or "spark", as the catalog records it
    name: str

    def load_inputs(self, wf: Workflow, values: Mapping[str, Any]) -> None:
        """Store the run's input arrays, where the steps will read them."""
        ...

    def resume(self, wf: Workflow, stored: list[str]) -> None:
        """Continue a run whose inputs and first operators (``stored``, in the order they
        ran) are already in the array store (instead of :meth:`load_inputs`)."""
        ...

    def run_step(self, name: str, step: Step, strategies: tuple[Strategy, ...], capture: bool,
                 progress: Progress) -> StepResult:
        """Run one operator, store its output array, and capture its lineage in memory
        (``capture``); report tile tasks to ``progress`` as they finish."""
        ...

    def close(self) -> None:
        """The run is over (complete or failed); release what the engine holds."""
        ...
