"""What a run tells the user while it works: operators done and, for Spark tile
jobs, tiles done, each with the time left.

A reporter is an object handed to the driver loop (and by it to the engine),
never global state, so a test can hand in its own and see what it received.
:class:`Progress` itself is the silent reporter; :class:`Bars` draws tqdm bars
on stderr.  :func:`progress_for` turns the API's ``progress=`` argument into a
reporter: bars on a terminal, silence elsewhere or when asked.
"""

from __future__ import annotations

import sys
from typing import IO, Any


class Progress:
    """A run's progress reporter; this base class reports nothing.

    The driver calls :meth:`begin` once, then :meth:`started` and
    :meth:`finished` around every operator (or workflow instance); an engine
    that runs an operator as many tasks calls :meth:`tiles` as they finish
    (possibly from another thread, never after :meth:`finished`)."""

    #: whether :meth:`tiles` is worth calling: following a Spark job's tasks costs a thread
    wants_tasks: bool = False

    def begin(self, total: int, desc: str, unit: str = "op") -> None:
        """``total`` operators (or instances, ``unit``) are about to run."""

    def started(self, name: str) -> None:
        """Operator (or instance) ``name`` starts."""

    def tiles(self, done: int, total: int) -> None:
        """``done`` of the running operator's ``total`` tile tasks have finished."""

    def finished(self, name: str) -> None:
        """Operator (or instance) ``name`` is done."""

    def close(self) -> None:
        """The run is over (complete or failed): take any bars off the terminal."""


class Bars(Progress):
    """Two tqdm bars on stderr: operators done of the workflow's, and the tiles of
    the Spark job that is running; tqdm shows the time left of each."""

    wants_tasks = True

    def __init__(self, file: IO[str] | None = None, mininterval: float = 0.1):
        self.file = file
        self.mininterval = mininterval      # seconds between redraws (tqdm's)
        self._main: Any = None
        self._tiles: Any = None

    def begin(self, total: int, desc: str, unit: str = "op") -> None:
        from tqdm import tqdm
        self.close()
        self._main = tqdm(total=total, desc=desc, unit=unit, file=self.file or sys.stderr,
                          leave=False, dynamic_ncols=True, mininterval=self.mininterval)

    def started(self, name: str) -> None:
        if self._main is not None:
            self._main.set_postfix_str(name)

    def tiles(self, done: int, total: int) -> None:
        from tqdm import tqdm
        if self._tiles is None:
            self._tiles = tqdm(total=total, desc="  tiles", unit="tile", file=self.file or sys.stderr,
                               leave=False, dynamic_ncols=True, position=1,
                               mininterval=self.mininterval)
        elif self._tiles.total != total:
            self._tiles.total = total
        if done > self._tiles.n:
            self._tiles.update(done - self._tiles.n)

    def finished(self, name: str) -> None:
        if self._tiles is not None:
            self._tiles.close()
            self._tiles = None
        if self._main is not None:
            self._main.update(1)

    def close(self) -> None:
        for bar in (self._tiles, self._main):
            if bar is not None:
                bar.close()
        self._tiles = self._main = None


def progress_for(setting: bool | Progress | None) -> Progress:
    """The reporter for the API's ``progress=``: a reporter is used as given;
    ``None`` draws bars only when stderr is a terminal; ``True`` always draws them;
    ``False`` is silent."""
    if isinstance(setting, Progress):
        return setting
    if setting is None:
        setting = _is_terminal(sys.stderr)
    return Bars() if setting else Progress()


def _is_terminal(f: IO[str]) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError):
        return False
