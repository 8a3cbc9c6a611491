"""What a long optimizer call is doing, told on stderr.

A first ``subzero optimize`` calibrates the machine and profiles the workflow
before it can choose anything: tens of seconds that would otherwise pass in
silence.  :class:`Progress` prints one line per step and a tqdm bar with the
time left where a step has countable work.  It is quiet when stderr is not a
terminal (``enabled=None``, the default of the CLI), when asked to be
(``False``, e.g. ``--json``), and in library calls that pass nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Union

#: Shown for weighted bars, whose units are not worth printing.
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}"

#: What callers may pass as ``progress``: a Progress, True / False / None (on / off /
#: on when stderr is a terminal), or a function called once per unit of work (the
#: older form of the argument).
ProgressArg = Union["Progress", bool, None, Callable[[], None]]


class Progress:
    """Step lines and progress bars on stderr, or nothing."""

    def __init__(self, enabled: bool | None = None, tick: Callable[[], None] | None = None):
        self.on = bool(enabled) if enabled is not None else _is_terminal()
        self._tick = tick

    @classmethod
    def of(cls, progress: ProgressArg) -> Progress:
        """The Progress a caller's ``progress`` argument means."""
        if isinstance(progress, Progress):
            return progress
        if callable(progress):
            return cls(False, tick=progress)
        return cls(progress)

    def note(self, text: str) -> None:
        """One line: the step that starts now."""
        if self.on:
            from tqdm import tqdm
            tqdm.write(f"subzero: {text}", file=sys.stderr)

    @contextmanager
    def bar(self, desc: str, total: float, unit: str | None = None) -> Iterator[Callable[[float], None]]:
        """A bar of ``total`` units; yields ``advance(n=1)``.  Without ``unit`` the
        units are weights (estimated shares of the time), shown as a percentage.  tqdm
        is imported only to show a bar (40 ms of a quiet budget run's start)."""
        if not self.on:
            def tick(n: float = 1) -> None:
                if self._tick is not None:
                    self._tick()
            yield tick
            return
        from tqdm import tqdm
        b = tqdm(total=total, desc=desc, unit=unit or "it", file=sys.stderr, leave=False,
                 bar_format=None if unit else BAR_FORMAT, dynamic_ncols=True)

        def advance(n: float = 1) -> None:
            b.update(n)
            if self._tick is not None:
                self._tick()
        try:
            yield advance
        finally:
            b.close()


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):      # replaced or closed stderr
        return False
