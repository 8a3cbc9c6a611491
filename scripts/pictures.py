"""Redraw the README's pictures from a run of the LSST workflow.

    .venv/bin/python scripts/pictures.py [STORE]      (default .subzero-demo, after `make demo`)

docs/sky-trace.png: a trace started from a sky position, drawn on RA/Dec axes
(``subzero trace --sky ... --plot``).  docs/export-mask.png: that trace exported as
a Zarr mask and read back by xarray alone, as a lab's own notebook would.
The explorer's screenshot comes from its browser test (tests/test_explore.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import xarray as xr  # noqa: E402

import subzero  # noqa: E402
from subzero import export  # noqa: E402
from subzero.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SKY = "23:49:21.56,-2:44:58.9"          # the brightest star on the sensor


def main_(store: str) -> None:
    docs = ROOT / "docs"
    docs.mkdir(exist_ok=True)
    code = main(["trace", "--store", store, "--from", "stars", "--sky", SKY, "--radius", "1arcsec",
                 "--to", "raw_1", "--plot", str(docs / "sky-trace.png")])
    if code:
        sys.exit(code)
    with subzero.open_store(store, create=False) as st:
        run = st.get("latest")
        res = run.trace("stars", sky=SKY, to="raw_1", record=False)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "star.zarr"
            export.write_mask(res, path)
            mask = xr.open_zarr(path)["raw_1_lineage"]              # dask-backed
            raw = run.array("raw_1")
            near = dict(y=slice(1100, 1225), x=slice(60, 165))
            fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
            raw.isel(near).plot.imshow(ax=axes[0], cmap="gray", robust=True, origin="lower")
            axes[0].set_title("raw_1 near the star")
            raw.where(mask).isel(near).plot.imshow(ax=axes[1], cmap="magma", robust=True,
                                                   origin="lower")
            axes[1].set_title("raw_1.where(xr.open_zarr('star.zarr')['raw_1_lineage'])")
            fig.suptitle(f"the star at {SKY}: {int(mask.sum())} raw pixels in its lineage, "
                         f"exported as a Zarr mask", fontsize=10)
            fig.tight_layout()
            fig.savefig(docs / "export-mask.png", dpi=90)
            plt.close(fig)
    print(f"wrote {docs / 'sky-trace.png'} and {docs / 'export-mask.png'}")


if __name__ == "__main__":
    main_(sys.argv[1] if len(sys.argv) > 1 else ".subzero-demo")
