"""The calibration's observations: each step traced by one method and timed in CPU
seconds (:func:`observe`), and every observation of a calibration made by fresh observer
processes side by side (:func:`observe_all`), with the fresh child processes the
calibration also measures in (:class:`Child`).  An observer is a ``subzero`` command's
process as far as timing goes (a steady heap, its first uses warmed up), whoever calls
the calibration; what an observer does not answer is observed in the caller's process."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np

from subzero.heap import release
from subzero.model.cellset import CellSet
from subzero.query.planner import blocks_spanned, runs_of
from subzero.tuning import CALIBRATION_OBSERVERS, OBSERVER_SILENCE_S, SLOW_OBSERVATION_S

from .stats import median


def number(x) -> bool:
    """A finite int or float, not a bool: what a timing read back from JSON must be."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def observe(run, start, cells, op, method, prefer, repeats):
    """One step by one method, timed ``repeats`` times or until its timings add up to
    ``SLOW_OBSERVATION_S`` (a slow step's timer noise is small and calibration time is
    not); the median is kept.  Each timing is the CPU seconds of the trace (a query step is CPU
    work: decoding, set operations, ``map_p``), or the step's wall seconds when lower
    (threads sharing the work): on a busy machine the wall clock also counts the time
    other processes held the core, and a model fitted on that prices every step as the
    load of the moment."""
    bm = np.zeros(run.shapes()[start], bool)
    bm[tuple(cells.T)] = True
    blocks = blocks_spanned(bm)
    runs = runs_of(CellSet.of_bitmap(bm))
    times: list[float] = []
    first = None
    for _ in range(repeats):
        if sum(times) > SLOW_OBSERVATION_S:
            break
        run.executor().clear_cache()
        release()          # fresh pages, as a trace's query has (heap.py)
        c0 = time.process_time()
        res = run.trace(start, cells, path=[(op, 0)], prefer=prefer, record=False)
        cpu = time.process_time() - c0
        st = res.steps[0]
        ok = st.method == method if method != "reexec" else st.method.startswith("reexec")
        if not ok:
            return None
        times.append(min(st.seconds, cpu))
        if first is None:
            first = {"op": op, "method": st.method, "input": 0, "direction": st.direction,
                     "cells_in": st.cells_in, "cells_out": st.cells_out,
                     "blocks_in": blocks, "runs_in": runs}
    assert first is not None
    return {**first, "seconds": median(times)}


def observe_task(runs, task: dict, cells: np.ndarray, repeats: int) -> list:
    """One task's observations, a method each (None where the trace took another)."""
    return [observe(runs[task["run"]], task["start"], cells, task["op"], method, prefer, repeats)
            for method, prefer in task["methods"]]


def _warm_up(runs, tasks: list[dict], queries, warm_op: str) -> None:
    """Trace one cell of ``warm_op``'s steps once, untimed, by every method the tasks use
    (stored strategies in their own direction): a fresh process's first trace by a method
    runs code, and makes imports, that every later one reuses, which the calibration
    must not charge to the step that happens to come first.  The readers and the
    lineage store each step opens are first uses its timing leaves out already
    (``query.warmup``); warming up every operator's readers too cost 1.3 s a process."""
    seen = set()
    for task in tasks:
        if task["op"] != warm_op:
            continue
        backward = task["start"] == task["op"]
        for method, prefer in task["methods"]:
            if method.startswith("stored:") and method.endswith(":backward") != backward:
                continue
            if (task["run"], method) not in seen:
                seen.add((task["run"], method))
                observe(runs[task["run"]], task["start"], queries[task["i"]][:1], task["op"],
                        method, prefer, 1)


_OBSERVER_CODE = """
import sys
from subzero.optimizer.observers import observer_main
observer_main(sys.argv[1:], sys.stdin, sys.stdout)
"""


