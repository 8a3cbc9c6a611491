"""Whether a ``running`` run is still being written, from any host.

The driver of a run touches ``runs/<id>.heartbeat`` every
:data:`~subzero.tuning.HEARTBEAT_S` seconds from a background thread.  On the
driver's own host its pid answers at once (a dead pid is a lost run); from
another host -- a store on a shared file system, seen from a login node while a
cluster's driver runs elsewhere -- the heartbeat's age answers: older than
:data:`~subzero.tuning.HEARTBEAT_STALE_S`, the run was lost.  A lost run is
reported ``interrupted`` and can be resumed (``subzero run --resume``) or
removed (``subzero clean``).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from subzero.tuning import HEARTBEAT_S, HEARTBEAT_STALE_S


def heartbeat_path(runs_dir: str | os.PathLike, run_id: int) -> Path:
    return Path(runs_dir) / f"{int(run_id)}.heartbeat"


def alive(pid: int | None, host: str | None, beat: Path | None, now: float | None = None) -> bool:
    """Whether the driver that wrote ``pid``/``host`` (and beats ``beat``) still runs."""
    if pid is not None and host == os.uname().nodename:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        age = (time.time() if now is None else now) - beat.stat().st_mtime  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return True     # a run from before heartbeats, on another host: cannot tell
    return age < HEARTBEAT_STALE_S


def beat(path: Path) -> None:
    """Touch one heartbeat file (its content says who beats it, for people)."""
    try:
        path.write_text(f"{os.uname().nodename} {os.getpid()} {time.time():.0f}\n")
    except OSError:
        pass        # a full or vanished store: the run itself will say so


class Heartbeat:
    """A daemon thread beating the heartbeat files of this process's running runs.

    One per run (``RunTransaction`` owns it); an instance-parallel run's driver
    beats all its instances' files with one."""

    def __init__(self, every: float = HEARTBEAT_S):
        self.every = every
        self._paths: set[Path] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, path: Path) -> None:
        beat(path)
        with self._lock:
            self._paths.add(path)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="subzero-heartbeat",
                                                daemon=True)
                self._thread.start()

    def discard(self, path: Path) -> None:
        """Stop beating ``path`` and remove it (its run is complete or failed)."""
        with self._lock:
            self._paths.discard(path)
        path.unlink(missing_ok=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                paths = list(self._paths)
            for p in paths:
                beat(p)

    def close(self) -> None:
        self._stop.set()
