"""An operator's failure inside a Spark task, as a typed record that crosses the
process boundary and becomes, on the driver, the error the in-process engine
would have raised — with the worker's traceback kept as its cause.

Why a record in the exception: a Python exception raised in a Spark task reaches
the driver only as text (PySpark's worker sends ``traceback.format_exc()`` to the
JVM, which wraps it in a ``Py4JJavaError``).  The task must still *raise*, so
that Spark retries an attempt that failed for a passing reason (an executor
lost, a file system hiccup).  So the task raises :class:`TaskFailed`, whose text
is one line of versioned JSON — a :class:`TaskFailure` — and the driver decodes
that line back (:meth:`TaskFailure.from_spark`) instead of guessing from prose.
Spark's own failures (a worker that cannot import a module, a JVM error) carry
no record; :func:`subzero.engines.spark.jobs.raise_from_spark` reads those.
"""

from __future__ import annotations

import json
import re
import traceback
from dataclasses import asdict, dataclass

from subzero import errors
from subzero.errors import OperatorError, SubZeroError, TaskFailed, WorkerTraceback

#: version of the record's JSON (a driver reads only its own)
VERSION = 1
#: the worker's traceback kept in a record, at most (the end is what says why)
TRACEBACK_CHARS = 8000
#: a traceback's last line for a TaskFailed: ``[module.]TaskFailed: {json}``
_RECORD_LINE = re.compile(r"^(?:[\w.]+\.)?TaskFailed: (\{.*\})\s*$", re.MULTILINE)


@dataclass(frozen=True)
class TaskFailure:
    """What failed in a task, in the user's terms: plain data, one JSON line on the wire."""

    operator: str        # the operator's name ("(input raw)" while loading inputs)
    where: str           # "tile [0:512, 0:512]", "the whole array"
    error: str           # the SubZeroError subclass raised in the task, or "" for any other
    kind: str            # the exception's own type name (ValueError, OperatorError...)
    message: str         # str() of the exception
    traceback: str = ""  # the worker's traceback, for --debug

    @classmethod
    def of(cls, operator: str, where: str, exc: BaseException) -> TaskFailure:
        error = type(exc).__name__ if isinstance(exc, SubZeroError) else ""
        tb = "".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:]
        return cls(operator, where, error, type(exc).__name__, str(exc), tb)

    def to_json(self) -> str:
        return json.dumps({"v": VERSION, **asdict(self)}, ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str) -> TaskFailure | None:
        try:
            d = json.loads(text)
        except ValueError:
            return None
        if not isinstance(d, dict) or d.pop("v", None) != VERSION:
            return None
        try:
            return cls(**{k: str(v) for k, v in d.items()})
        except TypeError:
            return None

    @classmethod
    def decode(cls, exc: TaskFailed) -> TaskFailure:
        """The record a :class:`TaskFailed` raised in this process carries (the tasks'
        code run on the driver, e.g. to probe an output's dtype)."""
        got = cls.from_json(str(exc))
        return got if got is not None else cls("(unknown)", "(unknown)", "", "TaskFailed", str(exc))

    @classmethod
    def from_spark(cls, text: str) -> TaskFailure | None:
        """The record of the last :class:`TaskFailed` in a Spark error's text, or None
        when the failure was not an operator's (Spark's own, a worker's import error).
        The record is the exception's line of the worker's traceback: it starts a line
        (a message that quotes such a record sits inside the JSON, never at a line's
        start)."""
        found = None
        for m in _RECORD_LINE.finditer(text):
            got = cls.from_json(m.group(1))
            found = got if got is not None else found
        return found

    def to_error(self) -> SubZeroError:
        """The error the in-process engine raises for the same failure, naming the
        operator and the tile, with the worker's traceback as its cause."""
        if self.error:
            text = self.message
        else:
            text = f"operator {self.operator!r} failed: {self.kind}: {self.message}"
        # where it ran, and no hint: the operator fails the same way in-process
        text = f"{text} (on {self.where}, in a Spark task)"
        cls = getattr(errors, self.error, None) if self.error else None
        if not (isinstance(cls, type) and issubclass(cls, SubZeroError)):
            cls = OperatorError
        try:
            err = cls(text)
        except TypeError:                   # a class that needs more than a message
            err = OperatorError(text)
        err.__cause__ = WorkerTraceback(self.traceback or f"{self.kind}: {self.message}")
        return err


def failed(operator: str, where: str, exc: BaseException) -> TaskFailed:
    """The exception a task raises for ``exc`` (raise it ``from None``: the record
    already carries the traceback)."""
    return TaskFailed(TaskFailure.of(operator, where, exc).to_json())


def python_error(text: str) -> str:
    """``Type: message`` of the last Python traceback in a Spark error's text (a worker's
    exception, e.g. a module it cannot import), or empty when there is none."""
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return ""
    for ln in text[at:].splitlines()[1:]:
        if ln.strip() and not ln[:1].isspace():
            return ln.strip()[:300]
    return ""