def observer_main(argv: list[str], tasks_in, out) -> None:
    """A calibration observer's process (:func:`observe_all`): ``argv`` is the store's
    path, the runs' ids, the queries' file, the tasks (JSON), the repeats and the operator
    whose steps warm it up (:func:`_warm_up`).  Observes the tasks whose indices come a
    line each on ``tasks_in`` and writes one line of JSON per task to ``out`` as it is
    done, until ``tasks_in`` ends."""
    import subzero
    from subzero.heap import steady
    steady()                       # as the command line's own process does
    path, ids, qfile, tasks_json, repeats, warm_op = argv
    store = subzero.open_store(path, create=False)
    try:
        runs = [store.get(int(r)) for r in ids.split(",")]
        tasks = json.loads(tasks_json)
        with np.load(qfile) as got:
            queries = [got[f"arr_{t['i']}"] for t in tasks]
        _warm_up(runs, tasks, queries, warm_op)
        out.write("ready\n")
        out.flush()
        for line in tasks_in:
            task = tasks[int(line)]
            obs = observe_task(runs, task, queries[task["i"]], int(repeats))
            out.write(json.dumps({"i": task["i"], "obs": obs}, default=_plain) + "\n")
            out.flush()
    finally:
        store.close()


def _plain(x):
    """numpy's scalars as JSON numbers."""
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"{type(x).__name__} is not JSON")


class _Observer:
    """One observer process as :func:`observe_all` drives it: tasks sent (a line each on
    its standard input), lines read back as they come (its output read in raw chunks:
    a buffered reader can hold lines the selector no longer signals)."""

    def __init__(self, child: Child):
        self.child = child
        self.sent: set[int] = set()
        self.buf = b""
        self.ready = False
        #: it wrote a line that is not the answer to a task it was given
        self.failed = False
        self.alive = child.stdout is not None and child.stdin is not None

    def send(self, i: int) -> bool:
        try:
            self.child.stdin.write(f"{i}\n")
            self.child.stdin.flush()
        except (OSError, ValueError):          # it died: what it had is observed elsewhere
            self.alive = False
            return False
        self.sent.add(i)
        return True

    def lines(self) -> list[str] | None:
        """The whole lines it has written since the last call; None at its end."""
        chunk = os.read(self.child.stdout.fileno(), 1 << 16)
        if not chunk:
            self.alive = False
            return None
        *done, self.buf = (self.buf + chunk).split(b"\n")
        return [d.decode(errors="replace") for d in done]

    def close(self) -> None:
        try:
            self.child.stdin.close()
        except (OSError, ValueError, AttributeError):
            pass


def observe_all(store, runs, tasks: list[dict], queries: list[np.ndarray], repeats: int,
                folder: Path, advance, warm_op: str) -> list[dict]:
    """Every task's observations, made by ``CALIBRATION_OBSERVERS`` fresh processes side by
    side (each times its own CPU seconds, so they need not wait for each other: 17 s of
    observations took about 10 s on two cores), each set up as a command's own (a steady heap,
    first uses warmed up), whoever calls the calibration.  Tasks are handed out one at a
    time, heaviest first, to whichever observer is free: their weights are a rough guess
    of their time.  An observer that writes anything but the answer to a task it was
    given is stopped there.  A task no observer answered (one failed to start, crashed,
    wrote something else or fell silent for ``OBSERVER_SILENCE_S``) is observed in this
    process instead.  In the tasks' order, whoever made them."""
    import selectors
    import subprocess
    np.savez(folder / "queries.npz", *queries)          # arr_<i>: task i's cells
    ids = ",".join(str(r.id) for r in runs)
    spec = json.dumps([{k: t[k] for k in ("i", "run", "op", "start", "methods")} for t in tasks])
    observers = [_Observer(Child(_OBSERVER_CODE, str(store.path), ids, str(folder / "queries.npz"),
                                  spec, str(repeats), warm_op, stderr=False, stdin=subprocess.PIPE))
                 for _ in range(max(1, min(CALIBRATION_OBSERVERS, os.cpu_count() or 1, len(tasks))))]
    pending = sorted(range(len(tasks)), key=lambda i: -tasks[i]["weight"])
    got: dict[int, list] = {}
    sel = selectors.DefaultSelector()
    for ob in observers:
        if ob.alive:
            sel.register(ob.child.stdout, selectors.EVENT_READ, ob)
    try:
        while sel.get_map():
            events = sel.select(timeout=OBSERVER_SILENCE_S)
            if not events:              # an observer stuck: the rest is observed here
                break
            for key, _ in events:
                ob = key.data
                lines = ob.lines()
                for line in lines or []:
                    if line == "ready" and not ob.ready:    # warmed up: two tasks, so it never waits
                        ob.ready = True
                        for _ in range(2):
                            if pending:
                                ob.send(pending.pop(0))
                        continue
                    i, obs = _observer_line(line, tasks)
                    if i is None or i not in ob.sent:        # not an answer: it is not trusted
                        ob.failed = True
                        break
                    got[i] = obs
                    ob.sent.discard(i)
                    advance(tasks[i]["weight"])
                    if pending:
                        ob.send(pending.pop(0))
                if not ob.sent and not pending:
                    ob.close()
                if lines is None or not ob.alive or ob.failed:
                    sel.unregister(key.fileobj)
                    pending.extend(i for i in ob.sent if i not in got)
                    ob.sent.clear()
                    if ob.failed:
                        ob.close()
                        ob.child.stop()
    finally:
        sel.close()
        for ob in observers:
            ob.close()
            ob.child.stop(grace=0.0 if ob.alive else 5.0)   # alive now: stuck or never read
    left = [t for t in tasks if t["i"] not in got]
    if left:
        _warm_up(runs, left, queries, warm_op)
    for task in left:
        got[task["i"]] = observe_task(runs, task, queries[task["i"]], repeats)
        advance(task["weight"])
    return [o for t in tasks for o in got[t["i"]] if o is not None]


