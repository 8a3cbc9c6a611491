"""A command pays only for the libraries it uses (issue 33: a CLI that starts fast).

Each check runs in a fresh interpreter and looks at ``sys.modules`` after the
command: ``import subzero``, ``import subzero.cli``, ``--version`` and ``--help``
load none of the heavy libraries (nor numpy); a trace of a run whose arrays are
numpy, ending on an image with a plain sky WCS, loads neither xarray, pandas,
scipy, astropy, zarr, pyspark nor matplotlib -- and still prints the answer's
values and sky region.  A labelled query (``--sel``) may load pandas, a
``--sky`` one astropy: they need them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent

#: what a command must not import unless it needs it
HEAVY = ("xarray", "pandas", "scipy", "astropy", "zarr", "numcodecs", "pyspark", "matplotlib",
         "dask", "PIL", "duckdb", "swiglpk")

#: the run side: what runs, resumes, re-runs, tidies or checks runs, or answers impact
#: over them (orchestration, engines, Spark sessions, incremental re-runs); a trace only
#: reads a store, so a CLI trace imports none of it (issue 33).  ``subzero.engines.choice``
#: is not here: the command line's ``--engine`` choices come from it, and it imports no
#: engine.
RUN_SIDE = ("subzero.api", "subzero.runs.launch", "subzero.runs.rerun", "subzero.runs.many",
            "subzero.runs.options", "subzero.runs.journal", "subzero.runs.transaction",
            "subzero.runs.clean", "subzero.runs.fsck", "subzero.runs.share",
            "subzero.engines.base", "subzero.engines.driver", "subzero.engines.local",
            "subzero.engines.spark", "subzero.engines.incremental", "subzero.engines.parent",
            "subzero.engines.changes", "subzero.engines.lineage", "subzero.engines.stats",
            "subzero.engines.progress", "subzero.impact", "subzero.export", "subzero.parallel")

PROBE = textwrap.dedent("""
    import json, sys
    code = None
    try:
        exec(sys.argv[1])
    except SystemExit as e:
        code = e.code
    sys.stdout.flush()
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
    print("\\nPROBE " + json.dumps({"heavy": heavy, "numpy": "numpy" in sys.modules,
                                     "code": code, "modules": sorted(sys.modules)}))
""")


def _probe(statement: str, cwd=None) -> tuple[dict, str]:
    """Run ``statement`` in a fresh interpreter; what it printed, and which of HEAVY
    (and numpy) it left imported."""
    p = subprocess.run([sys.executable, "-c", PROBE, statement, json.dumps(HEAVY)],
                       capture_output=True, text=True, timeout=120, cwd=cwd,
                       env={**__import__("os").environ, "SUBZERO_ENGINE": "local"})
    out, _, last = p.stdout.rpartition("\nPROBE ")
    assert last, f"the probe did not finish: {p.stderr[-2000:]}"
    return json.loads(last), out


@pytest.mark.parametrize("statement", [
    "import subzero",
    "import subzero.cli",
    "import subzero.optimizer",
    "import subzero.cli as c; c.main(['--version'])",
    "import subzero.cli as c; c.main(['--help'])",
    "import subzero.cli as c; c.main(['trace', '--help'])",
])
def test_start_up_imports_nothing_heavy(statement):
    got, out = _probe(statement)
    assert got["heavy"] == [], f"{statement!r} imported {got['heavy']}"
    assert not got["numpy"], f"{statement!r} imported numpy"
    if "--version" in statement:
        assert out.strip().startswith("subzero ")


def test_the_version_said_is_the_installed_one_and_the_projects():
    """`--version` prints the source's version without asking the installed
    distributions (that costs 60 ms at start-up): it must be theirs, and pyproject's."""
    import tomllib
    from importlib.metadata import version

    from subzero.version import __version__
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert __version__ == project == version("subzero-lineage")
    _, out = _probe("import subzero.cli as c; c.main(['--version'])")
    assert out.strip() == f"subzero {project}"


def test_public_names_still_import():
    got, _ = _probe("import subzero; from subzero import Store, Operator, ExactMedian, "
                    "TraceResult, open_store, __version__; assert subzero.Workflow; "
                    "assert 'Store' in dir(subzero)")
    assert got["code"] is None


def test_an_unknown_name_is_an_attribute_error():
    import subzero
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        subzero.nonesuch  # noqa: B018
    from subzero import optimizer
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        optimizer.nonesuch  # noqa: B018


WORKFLOW = '''
"""A workflow whose module imports no heavy library: a stencil, a threshold."""
import numpy as np
from subzero import Workflow
from subzero.operators import MeanFilter, Threshold

def workflow():
    wf = Workflow("light")
    wf.input("image")
    wf.add("smooth", MeanFilter(size=3), "image")
    wf.add("bright", Threshold(5.0), "smooth")
    return wf
'''


