"""Linear algebra: 2-D matrix multiply.

``out[i, j]`` depends on row i of A and column j of B.  The Full lineage is
written per input rather than per output cell: one pair (row i of the
output, row i of A) per row and one pair (column j of the output, column j
of B) per column.  That is the same relation as the mapping functions, with
about (n + m) pairs and n*k + k*m input cells instead of n*m pairs of 2k cells.
"""

from __future__ import annotations

import numpy as np

from subzero.model.grid import Grid

from .base import MappedOperator, grid_product, no_cells, rows


class MatMul(MappedOperator):
    """``A @ B`` for 2-D A (n, k) and B (k, m)."""

    arity = 2

    def output_shape(self, a, b):
        if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
            raise ValueError(f"MatMul: needs 2-D shapes (n, k) and (k, m), got {tuple(a)} and "
                             f"{tuple(b)}")
        return (a[0], b[1])

    def compute(self, a, b):
        self.output_shape(a.shape, b.shape)
        return a @ b

    def output_grid(self, grids, input_shapes, output_shape):
        """Rows are labelled as A's rows, columns as B's columns."""
        a, b = grids
        dims = (a.dims[0] if a is not None else "dim_0", b.dims[1] if b is not None else "dim_1")
        coords = {}
        if a is not None and a.dims[0] in a.coords:
            coords[dims[0]] = a.coords[a.dims[0]]
        if b is not None and b.dims[1] in b.coords and dims[1] != dims[0]:
            coords[dims[1]] = b.coords[b.dims[1]]
        return Grid(dims, coords) if coords else None

    def backward(self, cells, i, ctx):
        k = ctx.input_shape(0)[1]
        if i == 0:      # row i of A: fixed axis 0 = out row, free axis 1
            return grid_product(cells[:, :1], [1], [k], 2, [0])
        return grid_product(cells[:, 1:], [0], [k], 2, [1])

    def forward(self, cells, i, ctx):
        n, m = ctx.output_shape
        if i == 0:      # A[i, l] feeds every out[i, :]
            out, _ = grid_product(cells[:, :1], [1], [m], 2, [0])
        else:           # B[l, j] feeds every out[:, j]
            out, _ = grid_product(cells[:, 1:], [0], [n], 2, [1])
        return out

    def emit_full(self, ctx) -> None:
        (n, k), (_, m) = ctx.input_shape(0), ctx.input_shape(1)
        if n * m == 0:
            return
        ri = np.arange(n, dtype=np.int64)[:, None]
        out_rows, g_out = grid_product(ri, [1], [m], 2, [0])
        a_rows, g_a = grid_product(ri, [1], [k], 2, [0])
        ctx.lwrite_groups(out_rows, g_out, (a_rows, g_a), (no_cells(2), rows(0, 0)))
        cj = np.arange(m, dtype=np.int64)[:, None]
        out_cols, g_out = grid_product(cj, [0], [n], 2, [1])
        b_cols, g_b = grid_product(cj, [0], [k], 2, [1])
        ctx.lwrite_groups(out_cols, g_out, (no_cells(2), rows(0, 0)), (b_cols, g_b))
