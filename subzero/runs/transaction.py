"""A run's transaction in the store: begin, commit, fail.

A run is atomic.  :meth:`RunTransaction.begin` records it ``running`` in the
catalog and gives it the folder ``runs/<id>.partial`` to write into;
:meth:`~RunTransaction.commit` saves ``workflow.pkl``, records arrays,
operators, strategy statistics and disk-budget downgrades in one catalog
transaction, signs the run with this user's key (``storage.trust``), renames
the folder to ``runs/<id>`` and only then marks the run complete;
:meth:`~RunTransaction.fail` marks it failed with the error (an operator's
message names the operator; Ctrl-C says ``interrupted``) and removes its
folders.  Used as a context manager, any exception fails the run.  While it
runs, a thread beats ``runs/<id>.heartbeat`` (:mod:`subzero.storage.liveness`).
A driver killed mid-run leaves the row ``running`` with a dead pid and a stale
heartbeat, which the catalog reports as ``interrupted``: never complete.
:meth:`RunTransaction.resume` takes such a run over (its folder and journal,
:mod:`subzero.runs.journal`, are kept) to finish it.

Instance-parallel runs begin without a folder: each Spark task attempt writes
``runs/<id>.partial-a<attempt>``, and the attempt that succeeded is committed —
and signed — by the driver: executors never need the user's key.  That driver beats
all its instances' heartbeat files from one thread (``heartbeat=``).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from subzero.engines.stats import RunStats
from subzero.errors import StoreError, SubZeroError, warn
from subzero.model.workflow import Workflow
from subzero.runs import record, share
from subzero.storage.arrays import ArrayStore
from subzero.storage.catalog import Catalog
from subzero.storage.files import fsync_dir
from subzero.storage.lineage import sweep_shard_attempts
from subzero.storage.liveness import Heartbeat, heartbeat_path
from subzero.storage.pickles import save_workflow
from subzero.storage.place import new_uid
from subzero.storage.trust import read_payload, sign_record


def failure_message(error: BaseException | str) -> str:
    """How a failed run's error is kept in the catalog: a SubZero error as it reads
    (it names the operator), Ctrl-C as ``interrupted``, anything else with its type."""
    if isinstance(error, str):
        return error
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, SubZeroError):
        return str(error)
    return f"{type(error).__name__}: {error}"


class RunTransaction:
    """One run, from ``running`` to ``complete`` or ``failed``::

        with RunTransaction.begin(store.catalog, store.path / "runs", wf, inputs, "local") as tx:
            ...                               # write arrays and lineage under tx.folder
            tx.commit(wf, stats, downgrades)
    """

    def __init__(self, catalog: Catalog, runs_dir: Path, run_id: int,
                 heartbeat: Heartbeat | None = None):
        self.catalog = catalog
        self.runs_dir = Path(runs_dir)
        self.run_id = run_id
        #: the run's random identity (its catalog row's ``uid``)
        self.uid: str | None = catalog.get_run(run_id).uid
        self.status = "running"
        self._moved = False
        # a shared heartbeat (an instance-parallel run's) is closed by its owner
        self._own_heart = heartbeat is None
        self._heart = heartbeat if heartbeat is not None else Heartbeat()
        self._heart.add(heartbeat_path(self.runs_dir, run_id))

    @classmethod
    def begin(cls, catalog: Catalog, runs_dir: str | os.PathLike, wf: Workflow,
              inputs: Mapping[str, Any], engine: str, folder: bool = True,
              heartbeat: Heartbeat | None = None) -> RunTransaction:
        """Record a new run ``running`` (``inputs`` describes its inputs for the catalog)
        and, with ``folder``, make its partial folder."""
        uid = new_uid()
        run_id = catalog.begin_run(wf.name, wf.source, wf.params, dict(inputs), engine, uid)
        tx = cls(catalog, Path(runs_dir), run_id, heartbeat)
        taken = tx._taken()
        if taken is not None:
            # the catalog gave an id whose folder exists: it is older than the runs folder
            # (restored from a backup).  Nothing of that folder may be touched.
            tx.status = "failed"
            catalog.forget_run(run_id)          # nothing of it exists: no row left behind
            tx._stop_heart()
            raise StoreError(f"the catalog {catalog.path} is older than the store's runs folder: "
                             f"it gave the new run id {run_id}, whose folder {taken} already "
                             f"exists; add the runs it does not know with `subzero fsck --store "
                             f"{Path(runs_dir).parent}`, then run again")
        if folder:
            try:
                tx.folder.mkdir(parents=True)
            except BaseException as e:
                tx.fail(e)
                raise
        return tx

    @classmethod
    def resume(cls, catalog: Catalog, runs_dir: str | os.PathLike, run_id: int) -> RunTransaction:
        """Take over an interrupted run (its driver is gone) to finish it; its partial
        folder must still be there."""
        row = catalog.claim_run(run_id)
        tx = cls(catalog, Path(runs_dir), row.id)
        if not tx.folder.is_dir():
            tx._stop_heart()
            raise StoreError(f"run {row.id} cannot be resumed: its folder {tx.folder} is gone "
                             f"(an instance run, or removed); remove the run with `subzero clean`")
        return tx

    def _taken(self) -> Path | None:
        """A folder of this run's id that exists already, if any."""
        for p in (self.final, self.folder):
            if os.path.lexists(p):
                return p
        return next(iter(self.runs_dir.glob(f"{self.run_id}.partial-a*")), None)

    def _stop_heart(self) -> None:
        self._heart.discard(heartbeat_path(self.runs_dir, self.run_id))
        if self._own_heart:
            self._heart.close()

    @property
    def folder(self) -> Path:
        """Where the run is written until it commits."""
        return self.runs_dir / f"{self.run_id}.partial"

    @property
    def final(self) -> Path:
        return self.runs_dir / str(self.run_id)

    def commit(self, wf: Workflow, stats: RunStats, downgrades: Iterable[Mapping] = (),
               folder: str | os.PathLike | None = None,
               contents: Mapping[str, str] | None = None) -> None:
        """Make the run complete: ``folder`` (default: :attr:`folder`) becomes the run's
        folder.

        In an order where a crash at any instant leaves either the unfinished run
        (resumed or cleaned as before) or the committed one, never neither: the
        workflow pickle, then the run's record (:mod:`subzero.runs.record`) and its
        signature, all fsynced, then the rename into place (fsynced), and only then
        the catalog's rows, inserted from the record in one transaction with the
        status.  A crash after the rename leaves a committed folder the catalog still
        calls running; :func:`recover` records it (``--resume``, ``subzero clean``,
        ``subzero fsck``).  A failure before the rename fails the run; after it,
        nothing deletes the run.

        ``contents``: the content digests of inputs already known (digested from memory);
        the others are digested from the run's stored copy."""
        src = Path(folder) if folder is not None else self.folder
        downgrades = list(downgrades)
        try:
            sweep_shard_attempts(src / "lineage")     # stragglers of tasks already committed
            arrays = ArrayStore(src, run_uid=self.uid)
            store_uid = self.catalog.meta("store_uid")
            digests = {a.name: (contents or {}).get(a.name) or self._digest(arrays, a.name)
                       for a in stats.inputs}
            save_workflow(wf, src, digests, self.run_id)
            share.publish(arrays, digests, store_uid)
            rec = record.build(self.catalog.get_run(self.run_id), store_uid, stats, downgrades,
                               read_payload(src), arrays.sidecar_digests(), time.time(), digests,
                               {a.name: ref.key for a in stats.inputs
                                if (ref := arrays.ref(a.name)) is not None})
            data = record.write(src, rec)
            self._sign(src, data)
            _fsync_dir(src)
            os.replace(src, self.final)
            _fsync_dir(self.runs_dir)
            self._moved = True
        except BaseException as e:
            self.fail(e)
            raise
        try:
            with self.catalog.tx():
                record.insert_rows(self.catalog, rec)
        except BaseException as e:
            self.status = "committed"         # on disk, not in the catalog: recover() records it
            self._stop_heart()
            raise StoreError(f"run {self.run_id} is written to {self.final} but the catalog could not "
                             f"record it ({e}); `subzero fsck --store {self.runs_dir.parent}` "
                             f"records it") from e
        self.status = "complete"
        self._stop_heart()
        self._remove_attempts()
        for d in downgrades:
            warn(f"{d['reason']} (run {self.run_id} keeps what fits; see `subzero show {self.run_id}`)")

    @staticmethod
    def _digest(arrays: ArrayStore, name: str) -> str:
        """An input's content digest: its reference's when the run reads the store's copy,
        else from the run's stored copy."""
        ref = arrays.ref(name)
        return ref.digest if ref is not None else arrays.content_digest(name)

    def _sign(self, folder: Path, data: bytes) -> None:
        """Sign the run's record with this user's key (``storage.trust``), so that its code
        loads later without asking.  Without a usable key the run still completes,
        unsigned: it is then data until ``subzero trust`` accepts it."""
        try:
            sign_record(folder, data, self.run_id)
        except StoreError as e:
            warn(f"run {self.run_id} is not signed ({e}); trust it later with "
                 f"`subzero trust {self.runs_dir.parent} --run {self.run_id}`")

    def fail(self, error: BaseException | str) -> None:
        """Mark the run failed with ``error`` and remove its folders (a no-op once the
        run is complete or failed)."""
        if self.status != "running":
            return
        self.status = "failed"
        try:
            self.catalog.finish_run(self.run_id, "failed", failure_message(error))
        finally:
            self._stop_heart()
            shutil.rmtree(self.folder, ignore_errors=True)
            self._remove_attempts()

    def _remove_attempts(self) -> None:
        """Folders of instance-run attempts that failed or lost a race."""
        for stale in self.runs_dir.glob(f"{self.run_id}.partial-a*"):
            shutil.rmtree(stale, ignore_errors=True)

    def __enter__(self) -> RunTransaction:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.status == "running":
            try:
                self.fail(ev if ev is not None else "the run ended before it was committed")
            except Exception:
                if ev is None:
                    raise
                # the run's own error matters more; its row stays 'running', shown 'interrupted'


def recover(catalog: Catalog, runs_dir: Path, run_id: int) -> bool:
    """Record a run whose folder was committed (renamed into place, with its record) while
    its catalog row still says it is running: a crash between the rename and the catalog
    transaction.  True when it was recovered; False when the folder does not prove it
    is this run of this store (its record names another run or store, or is missing)."""
    final = Path(runs_dir) / str(run_id)
    if not final.is_dir() or final.is_symlink():
        return False
    rec = record.read(final)
    row = catalog.get_run(run_id)
    if rec is None or row.uid is None or rec["run"].get("uid") != row.uid \
            or rec.get("store") != catalog.meta("store_uid"):
        return False
    with catalog.tx():
        record.insert_rows(catalog, rec)
    heartbeat_path(runs_dir, run_id).unlink(missing_ok=True)   # its lost driver's
    return True


def _fsync_dir(path: Path) -> None:
    """Make a folder's entries durable: a step of the commit of its own, which the crash
    tests name (:func:`subzero.storage.files.fsync_dir`)."""
    fsync_dir(path)
