"""Is this machine too busy to calibrate on?  A calibration is made of timings; on
a machine whose cores are taken by other work, wall-clock timings stretch by
however long the scheduler kept the calibration waiting, and a cost model fitted
on them prices every step as the load of that moment (issue 33: a plan chosen on
a loaded machine was many times slower than the defaults on a quiet one).

The calibration therefore times CPU work in CPU seconds (``time.process_time``),
which waiting does not inflate.  What is left to detect is that the machine was
busy at all, since CPU time still moves somewhat with load (shared caches, memory
bandwidth) and I/O is not CPU work: :func:`cpu_share` spins a short loop and
compares the CPU time it got with the wall time it took.  A share well under one
core means other processes were running on ours.
"""

from __future__ import annotations

import os
import time

from subzero.tuning import BUSY_PROBE_S, BUSY_SHARE


def cpu_share(seconds: float = BUSY_PROBE_S) -> float:
    """The share of one core this process got while spinning for ``seconds`` of wall
    time (1.0 on an idle core; 0.5 when another process took half of it)."""
    c0, w0 = time.process_time(), time.perf_counter()
    x = 0
    while time.perf_counter() - w0 < seconds:
        for k in range(2000):
            x ^= k
    wall = time.perf_counter() - w0
    return min(1.0, (time.process_time() - c0) / wall) if wall > 0 else 1.0


def probe() -> dict:
    """This moment's load: the CPU share a spinning loop got, and the load average per
    core (``os.getloadavg``, where the system has one)."""
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        per_core = float("nan")
    return {"cpu_share": cpu_share(), "load_per_core": per_core}


def summarise(probes: list[dict]) -> dict:
    """The calibration's load: the lowest CPU share and highest load per core over its
    probes, and whether that is too busy (a share under ``BUSY_SHARE``)."""
    share = min(p["cpu_share"] for p in probes)
    load = max((p["load_per_core"] for p in probes if p["load_per_core"] == p["load_per_core"]),
               default=float("nan"))
    return {"cpu_share": share, "load_per_core": load, "busy": share < BUSY_SHARE}


def warning(load: dict) -> str | None:
    """One line for the user when the calibration ran on a busy machine, else None."""
    if not load.get("busy"):
        return None
    per_core = load.get("load_per_core", float("nan"))
    avg = (f", load average {per_core * (os.cpu_count() or 1):.1f} on {os.cpu_count()} cores"
           if per_core == per_core else "")
    return (f"this machine was busy while calibrating (the calibration got "
            f"{load['cpu_share']:.0%} of a core{avg}); CPU work was timed in CPU seconds, but "
            f"run `subzero optimize --recalibrate` on a quieter machine to be sure of the plan")
