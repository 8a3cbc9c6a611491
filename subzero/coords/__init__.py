"""Lineage in the scientists' own terms: sky positions and axis labels.

``grids`` says where each array's cells sit (stored with inputs, derived for
operators' outputs); ``sky`` maps RA/Dec to cells and cells to sky regions
through a FITS WCS; ``labels`` maps xarray-style label selections to cells.
The query layer still works in cells: these modules only translate at its edges.
"""

from subzero.coords.grids import derive_grids, stored_grid, wcs_keywords, with_grid
from subzero.coords.labels import cells_for, label_bounds, parse_sel
from subzero.coords.sky import cells_at, footprint, parse_position, parse_radius

__all__ = ["cells_at", "cells_for", "derive_grids", "footprint", "label_bounds", "parse_position",
           "parse_radius", "parse_sel", "stored_grid", "wcs_keywords", "with_grid"]
