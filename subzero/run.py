"""A complete run: its arrays, statistics, grids and lineage queries."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from numpy.typing import ArrayLike

from subzero.coords import cells_at as sky_cells
from subzero.coords import cells_for, derive_grids, stored_grid, with_grid
from subzero.errors import QueryError, SubZeroError, UntrustedRun
from subzero.model.cells import parse_spec
from subzero.model.cellset import CellSet
from subzero.model.grid import Grid
from subzero.model.strategy import parse
from subzero.model.workflow import Workflow
from subzero.query.executor import Executor, RunView, TraceResult
from subzero.query.planner import Planner, StepStat
from subzero.runs.record import Steering
from subzero.storage.arrays import ArrayStore
from subzero.storage.catalog import Catalog, RunRow
from subzero.storage.trust import untrusted_message

if TYPE_CHECKING:
    from pathlib import Path

    import xarray as xr
    from astropy.coordinates import SkyCoord
    from astropy.units import Quantity

    from subzero.storage.trust import Verdict


class RunStore(Protocol):
    """What a run reads of the store it belongs to (:class:`subzero.store.Store` is
    one): its catalog and folders, whether the run's code may be loaded, its
    operators, and the trace log."""

    path: Path
    catalog: Catalog

    def run_dir(self, run_id: int) -> Path: ...

    def verdict(self, run: str | int | RunRow = "latest") -> Verdict: ...

    def workflow_of(self, row: RunRow, verdict: Verdict | None = None) -> Workflow: ...

    def steering(self, row: RunRow, verdict: Verdict | None = None) -> Steering: ...

    def log_trace(self, run_id: int, start: str, cells: Any, to: str | None,
                  path: list[tuple[str, int]] | None, shortcut: bool, res: TraceResult) -> None: ...


class Run:
    """A complete run: its arrays, statistics, and lineage queries."""

    def __init__(self, store: RunStore, row: RunRow):
        self.store, self.row = store, row
        self.id = row.id
        self.dir = store.run_dir(row.id)
        self._store_of_arrays: ArrayStore | None = None
        self._executor: Executor | None = None
        self._grids: Callable[[str], Grid | None] | None = None
        self._steer: Steering | None = None
        self._verdict: Verdict | None = None
        self.planner: Planner | None = None      # query-time planner used by trace() (optimizer.planner_for)

    def __repr__(self) -> str:
        return f"Run({self.id}, workflow={self.row.workflow!r}, status={self.row.status!r})"

    def close(self) -> None:
        """Release the run's open lineage store (a later trace reopens it)."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None
        self._steer = None                 # verified again on next use (trust may change it)
        self._verdict = None
        self._store_of_arrays = None

    @property
    def uid(self) -> str | None:
        """The run's uid, what its arrays and lineage must be bound to: from its signed
        record when that verifies (an edited catalog row must not unbind it), else its
        catalog row's."""
        steer = self.steering()
        if steer.record is not None and steer.verified:
            return steer.record["run"].get("uid")
        return self.row.uid

    @property
    def _arrays(self) -> ArrayStore:
        if self._store_of_arrays is None:
            # a signed record names each input's content: a reference to the store's copy
            # of another content is refused (an unsigned run's references are checked
            # against their own seal, run and store only)
            steer = self.steering()
            digests = {a["name"]: a.get("digest") for a in steer.record["arrays"]
                       if a.get("kind") == "input"} \
                if steer.record is not None and steer.verified else None
            self._store_of_arrays = ArrayStore(self.dir, run_uid=self.uid, inputs=digests,
                                               recompute=self.recompute,
                                               recompute_chunk=self.recompute_chunk)
        return self._store_of_arrays

    def recompute(self, name: str) -> np.ndarray:
        """The values of an array this run did not keep (its ``--keep`` policy): its
        operator run again, whole, on its inputs as it read them (read back, or made
        again in turn).  The array store checks them chunk by chunk against the SHA-256
        recorded when the array was dropped.  Needs the run's code, so a trusted run."""
        self._require_trust(name)
        from subzero.engines.remake import remaker
        return remaker(self.workflow, self._arrays.read_value)(name)

    def recompute_chunk(self, name: str, shape: tuple[int, ...], chunks: tuple[int, ...],
                        idx: tuple[int, ...]) -> np.ndarray | None:
        """One chunk of an array this run did not keep, made again from its inputs'
        regions where its operator runs per tile (else None: :meth:`recompute` makes the
        whole array); checked as :meth:`recompute`'s values are."""
        self._require_trust(name)
        from subzero.engines.remake import chunk_remaker
        return chunk_remaker(self.workflow, self._arrays.describe,
                             self._arrays.read_region)(name, shape, chunks, idx)

    def _require_trust(self, name: str) -> None:
        if not self.trusted:
            raise UntrustedRun(f"array {name!r} of run {self.id} was not kept, and making it "
                               f"again runs the run's code: "
                               + untrusted_message(self.store.path, self.id, self.verdict()))

    def steering(self) -> Steering:
        """What steers this run's traces: its signed record when that verifies, else its
        catalog rows (see :meth:`subzero.store.Store.steering`); checked once per open."""
        if self._steer is None:
            self._steer = self.store.steering(self.row, self.verdict())
        return self._steer

    def verdict(self) -> Verdict:
        """Whether this run's code may be loaded (:meth:`subzero.store.Store.verdict`):
        its signature checked once per open, as its steering is (a run is closed when
        it is trusted, so the next use checks again)."""
        if self._verdict is None:
            self._verdict = self.store.verdict(self.row)
        return self._verdict

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def workflow(self) -> Workflow:
        return self.store.workflow_of(self.row, self.verdict())

    @property
    def trusted(self) -> bool:
        """Whether this run's code may be loaded (its signature verifies with this user's
        key); an untrusted run answers only the trace steps its stored lineage answers."""
        return self.verdict().trusted

    def ops(self) -> list[dict]:
        return self.steering().ops

    def rerun_info(self) -> dict[str, Any] | None:
        """For a re-run (:meth:`subzero.store.Store.rerun`): its parent run, the inputs it
        corrected and, per operator, how it was made (``kept``: the parent's; ``tiles``:
        the tiles a change reached ran again; ``whole``: run whole), the tiles that ran,
        where its output changed and whether its statistic did.  From the run's signed
        record when it verifies, else its catalog row; None for a run that is no re-run."""
        steer = self.steering()
        if steer.record is not None and steer.verified:
            return steer.record.get("rerun")
        return self.store.catalog.rerun_of(self.id)

    def strategy_stats(self) -> list[dict]:
        return self.store.catalog.strategy_stats(self.id)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: v["shape"] for k, v in self.steering().arrays.items()}

    def array_names(self) -> list[str]:
        return list(self.shapes())

    def array(self, name: str) -> xr.DataArray:
        """The array, with the labels and sky WCS of its :meth:`grid` (an operator's
        output carries its inputs' coordinates although the operator returned numpy)."""
        self._known(name)
        return with_grid(self._arrays.read(name), self.grid(name))

    def _known(self, name: str) -> None:
        if name not in self.shapes():
            raise QueryError(f"unknown array {name!r} in run {self.id}; its arrays are: "
                             f"{', '.join(self.shapes())}")

    def grid(self, name: str) -> Grid | None:
        """Where array ``name``'s cells sit in labelled axes and on the sky: the labels
        and FITS WCS it was stored with, else what its operator's ``output_grid`` makes
        of its inputs' grids.  Derived grids need the run's code, so an untrusted run
        has grids for its stored arrays only."""
        self._known(name)
        if self._grids is None:
            ops = self.ops()
            operator = None
            if self.trusted:
                steps = self.workflow.steps
                operator = lambda n: steps[n].operator  # noqa: E731 - looked up lazily
            self._grids = derive_grids(
                {o["name"]: o["inputs"] for o in ops}, self.shapes(),
                lambda n: stored_grid(*self._arrays.grid_parts(n)), operator)
        return self._grids(name)

    def unlabelled(self) -> list[str]:
        """Operators whose output has no coordinates although an input has labelled axes
        (its shape matches none of theirs: see :meth:`Operator.output_grid`), as
        ``"name (Class)"``: what a run warns of once, when it is made."""
        out = []
        for o in self.ops():
            try:
                if self.grid(o["name"]) is not None:
                    continue
                if any((g := self.grid(i)) is not None and g.coords for i in o["inputs"]):
                    out.append(f"{o['name']} ({o['class']})")
            except SubZeroError:
                continue            # a grid that cannot be made: said where it is used
        return out

    def trace_reach(self, start: str, cells: ArrayLike, direction: str = "backward", shortcut: bool = True,
                    direct: dict[str, CellSet] | None = None,
                    ) -> tuple[dict[str, CellSet], list[StepStat], float]:
        """Trace ``cells`` of ``start`` to every array reachable ``direction`` (backward:
        upstream) at once: ``({array: CellSet}, steps, seconds)``, each array's cells
        equal to ``trace(start, cells, to=array)``.  Not recorded in the trace log.
        ``direct``, when given, is filled with each array's cells reached without a step
        through an all-to-all input (:attr:`TraceResult.direct`)."""
        if direction not in ("backward", "forward"):
            raise QueryError(f"direction must be 'backward' or 'forward', not {direction!r}")
        return self.executor().trace_reach(start, self._spec(start, cells),
                                           direction == "backward", shortcut, self.planner,
                                           direct)

    def select(self, start: str, cells: ArrayLike | str | None = None, *,
               sky: str | Sequence[float | str] | SkyCoord | None = None,
               radius: str | float | Quantity | None = None,
               sel: Mapping[str, Any] | None = None) -> Any:
        """The cells of array ``start`` a query names: ``cells`` (an array of cells, or
        the ``--cells`` syntax), or ``sky``/``radius`` or ``sel`` (:meth:`cells_at`)."""
        if sky is not None or sel is not None:
            if cells is not None:
                raise QueryError("give cells, or sky=/sel=, not both")
            return self.cells_at(start, sky=sky, radius=radius, sel=sel)
        if cells is None:
            raise QueryError(f"a query from {start!r} needs cells (or sky=... / sel=...)")
        return self._spec(start, cells)

    def _spec(self, start: str, cells: Any) -> Any:
        """Cells given in the ``--cells`` syntax (a string) as an array: boxes are
        deduplicated as they are expanded, within a limit
        (:func:`~subzero.model.cells.parse_spec`); other cells as given."""
        if not isinstance(cells, str):
            return cells
        self._known(start)
        return parse_spec(cells, self.shapes()[start], start)

    def read_region(self, name: str, region: tuple[slice, ...]) -> np.ndarray:
        """A region of an array's cells (checksummed), without reading the rest."""
        self._known(name)
        return self._arrays.read_region(name, region)

    def array_info(self, name: str) -> tuple[tuple[int, ...], np.dtype, tuple[str, ...]]:
        """An array's shape, dtype and dims (its grid's where it has one), without its cells."""
        self._known(name)
        shape, dtype, _ = self._arrays.describe(name)
        g = self.grid(name)
        dims = g.dims if g is not None else self._arrays.grid_parts(name)[0]
        return shape, dtype, dims

    def cells_at(self, array: str, sky: str | Sequence[float | str] | SkyCoord | None = None,
                 radius: str | float | Quantity | None = None, sel: Mapping[str, Any] | None = None,
                 ) -> np.ndarray:
        """Cells of ``array`` named in the user's terms: ``sky=(ra, dec)`` (degrees, or
        ``"23:47:09.8,-2:17:37"``, or a SkyCoord) with an optional ``radius``
        (``"2arcsec"``, an astropy angle, or arcseconds), or ``sel={"time": "2020-01-03",
        "lat": slice(10, 20)}`` (xarray ``.sel`` rules; nearest label on numeric and time
        axes)."""
        self._known(array)
        if (sky is None) == (sel is None):
            raise QueryError("give exactly one of sky=... or sel=...")
        shape = self.shapes()[array]
        if sky is not None:
            return sky_cells(self.grid(array), shape, sky, radius, array)
        if radius is not None:
            raise QueryError("radius goes with sky=..., not with sel=...")
        return cells_for(self.grid(array), shape, dict(sel or {}), array)

    def lineage_bytes(self) -> int:
        return sum(s["bytes"] for s in self.strategy_stats())

    def executor(self) -> Executor:
        if self._executor is None:
            ops = self.ops()
            verdict = self.verdict()
            view = RunView(
                run_id=self.id, workflow=lambda: self.workflow,
                strategies={o["name"]: parse("+".join(o["strategies"])) for o in ops},
                shapes=self.shapes(), inputs_of={o["name"]: o["inputs"] for o in ops},
                arrays=self._arrays, lineage_path=self.dir / "lineage", run_uid=self.uid,
                statistics={o["name"]: o["statistic"] for o in ops if o.get("statistic")},
                rounds={o["name"]: o["rounds"] for o in ops if o.get("rounds")},
                untrusted=None if verdict.trusted else
                untrusted_message(self.store.path, self.id, verdict))
            self._executor = Executor(view)
        return self._executor

    def _raise_if_deleted(self, error: SubZeroError) -> None:
        """A read that failed because ``subzero gc`` deleted this run while it was open
        is said as that (the missing file is only its symptom)."""
        try:
            row = self.store.catalog.get_run(self.id)
        except SubZeroError:
            return
        gone = row.status == "deleted" or not self.dir.is_dir()
        if gone:
            how = row.error if row.status == "deleted" and row.error else "deleted"
            raise QueryError(f"run {self.id} was {how} while this trace read it; its arrays "
                             f"and lineage are gone") from error

    def trace(self, start: str, cells: ArrayLike | None = None, to: str | None = None,
              path: list[tuple[str, int]] | None = None, prefer: str | None = None,
              shortcut: bool = True, record: bool = True, planner: Planner | None = None, *,
              sky: str | Sequence[float | str] | SkyCoord | None = None,
              radius: str | float | Quantity | None = None,
              sel: Mapping[str, Any] | None = None,
              exclude_all_to_all: bool = False) -> TraceResult:
        """Trace ``cells`` of array ``start`` to array ``to`` (every DAG path,
        results united) or along ``path`` = [(operator, input index), ...].

        The result explains itself (:meth:`~TraceResult.explain`, :meth:`~TraceResult.parts`):
        which cells came only through steps whose operator reads an input all-to-all
        (an overscan mean, a global median: every cell of that input), and which steps
        widened the answer most.  ``exclude_all_to_all`` leaves those steps out.

        ``cells`` is an ``(N, ndim)`` array of cells (or one tuple), or a string in the
        ``--cells`` syntax (``"10:20,30:40;12,40"``: boxes and cells, each counted once).
        Instead of cells, name them by ``sky``/``radius`` or ``sel`` as in
        :meth:`cells_at`; the result's :meth:`~TraceResult.sky_region` and
        :meth:`~TraceResult.label_region` say where the answer lies in those terms.

        ``planner`` (default: ``self.planner``, e.g. ``optimizer.planner_for(run)``)
        prices each step's methods with a cost model; without one each step
        follows the simple rule (stored in the step's direction, map, stored the
        other way, re-execution).  ``record`` keeps the trace in the catalog's
        trace log, from which the optimizer derives workloads."""
        try:
            cells = self.select(start, cells, sky=sky, radius=radius, sel=sel)
            res = self.executor().trace(start, cells, to=to, path=path, prefer=prefer,
                                        shortcut=shortcut, grids=self.grid,
                                        planner=planner if planner is not None else self.planner,
                                        exclude_all_to_all=exclude_all_to_all)
        except SubZeroError as e:
            self._raise_if_deleted(e)
            raise
        if record:
            self.store.log_trace(self.id, start, cells, to, path, shortcut, res)
        return res
