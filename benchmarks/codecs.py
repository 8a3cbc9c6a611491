"""Which lossless codec should SubZero's arrays use?  (issue 32, part 3)

Every array chunk is compressed, then checksummed (crc32c); today the compressor
is zstd at zarr's default level (3).  This measures the lossless codecs that suit
scientific arrays on the arrays a run really keeps, chunk by chunk at the run's
tile (512 x 512), and prints for each: bytes against today's, and encode and decode
speed against today's, measured alternately in the same process (median of
``--repeats``).  The data:

* the two real LSST exposures (uint16) and the arrays the astronomy workflow keeps
  (a run of it without lineage, in-process, in a scratch store): float images,
  masks, labels;
* what a run of the genomics workflow keeps at 100x the medulloblastoma cohort
  (its string tables and float matrices).

A codec is chosen by bytes, as long as it decodes at least ``MIN_DECODE`` times as
fast as today's (a trace reads chunks; a slower decode is paid on every query).

    .venv/bin/python benchmarks/codecs.py [--repeats 5] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, update_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TILE = 512
#: a codec must decode at least this fast, relative to today's, to be chosen
MIN_DECODE = 0.8


def codecs() -> dict[str, object]:
    from numcodecs import Blosc, Zstd
    return {
        "zstd-3 (today)": Zstd(level=3),
        "zstd-1": Zstd(level=1),
        "zstd-9": Zstd(level=9),
        "blosc-zstd-3 byte-shuffle": Blosc("zstd", 3, Blosc.SHUFFLE),
        "blosc-zstd-3 bit-shuffle": Blosc("zstd", 3, Blosc.BITSHUFFLE),
        "blosc-lz4-5 byte-shuffle": Blosc("lz4", 5, Blosc.SHUFFLE),
        "blosc-lz4-5 bit-shuffle": Blosc("lz4", 5, Blosc.BITSHUFFLE),
    }


def chunks_of(a: np.ndarray) -> list[np.ndarray]:
    """The array's chunks at the run's tile (2-D: 512 x 512; 1-D: 262,144 cells)."""
    if a.ndim == 1:
        return [np.ascontiguousarray(a[i:i + TILE * TILE]) for i in range(0, a.size, TILE * TILE)]
    return [np.ascontiguousarray(a[i:i + TILE, j:j + TILE])
            for i in range(0, a.shape[0], TILE) for j in range(0, a.shape[1], TILE)]


def astronomy_arrays() -> dict[str, np.ndarray]:
    """The real exposures and what a run of the astronomy workflow keeps, by kind."""
    import subzero
    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory(prefix="subzero-codecs-") as tmp:
        with subzero.open_store(Path(tmp) / "store") as st:
            run = st.run(str(ROOT / "workflows" / "astronomy.py"), engine="local", capture=False,
                         progress=False)
            shapes = run.shapes()
            for name in ("raw_1", "bias", "flat", "linearity_1", "rmbg_1", "crmask", "rmcr",
                         "stars"):
                if name in shapes:
                    a = np.asarray(run.array(name).values)
                    out[f"{name} ({a.dtype})"] = a
            run.close()
    return out


def genomics_arrays(replicate: int = 100) -> dict[str, np.ndarray]:
    """What a run of the genomics workflow keeps at ``replicate`` x the cohort: the
    string tables and the float matrices, by kind."""
    import subzero
    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory(prefix="subzero-codecs-") as tmp:
        with subzero.open_store(Path(tmp) / "store") as st:
            run = st.run(str(ROOT / "workflows" / "genomics.py"), engine="local", capture=False,
                         progress=False, params={"replicate": replicate})
            for name in run.shapes():
                a = np.asarray(run.array(name).values)
                if a.dtype.kind in "biufU" and a.size >= 1000:
                    out[f"genomics {name} ({a.dtype.kind}{a.dtype.itemsize})"] = a
            run.close()
    return out


def measure(data: dict[str, np.ndarray], repeats: int) -> dict[str, dict[str, dict[str, float]]]:
    """Per array and codec: bytes, encode and decode seconds (median of repeats, the
    codecs taken in turn within each repeat)."""
    cs = codecs()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, a in data.items():
        parts = chunks_of(a)
        times = {c: {"enc": [], "dec": []} for c in cs}
        sizes: dict[str, int] = {}
        for _ in range(repeats):
            for c, codec in cs.items():
                t0 = time.perf_counter()
                blobs = [codec.encode(p) for p in parts]
                t1 = time.perf_counter()
                for p, b in zip(parts, blobs):
                    if bytes(codec.decode(b)) != p.tobytes():      # bit for bit (NaN too)
                        raise SystemExit(f"{c} is not lossless on {name}")
                t2 = time.perf_counter()
                times[c]["enc"].append(t1 - t0)
                times[c]["dec"].append(t2 - t1)
                sizes[c] = sum(len(b) for b in blobs)
        out[name] = {c: {"raw": float(a.nbytes), "bytes": float(sizes[c]),
                         "enc": float(np.median(times[c]["enc"])),
                         "dec": float(np.median(times[c]["dec"]))} for c in cs}
    return out


def summarise(res: dict[str, dict[str, dict[str, float]]]) -> tuple[str, str]:
    """The table (per array kind and codec: bytes and speeds against today's) and the
    choice over all arrays."""
    today = "zstd-3 (today)"
    lines = ["| array | codec | of raw | bytes vs today | encode vs today | decode vs today |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    totals: dict[str, dict[str, float]] = {}
    for name, by in res.items():
        t = by[today]
        for c, m in by.items():
            lines.append(f"| {name} | {c} | {m['bytes'] / m['raw']:.3f} | {m['bytes'] / t['bytes']:.2f}x "
                         f"| {t['enc'] / m['enc']:.2f}x | {t['dec'] / m['dec']:.2f}x |")
            agg = totals.setdefault(c, {"bytes": 0.0, "dec": 0.0, "enc": 0.0, "raw": 0.0})
            for k in agg:
                agg[k] += m[k]
    t = totals[today]
    lines += ["", "All arrays together (bytes and times summed):", "",
              "| codec | of raw | bytes vs today | encode speed vs today | decode speed vs today |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for c, m in totals.items():
        lines.append(f"| {c} | {m['bytes'] / m['raw']:.3f} | {m['bytes'] / t['bytes']:.2f}x | "
                     f"{t['enc'] / m['enc']:.2f}x | {t['dec'] / m['dec']:.2f}x |")
    ok = {c: m for c, m in totals.items() if t["dec"] / m["dec"] >= MIN_DECODE}
    best = min(ok, key=lambda c: ok[c]["bytes"])
    m = totals[best]
    # the same rule array by array: what choosing per array (e.g. on its first chunk) could save
    per = {}
    for name, by in res.items():
        fine = {c: v for c, v in by.items() if by[today]["dec"] / v["dec"] >= MIN_DECODE}
        per[name] = min(fine, key=lambda c: fine[c]["bytes"])
    per_bytes = sum(res[n][c]["bytes"] for n, c in per.items())
    per_dec = sum(res[n][c]["dec"] for n, c in per.items())
    choice = (f"Chosen by the rule (fewest bytes among codecs decoding at least {MIN_DECODE}x as "
              f"fast as today's), one codec for every array: **{best}**, {m['bytes'] / t['bytes']:.2f}x "
              f"today's bytes, decoding {t['dec'] / m['dec']:.2f}x as fast. The same rule array by "
              f"array: {per_bytes / t['bytes']:.2f}x today's bytes, decoding {t['dec'] / per_dec:.2f}x "
              f"as fast ({', '.join(f'{n}: {c}' for n, c in per.items() if c != today) or 'today'})."
              )
    return "\n".join(lines), choice


def plot(res, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    today = "zstd-3 (today)"
    names = list(res)
    cs = list(next(iter(res.values())))
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    w = 0.8 / len(cs)
    for k, c in enumerate(cs):
        x = np.arange(len(names)) + k * w
        axes[0].bar(x, [res[n][c]["bytes"] / res[n][today]["bytes"] for n in names], w, label=c)
        axes[1].bar(x, [res[n][today]["dec"] / res[n][c]["dec"] for n in names], w, label=c)
    for ax, title in zip(axes, ("bytes vs today's (lower is better)",
                                "decode speed vs today's (higher is better)")):
        ax.set_xticks(np.arange(len(names)) + 0.4 - w / 2)
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_title(title)
    axes[1].axhline(MIN_DECODE, color="r", lw=0.8, ls="--")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    a = ap.parse_args()
    t0 = time.perf_counter()
    data = astronomy_arrays()
    data.update(genomics_arrays())
    res = measure(data, a.repeats)
    table, choice = summarise(res)
    print(table)
    print(choice)
    if a.no_write:
        return 0
    png = Path(__file__).resolve().parent / "codecs.png"
    plot(res, png)
    import os
    load = os.getloadavg()[0]
    body = (f"## Array codecs (issue 32, part 3)\n\nCommand: `{command_line()}` — machine: {machine()}; "
            f"load average {load:.1f} when it ended; {time.perf_counter() - t0:.0f} s.\n\n"
            f"Each array chunked at the run's tile (512 x 512), every chunk encoded and decoded "
            f"(and checked lossless), the codecs taken in turn, median of {a.repeats} rounds; "
            f"ratios against today's codec (zstd level 3) in the same rounds.\n\n"
            f"![codecs](codecs.png)\n\n{table}\n\n{choice}\n")
    update_section("codecs", body)
    print(f"RESULTS.md updated ({png.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
