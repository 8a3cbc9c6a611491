"""A small workflow for resume tests: a stencil, an elementwise step, a global
step, a gate that blocks while a file exists (the test kills the driver there),
and steps after it."""
import os
import time

import numpy as np

from subzero import GLOBAL, Mode, Operator, Workflow
from subzero.operators import MeanFilter, Mul, Threshold


class Gate(Operator):
    """Identity; while the file named by ``path`` exists it waits, and says so by
    making ``path + ".reached"`` (on Spark its stdout is an executor's, not the driver's)."""
    tiling = GLOBAL

    def __init__(self, path):
        self.path = path

    def run(self, ctx, x):
        if self.path and os.path.exists(self.path):
            open(self.path + ".reached", "w").close()
            while os.path.exists(self.path):
                time.sleep(0.05)
        return x

    def map_b(self, cells, i, ctx):
        return cells

    def map_f(self, cells, i, ctx):
        return cells


class Flip(Operator):
    """A global operator with full lineage: each cell from its mirror image."""
    tiling = GLOBAL

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        out = x[::-1, ::-1].copy()
        cells = np.argwhere(np.ones(x.shape, bool))
        ctx.lwrite(cells, np.array(x.shape) - 1 - cells, each=True)
        return out


def workflow(gate=""):
    wf = Workflow("gated")
    a = wf.input("a", default=None)
    m = wf.add("smooth", MeanFilter(size=3), a)
    t = wf.add("bright", Threshold(0.5), m)
    f = wf.add("flip", Flip(), m)
    g = wf.add("gate", Gate(gate), f)
    wf.add("scaled", Mul(), g, t)
    return wf
