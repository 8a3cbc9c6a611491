"""The LSST astronomy workflow of the SubZero paper, on two real exposures.

Two consecutive 15 s ImSim exposures of one LSST sensor amplifier
(``data/lsst``, 2001 x 513 pixels each) are calibrated, cleaned of cosmic
rays and searched for stars; the output labels every pixel with the star it
belongs to (0 = sky).  Per exposure j (22 built-in operators in total):

 1. linearity_j    gain + quadratic linearity correction      (elementwise)
 2. maskattr_j     pixel flags: saturated / dead              (elementwise)
 3. badpix_j       repair flagged pixels                      (elementwise, 2 inputs)
 4. overscan_j     the prescan strip, columns 0-3             (slice)
 5. overscanmean_j its mean                                   (all-to-all reduction to 1 cell)
 6. rmoverscan_j   image minus that mean                      (input 1 all-to-all)
 7-9. bias_j, dark_j, flat_j  calibration with frames         (2 inputs each)
10. rmbg_j         minus the per-64x64-block median background (block stencil)
11. cr_j           UDF: L.A.Cosmic (astroscrappy) cosmic-ray mask, composite lineage
then combine (mean of the exposures), crmask (union of the masks), and the UDFs
rmcr (cosmic-ray removal, composite) and stars (threshold + connected
components, payload lineage).

The ImSim data ship no calibration frames, so the bias, dark and flat inputs
default to small deterministic synthetic frames (a column pattern, a dark
current, a gentle flat gradient) — they exercise the calibration merges
without changing the science.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from subzero import ExactMAD, ExactMedian, Mode, Workflow, stencil
from subzero.errors import WorkflowError
from subzero.model.statistic import whole
from subzero.operators import Binary, ConnectedComponents, Div, Maximum, Mean, Slice, Sub, Unary, WindowComposite
from subzero.operators.base import MappedOperator
from subzero.operators.composite import window_offsets
from subzero.storage.inputs import load_path, memo

EXPOSURES = ("data/lsst/imsim_85408556_R23_S11_C04_E000.fits",
             "data/lsst/imsim_85408556_R23_S11_C04_E001.fits")
SHAPE = (2001, 513)
SATURATION = 60000.0        # counts; the brightest stars reach ~60,600
DEAD_LEVEL = 1300.0         # science pixels this low sit at the bias level: dead (120 per exposure)
RAW_SKY = 1601.0            # typical raw sky level, used to fill dead pixels
PRESCAN = np.s_[:, 0:4]     # columns 0-3 hold the prescan/overscan level (~1007 counts)
SCIENCE = np.s_[1:, 4:]     # row 0 and columns 0-3 are not sky data
GAIN = 1.0
NONLINEARITY = 2e-7         # quadratic coefficient of the linearity correction
BG_BLOCK = 64
CR_RADIUS = 3               # a flagged pixel depends on its 7x7 window (the paper's declaration)
CR_HALO = 40                # L.A.Cosmic's four iterations reach 38 pixels (see CosmicRays)
CR_MIN_SIDE = 8             # astroscrappy crashes on images under 4 pixels a side
RMCR_RADIUS = 2             # a repaired pixel depends on its 5x5 window
STAR_NSIGMA = 5.0


# --- calibration frames (synthetic, deterministic) ---------------------------------------

def bias_frame(shape=SHAPE) -> np.ndarray:
    """Residual bias after prescan subtraction: a fixed +-1 count column pattern."""
    rng = np.random.default_rng(2013)
    return np.broadcast_to(rng.normal(0.0, 0.5, shape[1]), shape).astype(np.float32).copy()


def dark_frame(shape=SHAPE) -> np.ndarray:
    """Dark current of 0.02 counts/s over the 15 s exposure, with hot-column texture."""
    rng = np.random.default_rng(2014)
    return (0.3 + np.abs(rng.normal(0.0, 0.05, shape))).astype(np.float32)


def flat_frame(shape=SHAPE) -> np.ndarray:
    """A gentle +-1% illumination gradient."""
    y, x = np.mgrid[0:shape[0], 0:shape[1]]
    return (1.0 + 0.01 * (y / shape[0] - 0.5) + 0.005 * (x / shape[1] - 0.5)).astype(np.float32)


def linearize(x):
    """Gain and quadratic linearity correction (elementwise)."""
    x = np.asarray(x, dtype=np.float64)
    return GAIN * x * (1.0 + NONLINEARITY * x)


def pixel_flags(x, origin=(0, 0)):
    """Per-pixel quality code (elementwise): 1 saturated, 2 dead, 0 good.

    Only science pixels can be dead; the prescan strip is at the bias level
    by design.  (Position-dependent, still elementwise: out[c] = f(x[c], c);
    ``origin`` is where ``x`` begins in the image, for a tile of it.)
    """
    x = np.asarray(x)
    flags = np.where(x >= SATURATION, 1, 0).astype(np.uint8)
    rows = origin[0] + np.arange(x.shape[0])
    cols = origin[1] + np.arange(x.shape[1])
    sci = (rows >= SCIENCE[0].start)[:, None] & (cols >= SCIENCE[1].start)[None, :]
    flags[sci & (x < DEAD_LEVEL)] = 2
    return flags


class PixelFlags(Unary):
    """:func:`pixel_flags` as an elementwise operator that runs per tile: the
    science area is in image coordinates, so a tile adds its ``ctx.origin``."""

    def __init__(self):
        super().__init__(pixel_flags)

    def run(self, ctx, x):
        out = pixel_flags(np.asarray(x), ctx.origin)
        if Mode.FULL in ctx.modes:
            self.emit_full(ctx)
        return out


def repair(image, flags):
    """Saturated pixels -> the saturation level, dead pixels -> the raw sky level."""
    image = np.asarray(image, np.float64)
    return np.where(flags == 1, SATURATION, np.where(flags == 2, RAW_SKY, image))


def non_science(shape, origin=(0, 0)) -> np.ndarray:
    """The mask of a block of the image at ``origin`` that is not sky data."""
    m = np.ones(shape, bool)
    m[tuple(slice(max(0, s.start - o), None) for s, o in zip(SCIENCE, origin))] = False
    return m


def la_cosmic_mask(indat: np.ndarray, inmask: np.ndarray, satlevel: float) -> np.ndarray:
    """astroscrappy's working mask of ``indat`` given its input mask: the input mask
    grown by a pixel, and saturated stars (without any, its median filter is skipped)."""
    from astroscrappy.astroscrappy import update_mask
    from astroscrappy.utils.image_utils import dilate3
    data = np.ascontiguousarray(indat * np.float32(GAIN), np.float32)
    if not (data >= np.float32(satlevel)).any():
        return np.asarray(dilate3(np.ascontiguousarray(inmask, bool)), np.uint8)
    mask = np.ascontiguousarray(inmask, np.uint8).copy()
    update_mask(data, mask, satlevel, True)
    return mask


def average(a, b):
    return 0.5 * (np.asarray(a, np.float64) + np.asarray(b, np.float64))


def mad_sigma(sample: np.ndarray) -> float:
    """Noise estimate from the median absolute deviation (the order of ``sample`` does
    not matter: a median is a property of the values)."""
    return float(1.4826 * np.median(np.abs(sample - np.median(sample))))


# --- a built-in: block background subtraction ---------------------------------------------

class BlockBackground(MappedOperator):
    """Image minus the median of its ``block`` x ``block`` block (edge blocks are
    smaller).  An output pixel depends on every input pixel of its block.

    Blocks lie on the image's grid, so the operator runs per tile: with a halo of
    ``block - 1`` every block that meets a tile's core lies whole in its read
    region, and ``ctx.origin`` puts the read region on the image's block grid.
    Each block's median is then the whole image's, bit for bit, whatever the
    tile size."""

    arity = 1

    def __init__(self, block: int = BG_BLOCK):
        self.block = int(block)
        self.tiling = stencil(self.block - 1)

    def compute(self, img, origin=(0, 0)):
        img = np.asarray(img, dtype=np.float64)
        b = self.block
        lead = [int(o) % b for o in origin]         # cells of a block cut off before the region
        ny, nx = -(-(img.shape[0] + lead[0]) // b), -(-(img.shape[1] + lead[1]) // b)
        pad = np.full((ny * b, nx * b), np.nan)
        pad[lead[0]:lead[0] + img.shape[0], lead[1]:lead[1] + img.shape[1]] = img
        med = np.nanmedian(pad.reshape(ny, b, nx, b).transpose(0, 2, 1, 3).reshape(ny, nx, -1), axis=2)
        bg = np.repeat(np.repeat(med, b, axis=0), b, axis=1)
        return img - bg[lead[0]:lead[0] + img.shape[0], lead[1]:lead[1] + img.shape[1]]

    def run(self, ctx, img):
        out = self.compute(img, ctx.origin)
        if Mode.FULL in ctx.modes:
            self.emit_full(ctx)
        return out

    def _tile_ids(self, cells, shape):
        return (cells[:, 0] // self.block) * -(-shape[1] // self.block) + cells[:, 1] // self.block

    def _tile_cells(self, tiles, shape):
        """All cells of the given tile ids, and the position in ``tiles`` of each."""
        b, nx = self.block, -(-shape[1] // self.block)
        off = np.argwhere(np.ones((b, b), bool))
        origin = np.stack(np.divmod(tiles, nx), axis=1) * b
        out = (origin[:, None, :] + off[None, :, :]).reshape(-1, 2)
        owner = np.repeat(np.arange(len(tiles)), len(off))
        ok = (out[:, 0] < shape[0]) & (out[:, 1] < shape[1])
        return out[ok], owner[ok]

    def backward(self, cells, i, ctx):
        shape = ctx.input_shape(0)
        tiles, inv = np.unique(self._tile_ids(cells, shape), return_inverse=True)
        tcells, towner = self._tile_cells(tiles, shape)
        # per output row, in row order: its tile's cells (as MappedOperator expects)
        starts = np.searchsorted(towner, np.arange(len(tiles)))
        rep = np.bincount(towner, minlength=len(tiles))[inv]
        idx = np.repeat(starts[inv], rep) + (np.arange(rep.sum()) - np.repeat(np.cumsum(rep) - rep, rep))
        return tcells[idx], np.repeat(np.arange(len(cells)), rep)

    def forward(self, cells, i, ctx):
        return self.map_b(cells, i, ctx)

    def map_b(self, cells, i, ctx):          # the union of the touched tiles, no per-row blow-up
        shape = ctx.input_shape(0)
        return self._tile_cells(np.unique(self._tile_ids(cells, shape)), shape)[0]

    def map_f(self, cells, i, ctx):
        return self.map_b(cells, i, ctx)

    def emit_full(self, ctx) -> None:
        """One region pair per block: all its output cells <- all its input cells (on a
        tile, blocks are numbered on the image's grid; pairs of blocks the tile's read
        region cuts are dropped with the halo)."""
        shape = ctx.input_shape(0)
        cells = np.argwhere(np.ones(shape, bool))
        whole = ctx.array_shape or shape
        tid = self._tile_ids(cells + np.asarray(ctx.origin), whole)
        ctx.lwrite_groups(cells, tid, (cells, tid))


# --- UDF A/B: cosmic-ray detection ----------------------------------------------------------

class SkyFill(ExactMedian):
    """astroscrappy's fill value: the lower median of the image's unmasked pixels
    (the input mask grown by a pixel, plus saturated stars' cores grown by four),
    which L.A.Cosmic writes into a pixel whose whole 5x5 window is masked.  The
    mask reaches 7 pixels (a 7-pixel median, then two 5x5 dilations), so each
    tile reads a halo of 7 to mask its core exactly."""

    halo = 7

    def __init__(self, sky: float, satlevel: float):
        self.sky, self.satlevel = sky, satlevel

    def values(self, block, core, origin, shape):
        indat = np.asarray(block, np.float32) + np.float32(self.sky)
        mask = la_cosmic_mask(indat, non_science(indat.shape, origin), self.satlevel)
        return indat[core][mask[core] == 0]


class CosmicRays(WindowComposite):
    """L.A.Cosmic (van Dokkum 2001) through astroscrappy: Laplacian edge
    detection on the 2x subsampled image with a median-filter noise model,
    a fine-structure image to spare stars, and growing of the hits.

    Output: a uint8 mask (1 = cosmic ray).  Lineage (composite): a flagged
    pixel depends on the 7x7 input window around it; every other pixel on the
    same input pixel.  The prescan strip is masked (it is not sky data and its
    edge would pass for a cosmic-ray column).  Tuned on the two exposures: the
    three real hits (39 pixels at sky level in the other exposure) are all
    found, with 0.015% of pixels flagged.  ``sky`` (counts) re-adds the
    subtracted sky level, which L.A.Cosmic's Poisson noise model needs; pixels
    above ``satlevel``
    (in the calibrated input's counts: saturated cores land near 59,000) are
    saturated stars, never cosmic rays.

    Runs per tile, bit-identical to the whole image.  Each of the four
    iterations reaches 10 pixels further (Laplacian 1, noise median 3, its
    7-pixel median 3 more, two 3x3 growths, the 5x5 clean), the last one 8,
    and the mask 7: after four iterations a pixel depends on the input within
    38 pixels, so a tile reads a halo of ``CR_HALO`` = 40.  Stopping early
    (an iteration that finds nothing) cannot move that light cone: an
    iteration finding nothing near a pixel leaves its neighbourhood as it was.
    The one whole-image number, the fill value for a fully masked window,
    is the :class:`SkyFill` statistic; a tile hands it to astroscrappy by
    appending rows (or columns) of that value on a side where it has a halo
    until its own median is that value (checked exactly before the tile runs).
    """

    default_strategy = "comp:payone:backward"
    tiling = stencil(CR_HALO)
    radius = CR_RADIUS
    payload_reach = CR_RADIUS          # a flagged pixel's window (forward traces look nearby)
    deterministic_lineage = True       # the flagged pixels are the output mask itself
    #: the working mask reaches 7 pixels (SkyFill.halo), and a window 2 beyond its centre
    statistic_margin = 7 + 2

    def __init__(self, sky: float = 600.0, satlevel: float = 50000.0, sigclip: float = 5.0,
                 sigfrac: float = 0.5, objlim: float = 5.0, readnoise: float = 5.0,
                 fsmode: str = "median"):
        self.sky, self.satlevel = sky, satlevel
        self.sigclip, self.sigfrac, self.objlim, self.readnoise = sigclip, sigfrac, objlim, readnoise
        self.fsmode = fsmode
        self.statistic = SkyFill(sky, satlevel)

    def run(self, ctx, img):
        img = np.asarray(img, np.float32)
        whole_shape = tuple(ctx.array_shape or img.shape)
        if img.shape == whole_shape:
            out, flagged = self.compute_flagged(img)
        else:
            out, _ = self.detect_block(img + np.float32(self.sky), tuple(ctx.origin), whole_shape,
                                       ctx.statistic)
            flagged = out.astype(bool)
        self.write_lineage(ctx, np.asarray(flagged, bool), self.radius)
        return out

    def uses_statistic(self, inputs, output, block, read, shape):
        """L.A.Cosmic reads the sky median (the fill) only to clean a flagged pixel whose
        whole 5x5 window is masked (flagged, or in its working mask).  Flags and mask
        only grow from one iteration to the next, so the final ones hold every window
        any iteration saw: a tile none of whose flagged pixels (within its read region)
        has a 5x5 window all flagged or masked in the parent run never read the fill,
        and comes out the same whatever its value.  Cells outside the image count as
        masked, so the answer can only err towards running a tile again."""
        from scipy import ndimage
        flagged = np.asarray(output).astype(bool)
        inner = tuple(slice(a - b0, b - b0) for (a, b), (b0, _) in zip(read, block))
        hits = np.zeros_like(flagged)
        hits[inner] = flagged[inner]
        if not hits.any():
            return False
        # per group of hits, the working mask around them only: the windows of the hits
        # (2 pixels) and the mask's reach (7) beyond them; outside the image is masked.
        # Many groups: one mask over the whole block costs less than many small ones.
        near = ndimage.maximum_filter(hits.view(np.uint8), size=19, mode="constant") > 0
        groups, n = ndimage.label(near, structure=np.ones((3, 3), bool))
        boxes = ndimage.find_objects(groups) if n <= 8 else [tuple(slice(0, k) for k in hits.shape)]
        img = inputs[0] if n <= 8 else np.asarray(inputs[0])
        for box in boxes:
            origin = tuple(b0 + s.start for (b0, _), s in zip(block, box))
            indat = np.asarray(img[box], np.float32) + np.float32(self.sky)
            masked = la_cosmic_mask(indat, non_science(indat.shape, origin), self.satlevel).astype(bool)
            masked |= flagged[box]
            edge = [((b0 + s.start == 0) * 2, (b0 + s.stop == n) * 2)
                    for (b0, _), s, n in zip(block, box, shape)]
            pad = np.pad(masked, edge, constant_values=True)
            full = np.lib.stride_tricks.sliding_window_view(pad, 5, axis=0).all(axis=-1)
            full = np.lib.stride_tricks.sliding_window_view(full, 5, axis=1).all(axis=-1)
            # ``full`` is over the box, shrunk by 2 on every side the image does not end
            trim = tuple(slice(2 - a, (s.stop - s.start) - (2 - b) if (2 - b) else None)
                         for (a, b), s in zip(edge, box))
            if (full & hits[box][trim]).any():
                return True
        return False

    def compute_flagged(self, img):
        img = np.asarray(img, dtype=np.float32)
        mask, _ = self._detect(img + np.float32(self.sky), non_science(img.shape))
        return mask, mask.astype(bool)

    def _detect(self, indat, inmask):
        """astroscrappy on ``indat`` (sky re-added): the uint8 mask and the cleaned image."""
        import astroscrappy
        if min(indat.shape) < CR_MIN_SIDE:      # astroscrappy's C code overruns its buffers
            raise ValueError(f"cosmic-ray detection needs an image of at least {CR_MIN_SIDE} "
                             f"pixels per side, not {indat.shape[0]}x{indat.shape[1]}")
        mask, clean = astroscrappy.detect_cosmics(
            indat, inmask=inmask, gain=GAIN,
            readnoise=self.readnoise, sigclip=self.sigclip, sigfrac=self.sigfrac,
            objlim=self.objlim, satlevel=self.satlevel, niter=4, cleantype="meanmask",
            fsmode=self.fsmode, psfmodel="gauss", psffwhm=2.5)
        return mask.astype(np.uint8), clean

    def detect_block(self, indat, origin, shape, fill):
        """A tile's read region ``indat`` (core plus halo, sky re-added) at ``origin``
        of an image of ``shape``: padded with ``fill`` (the :class:`SkyFill` value) on
        a side with a halo until astroscrappy's own median of it is ``fill``, then
        detected.  Returns the mask and the cleaned image over ``indat``; the core of
        both equals the whole image's."""
        side = next(((ax, end) for ax, end in ((0, True), (0, False), (1, True), (1, False))
                     if (origin[ax] + indat.shape[ax] < shape[ax] if end else origin[ax] > 0)), None)
        assert side is not None          # only the whole image has no side with a halo
        ax, end = side
        inmask = non_science(indat.shape, origin)
        fill = np.float32(fill)
        across = indat.shape[1 - ax]
        rows = 0
        for _ in range(8):
            pad_shape = (rows, across) if ax == 0 else (across, rows)
            parts = [indat, np.full(pad_shape, fill, np.float32)]
            masks = [inmask, np.zeros(pad_shape, bool)]
            if not end:
                parts, masks = parts[::-1], masks[::-1]
            padded = np.ascontiguousarray(np.concatenate(parts, axis=ax))
            pmask = np.concatenate(masks, axis=ax)
            good = padded[la_cosmic_mask(padded, pmask, self.satlevel) == 0]
            below, equal = int((good < fill).sum()), int((good == fill).sum())
            above = good.size - below - equal
            k = (good.size - 1) // 2
            if below <= k < below + equal:
                mask, clean = self._detect(padded, pmask)
                keep = [slice(None), slice(None)]
                keep[ax] = slice(0, indat.shape[ax]) if end else slice(rows, None)
                return mask[tuple(keep)], clean[tuple(keep)]
            need = max(below - equal - above + 1, above - below - equal, 1)
            rows += -(-need // across) + 2
        raise ValueError(f"could not give the tile at {origin} the image's fill value {fill}")


# --- UDF C: cosmic-ray removal -------------------------------------------------------------

class RemoveCosmicRays(WindowComposite):
    """Replace each flagged pixel by the median of the unflagged pixels of its
    5x5 neighbourhood (0 = the subtracted background when all are flagged).

    Inputs: the image and the cosmic-ray mask.  Lineage (composite): a
    replaced pixel depends on its 5x5 window of both inputs; any other pixel
    on the same pixel of both.
    """

    default_strategy = "comp:payone:backward"
    tiling = stencil(RMCR_RADIUS)
    radius = RMCR_RADIUS
    payload_reach = RMCR_RADIUS        # a repaired pixel's window, in both inputs
    deterministic_lineage = True       # the flagged pixels are the input mask

    def compute_flagged(self, img, mask):
        img = np.asarray(img, dtype=np.float64)
        flagged = np.asarray(mask).astype(bool)
        out = img.copy()
        hits = np.argwhere(flagged)
        win = hits[:, None, :] + window_offsets(RMCR_RADIUS, 2)[None, :, :]
        inside = np.all((win >= 0) & (win < np.asarray(img.shape)), axis=2)
        wy = np.clip(win[..., 0], 0, img.shape[0] - 1)
        wx = np.clip(win[..., 1], 0, img.shape[1] - 1)
        vals = np.where(inside & ~flagged[wy, wx], img[wy, wx], np.nan)
        with np.errstate(all="ignore"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                med = np.nanmedian(vals, axis=1) if len(hits) else np.zeros(0)
        out[flagged] = np.where(np.isnan(med), 0.0, med)
        return out, flagged


# --- UDF D: star detection -------------------------------------------------------------------

class StarThreshold(ExactMAD):
    """``nsigma`` times the MAD noise of every fourth pixel of the whole image (the
    ``[::4, ::4]`` sample, taken per tile on the image's grid: any tiling gives the
    same sample, so the same threshold).  The MAD is exact and equal to
    :func:`mad_sigma`'s, in rounds of histograms (:class:`subzero.ExactMAD`), so
    the driver never holds the sample."""

    def __init__(self, nsigma: float):
        self.nsigma = nsigma

    def values(self, block, core, origin, shape):
        start = [o + c.start for o, c in zip(origin, core)]
        return np.asarray(block[core], np.float64)[tuple(slice((-s) % 4, None, 4) for s in start)]

    def finish(self, counts, prior):
        mad = super().finish(counts, prior)
        return mad if isinstance(mad, dict) else self.nsigma * float(1.4826 * mad)


class DetectStars(ConnectedComponents):
    """Threshold at ``nsigma`` times the robust noise, then 8-connected
    components: 0 = sky, k = star k.  Every pixel of star k depends on all
    input pixels of star k; a sky pixel depends on itself.

    Payload lineage: one payload pair per star whose ``map_p`` is the star's
    own pixels (the payload is empty: the pair's cells say it all).  In
    composite mode sky pixels use the identity mapping instead of a pair each.

    Runs per tile on Spark (``components`` tiling): the noise is the median
    absolute deviation of every fourth pixel of the whole image, gathered per
    tile on the image's grid (``origin``) -- the same sample, so the same
    threshold -- and stars crossing tile borders are merged; the labels equal
    the whole-image run's.
    """

    def __init__(self, nsigma: float = STAR_NSIGMA, min_pixels: int = 3):
        self.nsigma, self.min_pixels = nsigma, min_pixels
        self.min_size = min_pixels
        self.statistic = StarThreshold(nsigma)

    def threshold(self, img: np.ndarray) -> float:
        return float(whole(StarThreshold(self.nsigma), np.asarray(img, np.float64)))

    def foreground(self, values, threshold):
        return np.asarray(values, np.float64) > threshold


# --- sizes: the real amplifier tiled to a larger image ------------------------------------

AMPLIFIER_PIXELS = (SHAPE[0] - 1) * (SHAPE[1] - 4)     # the science area one copy adds


def tiling(megapixels: float | None = None, tiles=None) -> tuple[int, int]:
    """Copies of the amplifier's science area (down, across) for an image of about
    ``megapixels`` million pixels, as near square as whole copies allow (1 -> 1x1,
    4 -> 2x2, 16 -> 4x4, 64 -> 9x7: 64.2 Mpix), or
    ``tiles`` as given."""
    if tiles is not None:
        try:
            r, c = (int(t) for t in tiles)
        except (TypeError, ValueError) as err:
            raise WorkflowError(f"astronomy: tiles must be two whole numbers (down, across), "
                                f"not {tiles!r}") from err
        if r < 1 or c < 1:
            raise WorkflowError(f"astronomy: tiles must be at least 1x1, not {r}x{c}")
        return r, c
    try:
        mp = float(megapixels)  # type: ignore[arg-type]
    except (TypeError, ValueError) as err:
        raise WorkflowError(f"astronomy: megapixels must be a number, not {megapixels!r}") from err
    if not mp > 0 or not np.isfinite(mp):
        raise WorkflowError(f"astronomy: megapixels must be a positive number, not {megapixels!r}")
    n = max(1, round(mp * 1e6 / AMPLIFIER_PIXELS))
    c = max(1, int(np.sqrt(n)))
    return max(1, round(n / c)), c


def mosaic(image: np.ndarray, tiles: tuple[int, int]) -> np.ndarray:
    """``image`` (laid out like the amplifier) with its science area repeated
    ``tiles`` = (down, across) times; the prescan columns and row 0 stay at the
    edges, as the workflow expects (the prescan strip is repeated down).  Copy
    (k, l) of science pixel (y, x) is at (y + k * (H - 1), x + l * (W - 4))."""
    a = np.asarray(image)
    r, c = tiles
    (y0, x0), (h, w) = copy_origin(), a.shape
    out = np.empty((y0 + r * (h - y0), x0 + c * (w - x0)), a.dtype)
    out[y0:, x0:] = np.tile(a[y0:, x0:], (r, c))
    out[y0:, :x0] = np.tile(a[y0:, :x0], (r, 1))
    out[:y0, x0:] = np.tile(a[:y0, x0:], (1, c))
    out[:y0, :x0] = a[:y0, :x0]
    return out


def copy_origin() -> tuple[int, int]:
    """Where the science area begins (row, column): copies are laid out from there."""
    return SCIENCE[0].start, SCIENCE[1].start


def source(name: str, crop: tuple[int, int] | None = None) -> np.ndarray:
    """The untiled value of input ``name`` (the real exposure or a calibration frame),
    optionally cropped to its first ``crop`` = (rows, columns); a fresh array."""
    a = _amplifier(name)
    return a.copy() if crop is None else np.array(a[:crop[0], :crop[1]], order="C")


def _amplifier(name: str) -> np.ndarray:
    """The amplifier-sized input, read or made once per process (read-only,
    :func:`subzero.storage.inputs.memo`): the tasks that copy a mosaic input into a
    run, a region each, all build their regions from it."""
    return memo(("astronomy-amplifier", name), lambda: _make_amplifier(name))


def _make_amplifier(name: str) -> np.ndarray:
    if name.startswith("raw_"):
        path = Path(__file__).resolve().parent / EXPOSURES[int(name[4:]) - 1]
        a = np.asarray(load_path(path, name))       # as the untiled run loads it
    else:
        a = {"bias": bias_frame, "dark": dark_frame, "flat": flat_frame}[name](SHAPE)
    return a


def tiled_inputs(tiles: tuple[int, int], crop: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """Every input of the workflow, tiled: ``store.run(workflow(), inputs=...)``."""
    return {n: mosaic(source(n, crop), tiles) for n in ("raw_1", "raw_2", "bias", "dark", "flat")}


class TiledInput:
    """An input built when the run loads it (``np.asarray``): a few bytes in the
    run's ``workflow.pkl`` instead of the whole tiled array."""

    def __init__(self, name: str, tiles: tuple[int, int]):
        self.name, self.tiles = name, tiling(tiles=tiles)

    @property
    def shape(self) -> tuple[int, int]:
        (y0, x0), r, c = copy_origin(), *self.tiles
        return y0 + r * (SHAPE[0] - y0), x0 + c * (SHAPE[1] - x0)

    @property
    def dtype(self) -> np.dtype:
        return _amplifier(self.name).dtype

    def read_region(self, region: tuple[slice, ...]) -> np.ndarray:
        """One region of the mosaic, built from the amplifier alone (what
        :func:`mosaic` puts there): engines copy the input tile by tile, so no
        process builds the whole image."""
        a = _amplifier(self.name)
        (y0, x0), (h, w) = copy_origin(), a.shape
        rows = np.arange(*region[0].indices(self.shape[0]))
        cols = np.arange(*region[1].indices(self.shape[1]))
        rows = np.where(rows < y0, rows, y0 + (rows - y0) % (h - y0))
        cols = np.where(cols < x0, cols, x0 + (cols - x0) % (w - x0))
        return a[np.ix_(rows, cols)]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = mosaic(source(self.name), self.tiles)
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"TiledInput({self.name!r}, {self.tiles[0]}x{self.tiles[1]})"


# --- the workflow ----------------------------------------------------------------------------

def calibrate(wf: Workflow, j: int, raw, bias, dark, flat):
    """Steps 1-10 for exposure j; returns the background-subtracted image."""
    lin = wf.add(f"linearity_{j}", Unary(linearize), raw)
    flags = wf.add(f"maskattr_{j}", PixelFlags(), lin)
    bad = wf.add(f"badpix_{j}", Binary(repair), lin, flags)
    osc = wf.add(f"overscan_{j}", Slice(PRESCAN), bad)
    osm = wf.add(f"overscanmean_{j}", Mean(), osc)
    rmo = wf.add(f"rmoverscan_{j}", Sub(broadcast="scalar"), bad, osm)
    b = wf.add(f"bias_{j}", Sub(), rmo, bias)
    d = wf.add(f"dark_{j}", Sub(), b, dark)
    f = wf.add(f"flat_{j}", Div(), d, flat)
    return wf.add(f"rmbg_{j}", BlockBackground(BG_BLOCK), f)


def workflow(megapixels: float | None = None, tiles: tuple[int, int] | list[int] | None = None) -> Workflow:
    """The workflow on the real amplifier, or (``megapixels`` or ``tiles``) on the
    amplifier tiled to a larger image: ``subzero run workflows/astronomy.py --param
    megapixels=16``.  Tiled inputs are built when the run loads them, so the run's
    saved workflow stays small (see :class:`TiledInput`)."""
    wf = Workflow("astronomy")
    if megapixels is None and tiles is None:
        raws = [wf.input(f"raw_{j}", default=EXPOSURES[j - 1]) for j in (1, 2)]
        bias = wf.input("bias", default=bias_frame())
        dark = wf.input("dark", default=dark_frame())
        flat = wf.input("flat", default=flat_frame())
    else:
        grid = tiling(megapixels, tiles)
        raws = [wf.input(f"raw_{j}", default=TiledInput(f"raw_{j}", grid)) for j in (1, 2)]
        bias, dark, flat = (wf.input(n, default=TiledInput(n, grid)) for n in ("bias", "dark", "flat"))
    cleaned, masks = [], []
    for j, raw in zip((1, 2), raws):
        bg = calibrate(wf, j, raw, bias, dark, flat)
        cleaned.append(bg)
        masks.append(wf.add(f"cr_{j}", CosmicRays(), bg))
    comb = wf.add("combine", Binary(average), *cleaned)
    crm = wf.add("crmask", Maximum(), *masks)
    rm = wf.add("rmcr", RemoveCosmicRays(), comb, crm)
    wf.add("stars", DetectStars(), rm)
    return wf

