"""How a run runs, as one value: what the API's keyword arguments and the CLI's
flags become before anything starts (as a trace's options travel as
:class:`subzero.query.trace.TraceOptions`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from subzero.engines.choice import EngineRequest
from subzero.engines.driver import Profiler
from subzero.engines.progress import Progress
from subzero.errors import UsageError
from subzero.runs.keep import DEFAULT_KEEP, check_policy
from subzero.storage.arrays import DEFAULT_TILE

#: the largest tile size per axis (`tile`): far beyond any array's side, and small
#: enough that the tile's arithmetic fits in 64 bits in every dimension up to 2
MAX_TILE = 2**31 - 1


@dataclass(frozen=True)
class RunOptions:
    """Everything about a run but its workflow and inputs.

    What is stored: ``strategies`` maps operator names to strategy specs
    (``"full"``, ``"comp:payone:backward"``, a :class:`~subzero.Strategy` or a
    tuple of them); or ``plan`` (a plan's name, saved by ``subzero optimize``, or
    its dict) chooses them all and brings its disk budget; ``max_disk`` (bytes, or
    a size such as ``"20MB"``) and ``max_runtime`` (a factor over the no-lineage
    runtime) without a plan optimize first, for the query ``workload``.
    ``capture=False`` stores no lineage at all (a baseline).

    Where it runs: ``engine`` ("local", "spark" or "auto"), a SparkSession
    ``spark`` you have, or one made from ``master`` and ``conf``; ``tile`` is the
    tile size per axis.  ``params`` are keyword arguments for the workflow
    module's ``workflow()``.

    What it keeps: ``keep`` ("auto", "outputs" or "all": :mod:`subzero.runs.keep`)
    says which intermediate arrays are kept on disk (the others are made again,
    checked, when read); ``pins`` are arrays kept whatever the policy.

    What the user sees: ``progress`` (None: bars on a terminal; True, False, or a
    :class:`~subzero.engines.progress.Progress`), ``log`` (what the Spark engine
    does, one line each), ``announce`` (the engine chosen, one line), ``on_plan``
    (the plan a budget run chose, before it runs: the CLI prints it).
    ``profiler`` is the optimizer's profiling hook (in-process engine only).
    """

    strategies: Mapping[str, Any] | None = None
    params: Mapping[str, Any] | None = None
    capture: bool = True
    tile: int | None = None
    engine: str = "local"
    spark: Any = None
    master: str | None = None
    conf: Mapping[str, str] | None = None
    plan: str | Mapping[str, Any] | None = None
    max_disk: int | str | None = None
    max_runtime: float | str | None = None
    workload: Any = None
    progress: bool | Progress | None = None
    log: Callable[[str], None] | None = None
    announce: Callable[[str], None] | None = None
    profiler: Profiler | None = None
    keep: str = DEFAULT_KEEP
    pins: tuple[str, ...] = ()
    #: told the plan a budget run (``max_disk`` / ``max_runtime``) chose, before it runs
    on_plan: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        check_policy(self.keep, self.pins)
        object.__setattr__(self, "pins", tuple(self.pins))
        t = self.tile
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= MAX_TILE):
            raise UsageError(f"`tile` must be a whole number of cells from 1 to {MAX_TILE}, "
                             f"not {t!r}")

    @classmethod
    def of(cls, options: RunOptions | None = None, **given: Any) -> RunOptions:
        """``options`` with the keyword arguments ``given`` on top (a name that is not an
        option is a one-line error naming it)."""
        names = {f.name for f in fields(cls)}
        unknown = [k for k in given if k not in names]
        if unknown:
            raise UsageError(f"unknown run option `{unknown[0]}`; the options are: "
                             f"{', '.join(sorted(names))}")
        return replace(options if options is not None else cls(), **given)

    @property
    def tile_size(self) -> int:
        return self.tile or DEFAULT_TILE

    @property
    def budgeted(self) -> bool:
        """Optimize for a budget before running (no plan given)."""
        return self.plan is None and (self.max_disk is not None or self.max_runtime is not None)

    def engine_request(self) -> EngineRequest:
        return EngineRequest(self.engine, self.master, dict(self.conf or {}), self.spark)
