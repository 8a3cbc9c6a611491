"""A SubZero store: a folder with a catalog and one folder per run.

    import subzero
    store = subzero.open_store(".subzero")
    run = store.run("workflows/example.py", strategies={"smooth": "full"})
    res = run.trace("stars", [(12, 40)], to="raw")

:class:`Store` is a small facade: running goes to :mod:`subzero.runs` (options,
launch, transaction, journal, clean), reading a run to :class:`subzero.run.Run`,
trust to :mod:`subzero.storage.trust`.  A run is atomic: its folder is written
as ``runs/<id>.partial`` and renamed to ``runs/<id>`` only after every array and
all lineage are written; the catalog marks it complete after that.  A failed
run is marked failed with the operator's name and its partial folder removed;
earlier runs are untouched.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from subzero.errors import (
    ChangedConstant,
    DiskFull,
    QueryError,
    StoreError,
    SubZeroError,
    UntrustedRun,
    warn,
)
from subzero.model import content
from subzero.model.workflow import Workflow, load_workflow
from subzero.query.tracelog import record_trace
from subzero.run import Run
from subzero.runs import record
from subzero.runs.record import Steering
from subzero.storage.arrays import ArrayStore
from subzero.storage.catalog import Catalog, RunRow
from subzero.storage.chunks import sums_file
from subzero.storage.pickles import built_constants, load_workflow_pickle
from subzero.storage.place import STORE_FILE, new_uid, read_store_uid, write_store_uid
from subzero.storage.shared import INPUTS
from subzero.storage.space import disk_full, full_disk_named
from subzero.storage.trust import (
    MODIFIED,
    TRUSTED,
    Checks,
    Verdict,
    Voucher,
    code_report,
    read_payload,
    sign_runs,
    untrusted_message,
    verify_run,
    vouch,
)
from subzero.storage.usage import DiskUsage, RunUsage, disk_usage, run_usage

# Running, re-running, impact and tidying are imported by the methods that do them: a
# trace opens a store to read it, and should not pay for the run side (engines, Spark
# sessions, incremental re-runs) at start-up (issue 33; tests/test_imports.py holds this).
if TYPE_CHECKING:
    from subzero.engines.progress import Progress
    from subzero.impact import Impact
    from subzero.query.trace import TraceResult
    from subzero.runs.many import InstanceResult
    from subzero.runs.options import RunOptions

DEFAULT_STORE = ".subzero"


def open_store(path: str | os.PathLike = DEFAULT_STORE, create: bool = True) -> Store:
    return Store(path, create=create)


class Store:
    """A SubZero store directory: catalog, and one folder per run."""

    def __init__(self, path: str | os.PathLike = DEFAULT_STORE, create: bool = True):
        # absolute: Spark executors resolve paths against their own working folder
        self.path = Path(os.path.abspath(path))
        if not self.path.exists():
            if not create:
                raise StoreError(f"no SubZero store at {self.path}; run a workflow first "
                                 f"(`subzero run ...`) or give the store's folder (`store`)")
            _mkdir(self.path, "cannot create the store")
        elif not self.path.is_dir():
            raise StoreError(f"store path {self.path} is not a directory")
        _check_catalog_present(self.path)
        self.catalog = Catalog(self.path / "catalog.sqlite")
        if not self.catalog.readonly:
            _mkdir(self.path / "runs", "cannot create the store's runs folder")
        #: the store's random identity (None: a read-only store made before stores had one)
        self.uid = self._identity()
        self._noted_readonly = False
        self._workflows: dict[int, Workflow] = {}
        self._open_runs: weakref.WeakSet[Run] = weakref.WeakSet()
        self._checks: Checks | None = None

    def _identity(self) -> str | None:
        """The store's uid, from ``store.json`` and the catalog, which must agree (a catalog
        taken from another store would steer traces of runs it does not describe);
        made, and written to both, the first time a writable store is opened."""
        in_file = read_store_uid(self.path)
        in_catalog = self.catalog.meta("store_uid")
        if in_file and in_catalog and in_file != in_catalog:
            raise StoreError(f"the catalog {self.catalog.path} belongs to another store (its store "
                             f"uid is {in_catalog}, {self.path / STORE_FILE} says {in_file}); "
                             f"put the store's own catalog back, or rebuild it with `subzero fsck`")
        if self.catalog.readonly:
            return in_file or in_catalog
        uid = in_file or in_catalog or new_uid()
        if in_catalog is None:
            self.catalog.set_meta("store_uid", uid)
        if in_file is None:
            write_store_uid(self.path, uid)
        return uid

    def close(self) -> None:
        for run in list(self._open_runs):
            run.close()
        self.catalog.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def readonly(self) -> bool:
        """The store cannot be written by this process (an archive, another user's
        store): runs can be listed, shown, read and traced, not added."""
        return self.catalog.readonly or not os.access(self.path / "runs", os.W_OK)

    def require_writable(self, what: str) -> None:
        """Raise a one-line StoreError when ``what`` cannot write to this store."""
        if self.catalog.full is not None:
            raise disk_full(self.path, what)
        if self.readonly:
            raise StoreError(f"store {self.path} is read-only (this process cannot write to "
                             f"it), and {what} needs to write there; give a writable store (`store`) "
                             f"or fix its permissions")

    @property
    def runs_dir(self) -> Path:
        """The folder of the store's runs (``runs/<id>`` each)."""
        return self.path / "runs"

    def run_dir(self, run_id: int) -> Path:
        return self.runs_dir / str(run_id)

    # -- running --------------------------------------------------------------------------
    def run(self, workflow: str | os.PathLike | Workflow, inputs: Mapping[str, Any] | None = None,
            options: RunOptions | None = None, **given: Any) -> Run:
        """Run a workflow (module name, .py path or Workflow) and return the run.

        ``inputs`` maps input names to arrays, DataArrays or file paths; missing
        ones use the workflow's defaults.  How it runs is ``options`` (a
        :class:`~subzero.runs.options.RunOptions`) or the same as keyword
        arguments: ``strategies={"smooth": "full"}``, ``engine="spark"``,
        ``max_disk="20MB"``, ``progress=False``... (see RunOptions for all of them).

        ``engine="auto"`` chooses as ``subzero run`` does (Spark for Spark settings
        or inputs big enough that Spark pays; see :mod:`subzero.engines.choice`)
        and tells ``announce`` the choice in one line.  ``max_disk`` and
        ``max_runtime`` without a ``plan`` optimize first (the ``optimizer``
        package; ``workload`` is its query workload) and run with the new plan; when
        that profiled the workflow (a first budget run of it in this store), the run is
        made from the profiling run (:mod:`subzero.runs.planned`): only lineage the plan
        keeps in another mode is computed again.
        The stored lineage never exceeds the disk budget: an operator that would
        overflow it is downgraded, with a warning and a catalog entry.

        A run is atomic: it is complete, with every array and all its lineage, or
        it is failed and leaves nothing behind but its catalog row.
        """
        from subzero.runs import launch, planned
        from subzero.runs.options import RunOptions
        opts = RunOptions.of(options, **given)
        opts.engine_request().check()
        self.require_writable("a run")
        # the profiling run this call makes, and the pairs of modes it did not store
        profiled: int | None = None
        pairs: dict[tuple[str, str], Any] = {}
        sums: dict[str, Any] = {}
        if opts.budgeted:
            from subzero.optimizer import optimize  # lazy: the optimizer depends on subzero, not back
            plan = optimize(self, workflow, params=None if opts.params is None else dict(opts.params),
                            inputs=None if inputs is None else dict(inputs), max_disk=opts.max_disk,
                            max_runtime=opts.max_runtime, workload=opts.workload,
                            progress=False if opts.progress is False else None,
                            profile_pairs=pairs if planned.can_make_from(opts) else None,
                            profile_sums=sums)
            if opts.on_plan is not None:
                opts.on_plan(plan)
            profiled = plan.profiled_run
            opts = RunOptions.of(opts, plan=plan.as_dict())
        with full_disk_named(self.path, "a run"):
            made = None
            if profiled is not None and planned.can_make_from(opts):
                parent = self.get(profiled)     # the same inputs, profiled by this call
                made = planned.make_from(self.catalog, self.runs_dir, parent, opts, pairs, sums)
                pairs.clear()
                sums.clear()
            run_id, wf = made if made is not None else \
                launch.start(self.catalog, self.runs_dir, workflow, inputs, opts)
        self._workflows[run_id] = wf
        run = self.get(run_id)
        unlabelled = run.unlabelled()
        if unlabelled:       # told once, when the run is made, not at every trace
            warn(f"run {run_id}: {', '.join(unlabelled[:4])}{' ...' if len(unlabelled) > 4 else ''} "
                 f"lost the coordinates of {'its' if len(unlabelled) == 1 else 'their'} labelled "
                 f"inputs (the output's axes match none of theirs); give the operator an "
                 f"output_grid to label its output")
        return run

    def resume(self, run: int | str, workflow: str | os.PathLike | Workflow | None = None,
               options: RunOptions | None = None, **given: Any) -> Run:
        """Finish an interrupted run (its driver was lost: killed, out of memory, its host
        gone) from its first unfinished operator, with the strategies, tile size and
        disk budget it began with; the result is the run an uninterrupted one would
        have been, under the same id.

        The workflow is loaded again from where the run loaded it (its module or
        file; give ``workflow`` for a run of a Workflow object made in Python), and
        must be unchanged: its operators and their modules' source are compared with
        the run's journal.  Of the options, only where it runs (``engine``, ``spark``,
        ``master``, ``conf``) and what the user sees (``progress``, ``log``,
        ``announce``) apply; the engine defaults to the run's own (Spark when Spark
        settings are given).  Runs that completed, failed or are still running (their
        driver alive, on any host) are refused."""
        from subzero.runs import launch
        from subzero.runs.options import RunOptions
        from subzero.runs.transaction import recover
        opts = RunOptions.of(options, **{"engine": None, **given})
        self.require_writable("resuming a run")
        row = self.catalog.get_run(run)
        if row.status == "interrupted" and recover(self.catalog, self.runs_dir, row.id):
            if opts.announce is not None:    # committed before its driver was lost
                opts.announce(f"run {row.id} was committed before its driver was lost; it is "
                              f"recorded complete")
            return self.get(row.id)
        with full_disk_named(self.path, f"resumed run {run}"):
            run_id, wf = launch.resume(self.catalog, self.runs_dir, run, workflow, opts)
        self._workflows[run_id] = wf
        return self.get(run_id)

    def rerun(self, run: int | str, inputs: Mapping[str, Any], options: RunOptions | None = None,
              **given: Any) -> Run:
        """Make run ``run`` again with ``inputs`` corrected (names to arrays, DataArrays or
        file paths; the other inputs are the run's own), recomputing only the tiles the
        correction can reach (:mod:`subzero.engines.incremental`); returns the new run,
        bit-identical to a full run on the new inputs, in every array and in its stored
        lineage.  It keeps the run's workflow, strategies, parameters and tile size, and
        its record names its parent and, per operator, what ran and what changed
        (:meth:`Run.rerun_info`).  Of the options, ``progress``, ``log`` and ``announce``
        apply.  A run whose code this user's key does not vouch for is refused."""
        from subzero.runs.options import RunOptions
        from subzero.runs.rerun import rerun
        opts = RunOptions.of(options, **given)
        self.require_writable("a re-run")
        parent = self.get(run)
        with full_disk_named(self.path, f"a re-run of run {parent.id}"):
            run_id, wf, _ = rerun(self.catalog, self.runs_dir, parent, dict(inputs), opts)
        self._workflows[run_id] = wf
        return self.get(run_id)

    def rerun_using(self, old: Any, new: Any, name: str | None = None,
                    options: RunOptions | None = None, **given: Any) -> list[Run]:
        """Re-run every complete run that read input ``old`` (a file, an array, a digest,
        as :meth:`runs_using` takes it; as input ``name``, when given) with ``new`` in its
        place, one run after another,
        each committed on its own (an interruption keeps the re-runs done; running the
        same call again re-runs only the runs whose re-run on ``new`` is not yet there).
        Returns the new runs, in the order of the runs re-run.

        ``engine="spark"`` (or ``master``/``conf``/``spark`` given) runs them on Spark, a
        task per run, in jobs of ``tuning.RERUN_BATCH`` runs whose re-runs the driver
        commits when each job ends (executors must see the store and ``new``, a file, at
        the same paths).  Re-runs that fail are named in one error once the others are
        committed."""
        from subzero.engines.choice import choose_engine, open_session
        from subzero.engines.progress import progress_for
        from subzero.runs.options import RunOptions
        runs = [(r, n) for r, n in self.runs_using(old) if name is None or n == name]
        if not runs:
            what = "that array" if hasattr(old, "shape") else str(old)
            raise QueryError(f"no complete run of this store read {what}"
                             + (f" as input {name!r}" if name is not None else ""))
        target = self.digest_of(new) if not isinstance(new, (str, os.PathLike)) or Path(new).exists() \
            else None
        done = self._reruns_on(target) if target is not None else {}
        opts = RunOptions.of(options, **given)
        request = opts.engine_request()
        request.check()
        todo = [(rid, n) for rid, n in runs if (rid, n) not in done]
        choice = choose_engine(request)
        if todo and choice.engine == "spark":
            self.require_writable("a re-run")
            from subzero.runs.rerun import rerun_many
            spark = open_session(choice, request, self.path)
            reporter = progress_for(opts.progress)
            reporter.begin(len(todo), f"{len(todo)} re-runs on Spark", unit="run")
            failed = []
            try:
                for input_name in sorted({n for _, n in todo}):
                    parents = [self.get(rid) for rid, n in todo if n == input_name]
                    with full_disk_named(self.path, f"re-runs of {len(parents)} runs"):
                        for pid, new_id, error in rerun_many(self.catalog, self.runs_dir, parents,
                                                             {input_name: new}, spark, reporter):
                            if new_id is None:
                                failed.append(f"run {pid}: {error}")
                            else:
                                done[(pid, input_name)] = new_id
            finally:
                reporter.close()
            if failed:
                raise StoreError(f"{len(failed)} of {len(todo)} re-runs failed (the others are "
                                 f"committed): {'; '.join(failed[:3])}")
        out = []
        for rid, input_name in runs:
            if (rid, input_name) in done:
                out.append(self.get(done[(rid, input_name)]))
                continue
            out.append(self.rerun(rid, {input_name: new}, RunOptions.of(opts, engine="local", spark=None,
                                                                        master=None, conf=None)))
        return out

    def _reruns_on(self, digest: str) -> dict[tuple[int, str], int]:
        """(parent, input) -> the complete re-run of it whose input is ``digest``."""
        found: dict[tuple[int, str], int] = {}
        for rid, parent in self.catalog.reruns().items():
            info = self.catalog.rerun_of(rid) or {}
            if self.catalog.get_run(rid).status != "complete":
                continue
            for n, d in self.input_digests(rid).items():
                if d == digest and n in info.get("inputs", ()):
                    found[(parent, n)] = rid
        return found

    def run_many(self, workflow: str | os.PathLike | Workflow, manifest: str | os.PathLike,
                 options: RunOptions | None = None, **given: Any) -> list[InstanceResult]:
        """One run per row of a CSV manifest (columns = workflow inputs, values =
        paths), as parallel Spark tasks; returns one InstanceResult per row.
        ``options`` as in :meth:`run` (``strategies``, ``params``, ``capture``,
        ``tile``, ``spark``/``master``/``conf``; ``progress`` counts instances)."""
        from subzero.engines.choice import choose_engine, open_session
        from subzero.engines.progress import progress_for
        from subzero.runs import launch
        from subzero.runs.many import read_manifest, run_many
        from subzero.runs.options import RunOptions
        opts = RunOptions.of(options, **{"engine": "spark", **given})
        self.require_writable("a run")
        wf = load_workflow(workflow, dict(opts.params or {}))
        strat = launch.resolve_strategies(wf, opts.strategies)
        rows = read_manifest(manifest, wf)
        request = replace(opts.engine_request(), instances=True)
        spark = open_session(choose_engine(request), request, self.path)
        reporter = progress_for(opts.progress)
        reporter.begin(len(rows), f"{len(rows)} instances of {wf.name}", unit="run")
        try:
            return run_many(self.catalog, self.runs_dir, wf, strat, rows, spark, capture=opts.capture,
                            tile=opts.tile_size, progress=reporter)
        finally:
            reporter.close()

    def log_trace(self, run_id: int, start: str, cells: Any, to: str | None,
                  path: list[tuple[str, int]] | None, shortcut: bool, res: TraceResult) -> None:
        """Keep a traced query in the trace log (the optimizer's workload); a read-only
        store, or one whose disk is full, says once that it cannot (the answer stands)."""
        why = None
        if self.catalog.full is not None:
            why = f"the disk of store {self.path} is full"
        elif self.catalog.readonly:
            why = f"store {self.path} is read-only"
        else:
            try:
                record_trace(self.catalog, run_id, start, cells, to, path, shortcut, res)
            except DiskFull:       # the answer stands; only its log entry is lost
                why = f"the disk of store {self.path} is full"
        if why is not None and not self._noted_readonly:
            self._noted_readonly = True
            warn(f"{why}: this trace is not added to its trace log (the optimizer's workload)")

    # -- reading -----------------------------------------------------------------------------
    def runs(self) -> list[RunRow]:
        return self.catalog.runs()

    def clean(self, dry_run: bool = False) -> list[dict[str, Any]]:
        """Tidy ``runs/`` without ever losing a run (:mod:`subzero.runs.clean`): remove
        the folders of interrupted runs (their driver is gone, on any host; they are then
        recorded failed, so they can no longer be resumed), what failed runs left, task
        attempts' folders and heartbeat files; record committed runs the catalog does not
        know yet (``recover``, ``adopt``); move anything else it cannot account for to
        the store's ``quarantine/`` folder.  Complete runs and runs still running are
        never touched.  Returns what was (with ``dry_run``: would be) done: one dict per
        path with ``path``, ``run``, ``bytes``, ``why`` and ``action``."""
        from subzero.runs.clean import clean
        self.require_writable("cleaning")
        return clean(self.catalog, self.runs_dir, dry_run=dry_run)

    def gc(self, runs: Sequence[int | str] = (), *, keep_last: int | None = None,
           older_than: str | float | None = None, workflow: str | None = None,
           keep_tagged: bool = True, dry_run: bool = False) -> list[dict[str, Any]]:
        """Delete complete runs (:mod:`subzero.runs.gc`): those named in ``runs`` (ids or
        tags), or every one older than ``older_than`` (``"30d"``, ``"12h"``, seconds)
        and not among the newest ``keep_last`` of its workflow (either policy alone, of
        ``workflow`` only when given).  Tagged runs are kept unless ``keep_tagged`` is
        False, and so is the parent of a re-run still running.  Each run goes at once or
        not at all, even if the process is killed; what kept runs share with it (a
        re-run's linked chunks, inputs stored once) stays.  Returns one dict per run
        concerned (``run``, ``action`` delete or keep, ``why``, ``bytes`` freed) and per
        input copy removed; with ``dry_run`` nothing changes."""
        from subzero.runs.gc import Policy, gc, parse_age
        if not dry_run:
            self.require_writable("deleting runs (gc)")
        policy = Policy(tuple(str(r) for r in runs), keep_last,
                        None if older_than is None else parse_age(older_than), workflow, keep_tagged)
        return gc(self.catalog, self.runs_dir, policy, dry_run=dry_run)

    def tag(self, run: int | str, name: str, force: bool = False) -> int:
        """Name a complete run ``name`` (then usable wherever a run is asked for, and kept
        by :meth:`gc`); returns its id.  A tag naming another run moves only with
        ``force``.  Tags are this store's labels, not part of the signed run."""
        from subzero.runs.gc import check_tag
        self.require_writable("tagging a run")
        check_tag(name)
        row = self.catalog.get_run(run)
        if row.status != "complete":
            raise QueryError(f"run {row.id} is {row.status}; only complete runs are tagged")
        before = self.catalog.tagged(name)
        if before is not None and before != row.id and not force:
            raise QueryError(f"tag {name!r} names run {before} already; move it with `force=True` "
                             f"or choose another name")
        self.catalog.set_tag(name, row.id)
        return row.id

    def untag(self, name: str) -> int:
        """Remove a tag; returns the run it named."""
        self.require_writable("removing a tag")
        rid = self.catalog.tagged(name)
        if rid is None or not self.catalog.drop_tag(name):
            raise QueryError(f"no tag {name!r}; see `subzero tag` for this store's tags")
        return rid

    def tags(self) -> dict[str, int]:
        """Every tag of this store and the run it names."""
        return self.catalog.tags()

    def get(self, ref: str | int = "latest") -> "Run":
        row = self.catalog.get_run(ref)
        if row.status == "deleted":
            raise QueryError(f"run {row.id} was {row.error or 'deleted'}; its arrays and "
                             f"lineage are gone")
        if row.status != "complete":
            why = f": {row.error}" if row.error else ""
            raise QueryError(f"run {row.id} did not complete ({row.status}{why})")
        d = self.run_dir(row.id)
        if not d.is_dir():
            if d.with_name(f"{row.id}.deleted").is_dir():
                raise QueryError(f"run {row.id} is being deleted (subzero gc)")
            raise StoreError(f"run {row.id} is in the catalog but its folder {d} is missing")
        run = Run(self, row)
        self._open_runs.add(run)
        return run

    def workflow_of(self, row: RunRow, verdict: Verdict | None = None) -> Workflow:
        """The operators of a run: its ``workflow.pkl``, else its workflow module
        re-imported from its source path.  Both are code, so they are loaded only for a
        run whose signature verifies with this user's key (see :meth:`trust`); otherwise
        :class:`~subzero.storage.trust.UntrustedRun` is raised and nothing is loaded.
        ``verdict``: the run's :meth:`verdict`, when the caller has just checked it."""
        wf = self._workflows.get(row.id)
        if wf is not None:
            return wf
        if verdict is None:
            verdict = self.verdict(row)
        if not verdict.trusted:
            raise UntrustedRun(f"cannot load the operators of run {row.id}: "
                               + untrusted_message(self.path, row.id, verdict))
        err = None
        digest = verdict.payload_sha256
        shared = self._checks.loaded if self._checks is not None and digest else None
        if shared is not None and digest is not None:      # a pickle equal to one loaded
            wf = shared.get(digest)                        # in this query
            if wf is not None:
                return wf
        if verdict.payload is not None:       # the bytes that were verified, not a re-read
            try:
                wf = load_workflow_pickle(verdict.payload, lambda: self._rebuilt(row, verdict),
                                          f"run {row.id}")
            except ChangedConstant:
                raise                         # its module gives other operators: never them
            except Exception as e:
                err = f"{type(e).__name__}: {e}"
            if wf is not None and shared is not None and digest is not None:
                shared[digest] = wf
                return wf
        steer = self.steering(row, verdict)
        if wf is None and steer.source:
            try:
                wf = load_workflow(steer.source, steer.params)
            except SubZeroError as e:
                err = str(e)
        if wf is None:
            raise StoreError(f"cannot load the operators of run {row.id} (workflow {row.workflow!r}"
                             f"{', ' + err if err else ''}); mapping functions and re-execution "
                             f"need them")
        self._workflows[row.id] = wf
        return wf

    def _rebuilt(self, row: RunRow, verdict: Verdict) -> dict[str, Any]:
        """The large arrays the run's workflow module builds now (by digest), for the
        constants its pickle left out (:mod:`subzero.storage.constants`): the module is
        run again from where the run loaded it, with its parameters."""
        steer = self.steering(row, verdict)
        if not steer.source:
            raise ChangedConstant(f"run {row.id}'s workflow.pkl leaves out arrays that are "
                                  f"rebuilt from its workflow module, but the run names no module")
        try:
            return built_constants(load_workflow(steer.source, steer.params))
        except SubZeroError as e:
            raise ChangedConstant(f"run {row.id}'s operators hold arrays rebuilt from its "
                                  f"workflow module {steer.source}, which cannot be loaded "
                                  f"now: {e}") from e

    # -- trust ------------------------------------------------------------------------------
    def verdict(self, run: str | int | RunRow = "latest") -> Verdict:
        """Whether a run's code may be loaded: its signature checked against this user's
        key (``.state`` is "trusted", "unsigned", "other key" or "modified")."""
        row = run if isinstance(run, RunRow) else self.catalog.get_run(run)
        folder = self.run_dir(row.id)
        try:
            rec = record.read_bytes(folder)
        except StoreError as e:              # not a regular file, too big: damaged
            return Verdict(MODIFIED, None, detail=f"its record is damaged ({e})")
        if row.id in self._workflows:          # written by this process: its own code
            return Verdict(TRUSTED, read_payload(folder), record=rec)
        return verify_run(self.catalog, row, folder, rec, self._checks)

    def vouchers(self, run_ids: Sequence[int]) -> dict[int, Voucher]:
        """The signatures of these runs checked with this user's key, for the executors of
        a query over them, which never see the key (:func:`~subzero.storage.trust.vouch`):
        each then checks that the record it reads is the one vouched for, and all the
        rest itself (``checks_shared(vouchers)``)."""
        checks = self._checks or Checks()
        out = {}
        for rid in run_ids:
            row = self.catalog.get_run(rid)
            try:
                rec = record.read_bytes(self.run_dir(rid))
            except StoreError as e:
                out[rid] = Voucher(MODIFIED, detail=f"its record is damaged ({e})")
                continue
            out[rid] = vouch(self.catalog, row, self.run_dir(rid), rec, checks)
        return out

    @contextlib.contextmanager
    def checks_shared(self, vouchers: Mapping[int, Voucher] | None = None) -> Iterator[None]:
        """Within it, the trust checks of many runs share what they verified
        (:class:`~subzero.storage.trust.Checks`): the key is loaded once, a workflow
        pickle equal to one verified is not hashed again, and runs with equal pickles
        share the operators loaded from them (kept until it ends, not for the store's
        life).  Every run's signature is still checked -- with ``vouchers`` (a Spark
        task's, from :meth:`vouchers`), as its driver checked it.  For queries over many
        runs."""
        if self._checks is not None and vouchers is None:
            yield
            return
        before, self._checks = self._checks, Checks(vouchers)
        try:
            yield
        finally:
            self._checks = before

    def steering(self, row: RunRow, verdict: Verdict | None = None) -> Steering:
        """What steers a run's traces and code loads -- its operators (inputs,
        strategies, shapes), arrays (shapes, dtypes), workflow source and parameters:
        from its signed record when that verifies (catalog rows edited since are then
        ignored), else from the catalog.  A run whose record no longer verifies with
        this user's key, or whose unverified record and catalog rows disagree, is
        refused: nothing of it can be trusted to steer a trace.  ``verdict``: the run's
        :meth:`verdict`, when the caller has just checked it."""
        if verdict is None:
            verdict = self.verdict(row)
        data = verdict.record
        if data is not None:
            rec = record.parse(data, self.run_dir(row.id))
            ops, arrays = record.steering(rec)
            return Steering(ops, arrays, rec["run"]["source"], dict(rec["run"]["params"]), rec,
                            verified=True)
        if verdict.misplaced:
            raise StoreError(f"run {row.id} cannot be traced: {verdict.why}; restore the run's "
                             f"folder from a backup")
        if verdict.state == MODIFIED and verdict.detail:
            raise StoreError(f"run {row.id} cannot be traced: {verdict.why}, so nothing of it "
                             f"verifies; restore it from a backup, or look at it and trust it "
                             f"again (`subzero trust {self.path} --run {row.id}`)")
        unverified = record.read(self.run_dir(row.id))
        if unverified is not None:
            differ = record.differences(unverified, self.catalog, row.id)
            if differ:
                raise StoreError(f"run {row.id} cannot be traced: its catalog rows and its record "
                                 f"disagree ({', '.join(differ[:3])}) and neither is signed with "
                                 f"your key; restore the store, or `subzero fsck` it")
        return Steering(self.catalog.ops(row.id), self.catalog.arrays(row.id), row.source,
                        dict(row.params), unverified)

    def binding(self, run: str | int | RunRow = "latest") -> dict[str, Any]:
        """How a run's stored bytes are bound to it, for ``show``: ``bound`` (it has a
        uid and a record: its pieces prove where they belong), and where the catalog's
        rows differ from its record (``catalog_differs``; traces then follow the record,
        and ``subzero fsck`` repairs the catalog)."""
        row = run if isinstance(run, RunRow) else self.catalog.get_run(run)
        try:
            rec = record.read(self.run_dir(row.id))
        except StoreError as e:
            return {"bound": False, "record": False, "catalog_differs": [], "damaged": str(e)}
        if rec is None:
            return {"bound": False, "record": False, "catalog_differs": []}
        return {"bound": row.uid is not None, "record": True,
                "catalog_differs": record.differences(rec, self.catalog, row.id)}

    # -- inputs by content ----------------------------------------------------------------
    def input_digests(self, run: str | int | RunRow = "latest") -> dict[str, str | None]:
        """Each input of a complete run and its content digest (:mod:`subzero.model.content`).
        A run made before digests has none in the catalog: it is computed from the run's
        stored input (band by band, through its checksums) and kept when the store is
        writable.  An input that cannot be read has None, with a warning saying why."""
        row = run if isinstance(run, RunRow) else self.catalog.get_run(run)
        have = self.catalog.input_digests(row.id)
        if row.status != "complete":
            return have
        verdict = self.verdict(row)
        if verdict.trusted and verdict.record is not None:   # a signed record's digests stand
            rec = record.parse(verdict.record, self.run_dir(row.id))      # over the catalog's
            for a in rec["arrays"]:
                if a["kind"] == "input" and a.get("digest") and a["name"] in have:
                    if have[a["name"]] is None and not self.readonly:
                        self.catalog.set_digest(row.id, a["name"], a["digest"])
                    have[a["name"]] = a["digest"]
        if all(have.values()):
            return have
        arrays = ArrayStore(self.run_dir(row.id), run_uid=row.uid)
        for name, d in have.items():
            if d:
                continue
            try:
                have[name] = digest = arrays.content_digest(name)
            except SubZeroError as e:
                warn(f"input {name!r} of run {row.id} has no content digest: {e}")
                continue
            if not self.readonly:
                self.catalog.set_digest(row.id, name, digest)
        return have

    def disk_usage(self, run: str | int | None = None) -> DiskUsage:
        """Where the store's bytes go (:mod:`subzero.storage.usage`): per run (arrays, one
        by one; lineage; pickles; statistics; the rest of its folder), with the bytes it
        owns alone and those it shares (hard links: a re-run's unchanged chunks, inputs
        stored once); the store's inputs, catalog (its trace log and plans apart), the
        rest, and the total, every file counted once as ``du -sb`` does.  ``run`` (an
        id or "latest"): list that run alone; the totals stay the store's.  Reads only:
        a read-only store answers too."""
        rid = None if run is None else self.catalog.get_run(run).id
        rows = {r.id: (r.status, r.workflow) for r in self.catalog.runs()}
        return disk_usage(self.path, rows, self.catalog.table_bytes(), run=rid)

    def run_usage(self, run: str | int | RunRow = "latest") -> RunUsage:
        """One run's bytes, as :meth:`disk_usage` lists it, reading its own folder and
        the store's copies of its inputs alone (cheap: what ``subzero run`` and ``show``
        print).  A file is owned alone when every link to it is in the run's folder."""
        row = run if isinstance(run, RunRow) else self.catalog.get_run(run)
        ru = run_usage(self.path, row.id)
        ru.status, ru.workflow = row.status, row.workflow
        return ru

    def inputs(self) -> list[dict[str, Any]]:
        """The store's distinct inputs by content: one dict per digest with ``digest``,
        ``shape``, ``dtype``, ``nbytes``, ``uses`` (``(run id, input name)`` of every
        complete run that read it, in run order) and ``stored``: how many copies the
        store keeps (``copies``; ``shared`` of them the store's, read by every run
        that uses them, the others a run's own, from runs made before inputs were
        stored once) and their ``bytes`` on disk.  Digests of runs made before digests
        are computed first (see :meth:`input_digests`)."""
        from subzero.runs.clean import tree_bytes
        out: dict[str, dict[str, Any]] = {}
        for row in self.catalog.runs():
            if row.status != "complete":
                continue
            arrays = self.catalog.arrays(row.id)
            for name, digest in self.input_digests(row).items():
                if digest is None:
                    continue
                a = arrays[name]
                e = out.setdefault(digest, {"digest": digest, "shape": tuple(a["shape"]),
                                            "dtype": a["dtype"], "nbytes": a["nbytes"], "uses": []})
                e["uses"].append((row.id, name))
                e.setdefault("places", set()).add(self._input_place(row, name))
        for e in out.values():
            places = e.pop("places")
            e["stored"] = {"copies": len(places), "shared": sum(1 for p in places if p.parent.name
                                                                 == INPUTS),
                           "bytes": sum(tree_bytes(p) + (tree_bytes(sums_file(p)) if
                                                         sums_file(p).exists() else 0)
                                        for p in places if p.exists())}
        return list(out.values())

    def _input_place(self, row: RunRow, name: str) -> Path:
        """Where a run's input is kept: the store's copy, or the run's own."""
        arrays = ArrayStore(self.run_dir(row.id), run_uid=row.uid)
        try:
            return arrays.path(name)
        except SubZeroError:
            return arrays.dir / f"{name}.zarr"

    def runs_using(self, what: Any, name: str | None = None) -> list[tuple[int, str]]:
        """``(run id, input name)`` of every complete run that read this input: ``what`` is
        a content digest (``sz1:...``), a file (any format SubZero reads: its values and
        labels, not its path, are compared), an array or DataArray, or a run (id) whose
        input ``name`` is meant.  Found through the catalog's index of digests: the cost
        follows the runs found, not the store's size (runs made before digests are
        digested once, the first time)."""
        digest = self.digest_of(what, name)
        found = set(self.catalog.runs_with_input(digest))
        for rid in self.catalog.runs_without_digests():
            found |= {(rid, n) for n, d in self.input_digests(rid).items() if d == digest}
        done = {rid for rid in {r for r, _ in found} if self.catalog.get_run(rid).status == "complete"}
        return sorted(u for u in found if u[0] in done)

    def impact(self, what: Any, cells: Any = None, *, name: str | None = None,
               to: str | Sequence[str] | None = None, sky: Any = None, radius: Any = None,
               sel: Mapping[str, Any] | None = None, engine: str | None = None, spark: Any = None,
               master: str | None = None, conf: Mapping[str, str] | None = None,
               progress: bool | Progress | None = None,
               announce: Callable[[str], None] | None = None) -> Impact:
        """The impact of a region of an input on every run that read it: ``what`` names
        the input as :meth:`runs_using` takes it (a file, an array, a digest, or a run
        with ``name``); ``cells`` the region (an ``(N, ndim)`` array or the ``--cells``
        syntax), or ``sky``/``radius``/``sel`` as in :meth:`Run.cells_at`.  Each run is
        traced forward from its own input to ``to`` (an array or several; default: the
        workflow's outputs).  Returns an :class:`~subzero.impact.Impact`: per run its
        affected cells, counts, bounding boxes and sky/label regions per array, or why
        the run cannot be answered (an untrusted run whose lineage needs its code).

        Runs are answered in parallel: ``engine="local"`` in this process (forked
        workers when there are more than a few runs), ``"spark"`` as one Spark job over
        runs (``spark`` a SparkSession, or ``master``/``conf`` as for :meth:`run`), and
        ``"auto"`` (default) Spark for Spark settings or many runs
        (:func:`~subzero.engines.choice.impact_engine`; ``announce`` is told the choice).
        The answers are the same either way.  ``progress`` as for :meth:`run`."""
        from subzero.impact import impact
        return impact(self, what, cells, name=name, to=to, sky=sky, radius=radius, sel=sel,
                      engine=engine, spark=spark, master=master, conf=conf, progress=progress,
                      announce=announce)

    def digest_of(self, what: Any, name: str | None = None) -> str:
        """The content digest ``what`` names (see :meth:`runs_using`)."""
        if name is not None:
            digests = self.input_digests(what)
            if name not in digests:
                row = self.catalog.get_run(what)
                raise QueryError(f"run {row.id} has no input {name!r}; its inputs: "
                                 f"{', '.join(digests) or '(none)'}")
            d = digests[name]
            if d is None:
                raise StoreError(f"input {name!r} of run {what} cannot be read to compute its digest")
            return d
        if isinstance(what, str) and what.startswith(content.PREFIX):
            if not content.is_digest(what):
                raise QueryError(f"{what!r} is not a content digest (sz1: and 64 hex digits)")
            return what
        if isinstance(what, (str, os.PathLike)):
            from subzero.storage.inputs import split_variable
            if not split_variable(what)[0].exists():
                raise QueryError(f"file not found: {what} (give an input file, FILE:VARIABLE, or "
                                 f"a digest sz1:...)")
        from subzero.storage.inputs import input_digest
        return input_digest(what, str(what) if isinstance(what, (str, os.PathLike)) else "input")

    def code_of(self, run: str | int | RunRow = "latest") -> dict[str, Any]:
        """What code a run would load, read without loading it: its operators (names and
        classes, from the catalog), the modules and names its ``workflow.pkl`` looks up,
        the functions and classes whose code travels inside it, and the workflow module
        re-imported when the pickle fails.  Plain data (for ``subzero trust --json``);
        ``payload_sha256`` names the pickle shown, for :meth:`trust`."""
        row = run if isinstance(run, RunRow) else self.catalog.get_run(run)
        return code_report(self.catalog, row, self.verdict(row))

    def trust(self, run: str | int | None = None,
              payloads: Mapping[int, str | None] | None = None) -> list[int]:
        """Accept runs' code as this user's own: sign run ``run`` (an id or "latest") or,
        by default, every complete run not trusted yet, with this user's key; returns
        the ids signed.  Traces may then load — that is, run — their operators.  Look
        first at what they contain (:meth:`code_of`; ``subzero trust`` shows it and
        asks).  ``payloads`` (run id -> ``payload_sha256`` of what was shown) makes sure
        the pickles signed are the ones looked at."""
        if run is not None:
            rows = [self.catalog.get_run(run)]
            if rows[0].status != "complete":
                raise QueryError(f"run {rows[0].id} did not complete ({rows[0].status}); only a "
                                 f"complete run has code to trust")
        else:
            rows = [r for r in self.runs() if r.status == "complete" and not self.verdict(r).trusted]
        records = {}
        for row in rows:                     # a record names the pickle that is signed with it
            rec = record.read(self.run_dir(row.id))
            if rec is not None:
                payload = read_payload(self.run_dir(row.id))
                digest = hashlib.sha256(payload).hexdigest() if payload is not None else None
                if payloads is not None and payloads.get(row.id, digest) != digest:
                    raise StoreError(f"the workflow.pkl of run {row.id} changed after it was shown; "
                                     f"nothing was trusted for it: look again and trust it again")
                if rec.get("payload_sha256") != digest:
                    rec["payload_sha256"] = digest
                    records[row.id] = record.write(self.run_dir(row.id), rec)
                else:
                    records[row.id] = record.encode(rec)
        signed = sign_runs(self.catalog, self.runs_dir, rows, payloads, records)
        for open_run in list(self._open_runs):   # their next trace checks the signature again
            if open_run.id in signed:
                open_run.close()
        return signed


def _mkdir(path: Path, what: str) -> None:
    """``mkdir -p``, failing as one line that names the path."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"{what} {path}: {e.strerror or e}"
                         + (f" ({e.filename})" if e.filename and str(e.filename) != str(path)
                            else "")) from e


def _check_catalog_present(root: Path) -> None:
    """A store whose catalog is gone but which holds runs (or its identity file) must not
    be taken for a new, empty store: a new catalog would list no runs, and ``clean``
    would then see every run as unknown."""
    if (root / "catalog.sqlite").exists():
        return
    runs = root / "runs"
    held = runs.is_dir() and any(p.name.split(".", 1)[0].isdigit() for p in runs.iterdir())
    if held or (root / STORE_FILE).exists():
        raise StoreError(f"the catalog of store {root} (catalog.sqlite) is missing, but the store "
                         f"holds runs; rebuild it from the runs' signed records with `subzero "
                         f"fsck --store {root}`, or restore it from a backup")
