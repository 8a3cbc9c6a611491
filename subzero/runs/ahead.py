"""Lineage a run made from its profiling run stores, encoded ahead in a forked child.

A run made from its profiling run (:mod:`subzero.runs.planned`) computes nothing: it
links the profiling run's arrays, copies the strategies both runs store, and encodes
the plan's others from the pairs the profiler kept.  Those encodes were most of its
time (12 of 18 s at genomics 10,000x), one after another in the run's process while
the machine's other core was idle.  So a child forked as the run begins encodes about
half their cells, the largest of them first
(:func:`~subzero.storage.lineage.prepare_strategy`: everything but the sealing and the
puts), and leaves each in a file as soon as it is done; the run encodes the first ones
itself meanwhile, and takes each of the child's when it reaches its operator
(``Parent.ahead``), to seal and store it in its own transaction.

The child works on the same pairs, cut the same way (``Parent.pairs``), as the run would
encode: what it hands over is what the run would have made.  A strategy it did not leave
(it failed, died, or stopped using the CPU for ``BESIDE_STALL_S``, stuck on a lock it
inherited) is encoded by the run itself: never another answer, at worst the time it took
before.  A Many encoding's R-tree files are built in the child's folder and moved into
the run's by its write; Comp (its covered cells) is always encoded by the run.  A
payload strategy keyed forward is encoded with the operator's ``map_p`` in the child,
which brings back what it expanded to (the run's statistics of it) with the blocks.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Mapping, Sequence

from subzero.engines.lineage import map_p_counting
from subzero.engines.parent import Parent, keep_all
from subzero.forked import ChildWatch, fork_child
from subzero.model.modes import Mode
from subzero.model.strategy import Direction, Strategy
from subzero.model.workflow import Workflow
from subzero.scratch import Scratch, scratch
from subzero.storage.lineage import Prepared, prepare_strategy
from subzero.tuning import AHEAD_MAP_P_FACTOR, AHEAD_MIN_CELLS, BESIDE_POLL_S, BESIDE_STALL_S


def aheadable(s: Strategy) -> bool:
    """Whether a strategy's encoding can be made ahead and handed over: blocks, and a
    Many encoding's R-tree files; not Comp's covered cells."""
    return bool(s.stored and s.mode is not Mode.COMP)


class EncodedAhead:
    """The child encoding some of a made run's strategies (see the module's docstring):
    ``jobs``, (operator, strategy text) -> the number of its file in ``folder``;
    ``pid``, the child's (``BESIDE_STALL_S`` without CPU time, and it is killed).
    Called as ``Parent.ahead``: ``(operator, strategy)`` -> its encoding, or None (the
    run encodes it)."""

    def __init__(self, held: Scratch, jobs: Mapping[tuple[str, str], int], pid: int):
        self.held = held
        self.folder = held.path
        self.jobs = dict(jobs)
        self.child = ChildWatch(pid, BESIDE_STALL_S)

    @classmethod
    def start(cls, parent: Parent, wf: Workflow, strategies: Mapping[str, Sequence[Strategy]],
              cores: int, min_cells: int | None = None) -> EncodedAhead | None:
        """Fork the child for the strategies of ``strategies`` (the plan's, per operator)
        that the run will encode from the profiler's pairs (``parent.side``) and not copy
        from the parent's lineage, when there are two or more, holding ``min_cells``
        (by default ``AHEAD_MIN_CELLS``) cells or more, and two cores; None else."""
        todo: list[tuple[str, Strategy, int]] = []
        for name in wf.steps:
            for s in strategies.get(name, ()):
                pairs = parent.side.get((name, s.mode.value))
                if pairs is None or not aheadable(s) or s in parent.strategies.get(name, ()):
                    continue
                cells = int(pairs.n_cells())
                full = parent.side.get((name, Mode.FULL.value))
                if s.payload and s.direction is Direction.FORWARD and full is not None:
                    # map_p expands the payloads: dearer per cell than Full pairs
                    cells = max(cells, AHEAD_MAP_P_FACTOR * int(full.n_cells()))
                todo.append((name, s, max(cells, 1)))
        total = sum(w for _, _, w in todo)
        least = AHEAD_MIN_CELLS if min_cells is None else min_cells
        if len(todo) < 2 or total < least or cores < 2 or not hasattr(os, "fork"):
            return None
        # the largest to the child, then each to the side with fewer cells: the run has
        # its arrays to link as well, and one strategy larger than all the others
        # (genomics 10,000x: model's forward index, 77 million cells) is the child's
        load = [0, 0]                   # cells: the child's, the run's
        child = set()
        for k in sorted(range(len(todo)), key=lambda k: -todo[k][2]):
            side = 0 if load[0] <= load[1] else 1
            load[side] += todo[k][2]
            if side == 0:
                child.add(k)
        theirs = [job for k, job in enumerate(todo) if k in child]   # in the run's order
        held = scratch("ahead")        # a made run killed outright leaves nothing behind
        folder = held.path
        jobs = {(name, str(s)): k for k, (name, s, _) in enumerate(theirs)}
        shapes = {name: (tuple(parent.shapes[name]), [tuple(parent.shapes[a])
                                                      for a in wf.steps[name].inputs])
                  for name, _, _ in theirs}

        def encode() -> int:            # in the child
            for k, (name, s, _) in enumerate(theirs):
                out_shape, in_shapes = shapes[name]
                full, pay = parent.pairs(name, (s,), len(in_shapes), keep_all)
                pairs = pay if s.payload else full
                counted, expanded = map_p_counting(name, wf.steps[name].operator, in_shapes,
                                                   out_shape)
                done = None if pairs is None else \
                    prepare_strategy(s, pairs, out_shape, in_shapes, counted,
                                     folder / f"{k}-rtree")
                if done is not None:
                    done.expanded = dict(expanded)
                part = folder / f"{k}.part"
                part.write_bytes(pickle.dumps(done, protocol=pickle.HIGHEST_PROTOCOL))
                os.replace(part, folder / f"{k}.pkl")
            return len(theirs)
        pid = fork_child(folder / "done.pkl", encode)
        if pid is None:
            held.close()
            return None
        return cls(held, jobs, pid)

    def __call__(self, op: str, s: Strategy) -> Prepared | None:
        """The child's encoding of ``s`` of ``op``, waited for; None when it is not the
        child's or the child left none (the run then encodes it)."""
        k = self.jobs.pop((op, str(s)), None)
        if k is None:
            return None
        f = self.folder / f"{k}.pkl"
        while not f.exists() and self.child.alive():
            time.sleep(BESIDE_POLL_S)
        try:
            got = pickle.loads(f.read_bytes())
        except Exception:           # none (the child failed or died), or not whole
            return None
        finally:
            f.unlink(missing_ok=True)
        return got if isinstance(got, Prepared) and got.strategy == s else None

    def close(self) -> None:
        """Stop the child if it still runs and remove its folder."""
        self.child.stop()
        self.held.close()
