"""User code that tries to end the process: ``sys.exit`` in a workflow module or an
operator, or a ``KeyboardInterrupt`` it raises itself.

Neither is the user's wish to stop SubZero: ``SystemExit`` from a module imported
by ``subzero run --json`` made it exit 0 with no output and no run, and from an
operator exit with nothing said; a ``KeyboardInterrupt`` an operator raises was
reported as "interrupted".  The places that run user code (loading a workflow,
running an operator) turn them into the error of that code, naming it.

A real Ctrl-C must stay a Ctrl-C, though.  Python raises it from its signal
handler at whatever instruction the main thread is running (a loop's jump, a
call that waited); a ``raise`` statement is an instruction of its own.  So
:func:`raised_by_code` looks at the instruction the exception left its innermost
frame from -- unless the SIGINT handler in force is Python code that raised it
(PySpark installs one), which its frame in the traceback shows.
"""

from __future__ import annotations

import dis
import signal

_RAISE = {dis.opmap["RAISE_VARARGS"]}


def raised_by_code(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a ``raise`` statement of the code that ran, not
    delivered by a signal (a Ctrl-C) while it ran: by Python's own handler (no
    ``raise`` instruction) or by a SIGINT handler written in Python (PySpark's, which
    raises KeyboardInterrupt itself: its frame is in the traceback)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    handler = signal.getsignal(signal.SIGINT)
    handler_code = getattr(getattr(handler, "__func__", handler), "__code__", None)
    while True:
        if handler_code is not None and tb.tb_frame.f_code is handler_code:
            return False
        if tb.tb_next is None:
            break
        tb = tb.tb_next
    code = tb.tb_frame.f_code.co_code
    return 0 <= tb.tb_lasti < len(code) and code[tb.tb_lasti] in _RAISE


def ends_process(exc: BaseException) -> bool:
    """Whether ``exc`` is user code trying to end the process: ``SystemExit``, or a
    ``KeyboardInterrupt`` it raised itself (:func:`raised_by_code`)."""
    if isinstance(exc, SystemExit):
        return True
    return isinstance(exc, KeyboardInterrupt) and raised_by_code(exc)


def described(exc: BaseException) -> str:
    """What the code did, in a user's words: ``called sys.exit(0)``, ``raised
    KeyboardInterrupt``."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    return f"raised {type(exc).__name__}" + (f": {exc}" if str(exc) else "")
