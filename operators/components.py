"""Connected components: label the regions of a foreground mask, tile by tile.

Star finding, source segmentation, cell segmentation, flood or burn-scar
maps: threshold, then label connected regions.  A region can cross any
tile border, so such an operator is not a stencil; it is not global either.
:class:`ConnectedComponents` declares ``components`` tiling and the Spark
engine runs it in passes over tiles (the label-merge pattern of
:mod:`subzero.capture.components`): the operator's whole-array statistic if
it declares one (:mod:`subzero.model.statistic`), per-tile labels with a merge across
tile borders on the driver, and per-tile relabelling with lineage.  The labels
equal the in-process engine's cell for cell on any tiling: regions are
numbered by their first cell (row-major), the order ``scipy.ndimage.label``
gives.

A subclass implements :meth:`ConnectedComponents.foreground` and, when the
mask needs a whole-array statistic (a noise level, a percentile), sets
``statistic`` to a :class:`~subzero.model.statistic.Statistic` whose partials
of any tiling merge to what the whole array gives; ``foreground`` receives
its value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from subzero import COMPONENTS, Mode, Operator
from subzero.capture.components import label


class ConnectedComponents(Operator):
    """Regions of ``foreground(values, stat)``: 0 = background, k = region k (int32),
    numbered by their first cell; regions of fewer than ``min_size`` cells dropped.

    ``connectivity``: ``"full"`` (8-connected in 2-D) or ``"faces"`` (4-connected).

    Lineage: every cell of region k depends on every input cell of region k
    (one pair per region); a background cell depends on the same input cell.
    In composite mode the background uses the identity mapping instead of a
    pair each.  ``foreground`` must decide each cell from its own value (and
    the statistic): a tile of the mask is then the mask of the tile.
    """

    tiling = COMPONENTS
    default_strategy = "comp:payone:backward"
    deterministic_lineage = True       # a region's pair is its cells in the output's labels
    payload_reach = 0                  # map_p gives a region's pair its own cells
    labels_objects = True              # 0 = background, k = region k
    connectivity = "full"
    min_size = 1

    def supported_modes(self):
        return {Mode.FULL, Mode.PAY, Mode.COMP, Mode.BLACKBOX}

    # -- what a subclass implements ---------------------------------------------------------
    def foreground(self, values: np.ndarray, stat: Any) -> np.ndarray:  # pragma: no cover - abstract
        """The boolean mask of ``values`` (a tile or the whole array), cell by cell;
        ``stat`` is the value of the declared ``statistic`` (None without one)."""
        raise NotImplementedError(f"{type(self).__name__} must implement foreground(values, stat)")

    # -- running ----------------------------------------------------------------------------
    def run(self, ctx, values):
        values = np.asarray(values)
        labels, _ = label(self.foreground(values, ctx.statistic), self.connectivity,
                          self.min_size)
        inside = labels > 0
        self.write_lineage(ctx, np.argwhere(inside), labels[inside],
                           lambda: np.argwhere(~inside))
        return labels

    def write_lineage(self, ctx, cells: np.ndarray, ids: np.ndarray,
                      background: Callable[[], np.ndarray]) -> None:
        """One pair per region (``cells`` labelled ``ids``, every cell of each region)
        and, unless composite, one identity pair per ``background()`` cell."""
        if Mode.FULL in ctx.modes:
            ctx.lwrite_groups(cells, ids, (cells, ids))
            bg = background()
            ctx.lwrite(bg, bg, each=True)
        if Mode.PAY in ctx.modes:
            ctx.lwrite_groups(cells, ids, payload=b"")
            ctx.lwrite(background(), payload=b"", each=True)
        if Mode.COMP in ctx.modes:
            ctx.lwrite_groups(cells, ids, payload=b"")

    # -- lineage from coordinates (composite mode's background; a region's pair is its cells) --
    def map_b(self, cells, i, ctx):
        return cells

    def map_f(self, cells, i, ctx):
        return cells

    def map_p(self, cells, payload, i, ctx):
        return cells

    def map_p_pairs(self, cells, offsets, payloads, pay_ids, i, ctx):
        return cells, np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
