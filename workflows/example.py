"""A small example workflow: calibrate a synthetic sky image, remove hot
pixels, and find stars.  It shows the three kinds of operators you write:

* ``Divide``   — built-in style, two inputs, lineage from mapping functions;
* ``BoxBlur``  — a stencil with mapping functions (Map mode, nothing stored);
* ``HotPixels``— a UDF with composite lineage: a repaired pixel depends on
                 its 3x3 input window, every other pixel on itself (the
                 built-in ``WindowComposite`` writes it);
* ``Stars``    — a UDF with full or payload lineage: every pixel of a star
                 depends on all input pixels of that star.

Run it with ``subzero run workflows/example.py``.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from subzero import ELEMENTWISE, GLOBAL, Mode, Operator, Workflow, stencil, window
from subzero.operators import WindowComposite

SHAPE = (64, 96)


def synthetic_sky(seed: int = 7) -> np.ndarray:
    """Deterministic sky: flat background, Gaussian stars, a few hot pixels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SHAPE[0], 0:SHAPE[1]]
    img = 100.0 + rng.normal(0, 3, SHAPE)
    for cy, cx, amp in [(12, 20, 900), (40, 70, 1500), (50, 15, 700), (20, 80, 1200)]:
        img += amp * np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * 1.8 ** 2))
    for cy, cx in [(5, 5), (30, 40), (60, 90), (33, 10)]:
        img[cy, cx] += 3000.0                     # hot pixels / cosmic-ray hits
    return img


def flat_field(seed: int = 11) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 1.0 + 0.02 * rng.standard_normal(SHAPE)


class Divide(Operator):
    """out = a / b, elementwise: out[c] depends on a[c] and b[c]."""

    tiling = ELEMENTWISE

    def run(self, ctx, a, b):
        return np.asarray(a, float) / np.asarray(b, float)

    def map_b(self, cells, i, ctx):
        return cells

    def map_f(self, cells, i, ctx):
        return cells


class BoxBlur(Operator):
    """Mean over a (2r+1)^2 window (edges use the window inside the image)."""

    def __init__(self, radius: int = 1):
        self.radius = radius
        self.tiling = stencil(radius)

    def run(self, ctx, img):
        k = 2 * self.radius + 1       # a direct sum per cell: identical on any tiling
        return ndimage.correlate(np.asarray(img, float), np.full((k, k), 1.0 / k ** 2), mode="nearest")

    def map_b(self, cells, i, ctx):
        return window(cells, self.radius, ctx.input_shape(i))

    def map_f(self, cells, i, ctx):
        return window(cells, self.radius, ctx.output_shape)


class HotPixels(WindowComposite):
    """Replace pixels far above their 3x3 median by that median.

    Composite lineage: a repaired pixel depends on its 3x3 input window
    (``radius`` 1), every other pixel on the same input pixel.  The built-in
    ``WindowComposite`` writes it (Comp payloads, or Full pairs) from the mask
    of repaired pixels that ``compute_flagged`` returns with the output.
    """

    tiling = GLOBAL      # the noise level is estimated from the whole image
    radius = 1
    payload_reach = 1    # a repaired pixel's window: 1 cell around it (forward traces look nearby)
    deterministic_lineage = True   # the repaired pixels follow from the image alone

    def __init__(self, nsigma: float = 8.0):
        self.nsigma = nsigma

    def compute_flagged(self, img):
        img = np.asarray(img, float)
        med = ndimage.median_filter(img, size=3, mode="nearest")
        noise = 1.4826 * np.median(np.abs(img - np.median(img)))
        hot = (img - med) > self.nsigma * noise
        return np.where(hot, med, img), hot


class Stars(Operator):
    """Label connected pixels above a threshold: 0 = sky, k = star k.

    Every pixel of star k depends on all input pixels of star k; sky pixels
    depend on themselves.
    """

    deterministic_lineage = True   # the pairs are the stars of the output's labels
    labels_objects = True          # 0 = sky, k = star k: impact lists the stars it touches
    payload_reach = 0              # map_p gives a pair its own pixels

    def __init__(self, threshold: float = 300.0):
        self.threshold = threshold

    def supported_modes(self):
        return {Mode.FULL, Mode.PAY, Mode.BLACKBOX}

    def run(self, ctx, img):
        img = np.asarray(img, float)
        labels, n = ndimage.label(img > self.threshold)
        cells = np.argwhere(np.ones(img.shape, bool))
        # pair id: the star label for star pixels, a unique id per sky pixel
        flat = labels.ravel()
        group = np.where(flat > 0, flat, n + 1 + np.arange(flat.size))
        if Mode.FULL in ctx.modes:
            ctx.lwrite_groups(cells, group, (cells, group))
        if Mode.PAY in ctx.modes:
            ctx.lwrite_groups(cells, group, payload=b"")   # map_p: the pair's own pixels
        return labels.astype(np.int32)

    def map_p(self, cells, payload, i, ctx):
        return cells


def workflow() -> Workflow:
    wf = Workflow("example")
    raw = wf.input("raw", default=synthetic_sky())
    flat = wf.input("flat", default=flat_field())
    calib = wf.add("calib", Divide(), raw, flat)
    wf.add("smooth", BoxBlur(1), calib)
    clean = wf.add("clean", HotPixels(), calib)
    wf.add("stars", Stars(), clean)
    return wf
