"""What an engine is: the part of running a workflow that differs between
running it in-process and on Spark.

The driver loop (:mod:`subzero.engines.driver`) does everything else — order,
statistics, lineage under the disk budget, timing, progress — so that both
engines, and every instance of an instance-parallel run, follow one loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from subzero.capture.buffer import Pairs
from subzero.engines.progress import Progress
from subzero.model.strategy import Strategy
from subzero.model.workflow import Step, Workflow

if TYPE_CHECKING:
    from subzero.storage.arrays import ArrayStore
    from subzero.storage.lineage import Prepared


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
    #: the digest of the operator's statistic's value (:func:`subzero.model.statistic.value_digest`),
    #: when the engine computed one: a re-run compares its own with it
    statistic: str | None = None
    #: the digest of the file of its statistic's merged states (:mod:`subzero.storage.rounds`)
    rounds: str | None = None
    #: strategy text -> another run's lineage of it to store as this run's (a re-run
    #: keeps its parent's lineage of an operator no change reaches: ``Parent.copies``);
    #: the other strategies are encoded from ``full`` and ``pay``
    copies: dict[str, Any] | None = None
    #: strategy -> its lineage encoded ahead in another process, or None: the run's
    #: own pairs (``full`` / ``pay``) are encoded where that gives none (``Parent.ahead``)
    ahead: Callable[[Strategy], Prepared | None] | None = None


class Engine(Protocol):
    """Runs a workflow's operators over one run's array store, in the order the driver
    loop (:func:`subzero.engines.driver.run_workflow`) gives.

    Four methods every engine has (:meth:`load_inputs` or :meth:`resume`, then
    :meth:`run_step` per operator, then :meth:`close`), and abilities an engine
    declares by overriding the defaults here -- the driver never probes for them:

    * :attr:`concurrent_jobs`: how many independent jobs may run at once (1: one
      after another, on the driver's own thread);
    * :meth:`group`: which operators run as one job (a fused stage);
      :meth:`run_group` runs them;
    * :meth:`waits_for`: whether a group had better wait for a running job;
    * :meth:`cancel`: stop the jobs still running (another one failed);
    * :meth:`bind`: bind stored arrays to their place once they are final;
    * :meth:`array_store`: the run's array store, where the driver's profiling hook
      reads what an operator's array takes on disk.

    An engine subclasses this protocol to take the defaults (as the local engine
    does); the defaults are what an engine without the ability does.
    """

    #: the name the catalog records and ``--engine`` takes ("local", "spark")
    name: str
    #: independent jobs the driver loop runs side by side (1: in sequence)
    concurrent_jobs: int = 1

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

    # -- abilities: the defaults are an engine that runs one operator per job --------
    def group(self, wf: Workflow, pending: list[str]) -> list[str]:
        """The operators to run next as one job; ``pending`` (never empty) is in workflow
        order and its first operator's inputs are stored.  Default: that operator alone."""
        return [pending[0]]

    def run_group(self, wf: Workflow, names: list[str], strategies: Mapping[str, tuple[Strategy, ...]],
                  capture: bool, progress: Progress) -> list[StepResult]:
        """Run a group made by :meth:`group`; one result per operator, in order."""
        return [self.run_step(n, wf.steps[n], strategies[n], capture, progress) for n in names]

    def waits_for(self, wf: Workflow, names: list[str], running: set[str], free: list[str]) -> bool:
        """Whether the group ``names`` had better wait until a job now running (of the
        operators ``running``) ends, because it would then join a bigger group.  Asked
        only while jobs run (``concurrent_jobs`` > 1).  Default: never."""
        return False

    def cancel(self) -> None:
        """Stop every job still running: another job of the run failed.  Default:
        nothing runs on its own, so nothing to stop."""
        return None

    def bind(self, names: list[str]) -> None:
        """The arrays ``names`` are final (the run's inputs once stored, an operator's
        output once its step is over): bind their chunks to their place in the run's
        array store (:meth:`subzero.storage.arrays.ArrayStore.bind`).  The driver loop
        calls it before the journal says they are done.  Default: the engine stores no
        arrays, so nothing to bind."""
        return None

    def array_store(self) -> ArrayStore | None:
        """The run's array store, holding each operator's array once its step is over
        (until the run drops what it does not keep).  Default: None (an engine whose
        arrays the profiling hook does not see)."""
        return None