@pytest.fixture(scope="module")
def sky_run(tmp_path_factory):
    """A run of WORKFLOW on a FITS image with a TAN WCS in ICRS (the LSST kind)."""
    from astropy.io import fits

    import subzero
    d = tmp_path_factory.mktemp("imports")
    rng = np.random.default_rng(3)
    image = rng.normal(0, 1, (64, 80)).astype(np.float32)
    image[30:33, 40:43] += 50
    header = fits.Header({"CTYPE1": "RA---TAN", "CTYPE2": "DEC--TAN", "RADESYS": "ICRS",
                          "CRPIX1": 40.0, "CRPIX2": 32.0, "CRVAL1": 150.1, "CRVAL2": 2.2,
                          "CD1_1": -5e-5, "CD1_2": 0.0, "CD2_1": 0.0, "CD2_2": 5e-5})
    fits.PrimaryHDU(image, header).writeto(d / "image.fits")
    (d / "light.py").write_text(WORKFLOW)
    store = subzero.open_store(d / "store")
    try:
        run = store.run(str(d / "light.py"), inputs={"image": str(d / "image.fits")},
                        engine="local", progress=False)
        expected = run.trace("bright", [(31, 41)], to="image")
    finally:
        store.close()
    return d, expected


def test_a_trace_of_numpy_arrays_imports_nothing_heavy(sky_run):
    d, expected = sky_run
    args = ["trace", "--store", str(d / "store"), "--from", "bright", "--cells", "31,41",
            "--to", "image"]
    got, out = _probe(f"import subzero.cli as c; sys.exit(c.main({args!r}))", cwd=d)
    assert got["code"] == 0, out
    assert got["heavy"] == [], f"a trace imported {got['heavy']}"
    # and it still says everything: count, values, sky region
    assert f"{len(expected.cells)} cell(s) out" in out
    assert "first cells: (30, 40)=" in out
    assert "sky region: centre 10h00m" in out
    got, out = _probe(f"import subzero.cli as c; sys.exit(c.main({[*args, '--json']!r}))", cwd=d)
    answer = json.loads(out)
    assert answer["cells"] == expected.cells.tolist()
    assert got["heavy"] == []


def _run_side(modules: list[str]) -> list[str]:
    """The modules of RUN_SIDE (or inside them) among ``modules``."""
    return [m for m in modules if any(m == r or m.startswith(r + ".") for r in RUN_SIDE)]


def test_a_trace_imports_nothing_of_the_run_side(sky_run):
    """A trace opens a store to read it: running, re-running, impact and the engines
    stay unloaded; so do re-execution when every step reads stored lineage or maps,
    and the R-tree library when no step reads an R-tree."""
    d, expected = sky_run
    args = ["trace", "--store", str(d / "store"), "--from", "bright", "--cells", "31,41",
            "--to", "image", "--json"]
    got, out = _probe(f"import subzero.cli as c; sys.exit(c.main({args!r}))", cwd=d)
    assert got["code"] == 0, out
    answer = json.loads(out)
    assert answer["cells"] == expected.cells.tolist()
    assert _run_side(got["modules"]) == [], "a trace imported the run side"
    methods = [s["method"] for s in answer["steps"]]
    assert not any(m.startswith("reexec") for m in methods), methods
    assert not {"subzero.query.reexec", "subzero.query.tilerun", "subzero.capture.runner"} \
        & set(got["modules"]), "a trace that re-executes nothing imported re-execution"
    if not any("many" in m for m in methods):
        assert "rtree" not in got["modules"], "a trace that reads no R-tree imported rtree"
    # np.unique(axis=0) and np.median import numpy.ma (17 ms): the trace log's query
    # signature (this trace is logged) uses unique_rows
    assert "numpy.ma" not in got["modules"], "a trace imported numpy.ma"


def test_a_trace_through_the_api_imports_nothing_of_the_run_side(sky_run):
    """``subzero.open_store`` comes from the store's own module: opening a store and
    tracing through the Python API does not import the run side either."""
    d, expected = sky_run
    got, out = _probe(f"import subzero; s = subzero.open_store({str(d / 'store')!r}, create=False); "
                      f"print(len(s.get().trace('bright', [(31, 41)], to='image', record=False)))",
                      cwd=d)
    assert got["code"] is None, out
    assert out.strip() == str(len(expected.cells))
    assert _run_side(got["modules"]) == [], "a trace through the API imported the run side"


def test_the_optimizer_fits_with_scipy_but_loads_without_it():
    """A budget run on a calibrated machine loads the calibration, profiles, builds and
    solves its plan: scipy.optimize (0.36 s to import) is needed only to fit a new one."""
    got, _ = _probe("import subzero.optimizer.plan, subzero.optimizer.calibration, "
                    "subzero.optimizer.ilp, subzero.optimizer.profile")
    assert "scipy.optimize" not in got["modules"]
