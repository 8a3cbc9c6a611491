"""Every error and warning SubZero raises, grouped by what the user can do about it.

Every exception class of the package is defined here, under :class:`SubZeroError`:

* :class:`UsageError` — what was asked is wrong (an argument, a name, options
  that do not go together): fix the call or the command.
* :class:`CodeError` — the workflow's code is wrong (its module or DAG, an
  operator that raised or wrote bad lineage): fix the workflow.
* :class:`StoreError` — the store or a run in it is missing, damaged, moved,
  untrusted or cannot be written: look at the store (``subzero runs``, ``show``,
  ``trust``), restore it, or use another.
* :class:`SetupError` — this machine cannot do it (Java, Spark, a cluster's
  workers): install or configure something.
* :class:`InternalSignal` — messages between SubZero's own parts (a Spark task's
  failure on its way to the driver, a re-execution that must read the whole
  array); never shown to a user.

The CLI prints an error's message as one line and exits with status 2, so
messages name the thing the user wrote (operator, array, cell, shape) and,
where it helps, what to do.  They speak Python: a parameter is named in
backquotes (```max_disk```, ```engine='spark'```), and the CLI shows the same
message with its flags (``--max-disk``, ``--engine spark``).  An error raised
because of another keeps it as its cause (``raise ... from err``), which
``--debug`` shows.
"""

from __future__ import annotations

import warnings


class SubZeroError(Exception):
    """A problem the user can fix; its message is shown as-is."""


# -- what was asked --------------------------------------------------------------------

class UsageError(SubZeroError):
    """An argument, option or name given is wrong (an unknown engine, options that do
    not go together): fix the call."""


class QueryError(UsageError):
    """A trace query is malformed: unknown run/array, bad cells, no path."""


class ContentError(UsageError):
    """An array whose content has no digest (an object array): it cannot be an input
    identified by content."""


class UnknownArray(QueryError):
    """An array name the run does not have (the explorer answers it with 404)."""


class StrategyError(UsageError):
    """A storage strategy is malformed or unsupported by an operator."""


class WorkloadError(UsageError):
    """A query workload file is malformed."""


class ExportError(UsageError):
    """An export cannot be written: an unknown format, a file that exists, a target
    that does not fit the answer."""


class InvalidEvent(ExportError):
    """An OpenLineage event failed its schema's validation."""


class OptimizerError(UsageError):
    """The optimizer cannot do what was asked (bad budget, pin, workload or statistics)."""


class BudgetError(OptimizerError):
    """A budget is malformed or impossible."""


# -- the workflow's code ---------------------------------------------------------------

class CodeError(SubZeroError):
    """The workflow's code is wrong: fix the workflow module or an operator."""


class WorkflowError(CodeError):
    """The workflow module or DAG is invalid."""


class OperatorError(CodeError):
    """An operator raised or misbehaved while running."""


class LineageError(CodeError):
    """An operator wrote invalid lineage (bad cells, wrong mode, bad payload)."""


# -- the store -------------------------------------------------------------------------

class StoreError(SubZeroError):
    """The store directory or a run in it is missing, damaged, untrusted or cannot be
    written."""


class CorruptArray(StoreError):
    """A stored array chunk fails its check: its bytes are damaged, or it is not the
    chunk its place names."""


class CorruptLineage(StoreError):
    """Stored lineage is missing or damaged (its checksum, size or layout is wrong)."""


class NewerLineageFormat(CorruptLineage):
    """Stored lineage written by a newer SubZero, in a format this one cannot read."""


class ChecksumMismatch(StoreError):
    """Bytes read back do not match the checksum stored with them."""


class UnsafeFile(StoreError):
    """A file of the store is not what a read of it needs: a symbolic link, not a
    regular file (a FIFO, a device, a folder), or larger than any file SubZero writes
    there.  Damage of what the file holds: the caller reports it as its own error
    (:class:`CorruptArray`, :class:`CorruptLineage`, an untrusted run...)."""


class ChangedConstant(StoreError):
    """A run's code rebuilt from its workflow module does not build the array the run
    used (its module or a file the module reads changed since): loading it would give
    other answers, so it is refused."""


class DiskFull(StoreError):
    """The disk (file system) holding the store has no space left for what was being
    written: free some space, or give a store on another disk."""


class UntrustedRun(StoreError):
    """A run's code (its operators) may not be loaded: its signature does not verify
    with this user's key (see ``subzero trust``)."""


# -- this machine ----------------------------------------------------------------------

class SetupError(SubZeroError):
    """This machine cannot do it: install or configure something."""


class SparkError(SetupError):
    """Spark or Java is unusable (missing, unreachable, failed)."""


# -- between SubZero's parts -----------------------------------------------------------

class InternalSignal(SubZeroError):
    """A message between SubZero's own parts; caught where it is meant to be, never
    shown to a user (one that escapes is a bug)."""


class TaskFailed(InternalSignal):
    """Raised inside a Spark task: its text is one line of JSON describing the failure
    (:class:`subzero.engines.spark.failures.TaskFailure`), which the driver turns back
    into the error it stands for."""


class WorkerTraceback(InternalSignal):
    """The traceback of a failure in another process (a Spark task), kept as the
    ``__cause__`` of the error raised here, so ``--debug`` shows where it began."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]) if self.args else ""


class Deadline(InternalSignal):
    """A step's method took longer than the planner allowed it: the step switches to
    another method."""


class WholeArray(InternalSignal):
    """A tile-limited re-execution must read the whole array instead."""


class ParentUnavailable(InternalSignal):
    """A re-run cannot reuse what its parent run stored of an operator (its lineage is
    not stored in a form that reads back, or fails its checks): the operator runs every
    tile again."""


# -- warnings --------------------------------------------------------------------------

class SubZeroWarning(UserWarning):
    """Something the user should know that did not stop the work: stored lineage
    found damaged and answered another way, a strategy downgraded to fit the disk
    budget, an engine fallback.  The CLI prints it as ``subzero: warning: ...``."""


def warn(message: str) -> None:
    """Issue a :class:`SubZeroWarning` (``warnings`` filters apply: tests turn them
    into errors, an application may log or silence them)."""
    warnings.warn(message, SubZeroWarning, stacklevel=2)
