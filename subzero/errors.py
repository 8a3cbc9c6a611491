"""Errors raised for user mistakes.

Every error a user can cause derives from :class:`SubZeroError`; the CLI prints
its message as one line and exits non-zero, so messages must name the thing the
user wrote (operator, array, cell, shape) and, where it helps, what to do.
"""

from __future__ import annotations

import warnings


class SubZeroError(Exception):
    """A problem the user can fix; its message is shown as-is."""


class UsageError(SubZeroError):
    """An argument, option or name given is wrong (an unknown engine, options that do
    not go together): fix the call."""


class WorkflowError(SubZeroError):
    """The workflow module or DAG is invalid."""


class OperatorError(SubZeroError):
    """An operator raised or misbehaved while running."""


class LineageError(SubZeroError):
    """An operator wrote invalid lineage (bad cells, wrong mode, bad payload)."""


class StrategyError(SubZeroError):
    """A storage strategy is malformed or unsupported by an operator."""


class QueryError(SubZeroError):
    """A trace query is malformed: unknown run/array, bad cells, no path."""


class StoreError(SubZeroError):
    """The store directory or a run in it is missing or damaged."""


class SubZeroWarning(UserWarning):
    """Something the user should know that did not stop the work: stored lineage
    found damaged and answered another way, a strategy downgraded to fit the disk
    budget, an engine fallback.  The CLI prints it as ``subzero: warning: ...``."""


def warn(message: str) -> None:
    """Issue a :class:`SubZeroWarning` (``warnings`` filters apply: tests turn them
    into errors, an application may log or silence them)."""
    warnings.warn(message, SubZeroWarning, stacklevel=2)


class WorkerTraceback(SubZeroError):
    """The traceback of a failure in another process (a Spark task), kept as the
    ``__cause__`` of the error raised here, so ``--debug`` shows where it began."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]) if self.args else ""


class TaskFailed(SubZeroError):
    """Raised inside a Spark task: its text is one line of JSON describing the failure
    (:class:`subzero.engines.spark.failures.TaskFailure`), which the driver turns back
    into the error it stands for.  Never shown to a user."""


class SparkError(SubZeroError):
    """Spark or Java is unusable (missing, unreachable, failed)."""