def _observer_line(line: str, tasks: list[dict]) -> tuple[int | None, list]:
    """(task index, its observations) from one line an observer printed; (None, []) when
    it is not one: a task of another index, another number of methods, or not JSON."""
    try:
        row = json.loads(line)
        i, obs = row["i"], row["obs"]
        ok = (isinstance(i, int) and 0 <= i < len(tasks) and isinstance(obs, list)
              and len(obs) == len(tasks[i]["methods"])
              and all(o is None or (isinstance(o, dict) and number(o.get("seconds"))) for o in obs))
    except (ValueError, TypeError, KeyError):
        return None, []
    return (i, obs) if ok else (None, [])


class Child:
    """A fresh Python process running ``code`` with ``args``, started when made and read
    with :meth:`json` (or line by line from :attr:`stdout`): the calibration's
    fresh-process measurements run side by side (each times its own CPU seconds, so
    they need not wait for each other).  ``stderr=False`` discards what it says there
    (a pipe nobody reads until the end could fill and stop it)."""

    def __init__(self, code: str, *args: str, stderr: bool = True, stdin=None):
        import subprocess
        import sys
        self._got = None
        try:
            self._p: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stdin=stdin,
                stderr=subprocess.PIPE if stderr else subprocess.DEVNULL, text=True)
        except OSError:
            self._p = None

    @property
    def stdout(self):
        """The child's standard output, None when it did not start."""
        return None if self._p is None else self._p.stdout

    @property
    def stdin(self):
        """The child's standard input (a pipe when made with one), None when it did not start."""
        return None if self._p is None else self._p.stdin

    def stop(self, grace: float = 0.0) -> None:
        """Wait up to ``grace`` seconds for the child to end, kill it if it has not, and
        close its pipes."""
        import subprocess
        if self._p is not None:
            p, self._p = self._p, None
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
            for f in (p.stdin, p.stdout, p.stderr):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass
            p.wait()

    def json(self, timeout: float = 120.0):
        """What the child printed on its last line, read as JSON; None when it failed (the
        calibration then goes on without what it measured) or had not ended within
        ``timeout`` seconds (it is then killed).  Waits for it the first time."""
        import subprocess
        if self._p is not None:
            p, self._p = self._p, None
            try:
                out, _ = p.communicate(timeout=timeout)
                self._got = json.loads(out.strip().splitlines()[-1]) if p.returncode == 0 else None
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            except (ValueError, IndexError):
                pass
        return self._got

    def cpu_s(self, timeout: float = 120.0) -> float:
        """The CPU seconds the child printed (0.0 when it failed or had not ended within
        ``timeout`` seconds): what a command-line trace pays once, for a first use a warm
        process paid long ago."""
        got = self.json(timeout)
        return max(0.0, float(got)) if isinstance(got, (int, float)) else 0.0
