"""Inputs as scientists keep them: one variable of a NetCDF or Zarr file holding
several (``cube.nc:temp``, ``obs.zarr:night1/flux``), with its coordinates, from the
CLI and the API; every mistake one line naming the file and what it holds."""

import json
import subprocess

import numpy as np
import pytest
import xarray as xr
from conftest import subzero_exe

import subzero

WF = '''
from subzero import Workflow
from subzero.operators import MeanFilter

def workflow():
    wf = Workflow("cube")
    wf.add("smooth", MeanFilter(size=3), wf.input("a"))
    return wf
'''


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(2)
    ds = xr.Dataset({"temp": (("y", "x"), rng.random((12, 10))),
                     "pres": (("y", "x"), rng.random((12, 10)))},
                    coords={"y": np.arange(12) * 0.5, "x": np.arange(10) + 100.0})
    ds.to_netcdf(tmp_path / "cube.nc")
    ds.to_zarr(tmp_path / "obs.zarr", group="night1", zarr_format=2, consolidated=False)
    (tmp_path / "wf.py").write_text(WF)
    return tmp_path, ds


def cli(cwd, *args):
    p = subprocess.run([subzero_exe(), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("spec,var", [("cube.nc:temp", "temp"), ("cube.nc:pres", "pres"),
                                      ("obs.zarr:night1/pres", "pres")])
def test_one_variable_of_a_file_is_an_input_with_its_labels(files, spec, var):
    d, ds = files
    code, out, err = cli(d, "run", "wf.py", "--input", f"a={spec}", "--store", "s", "--engine",
                         "local", "--json")
    assert code == 0, err
    rid = json.loads(out)["run_id"]
    with subzero.open_store(d / "s", create=False) as st:
        a = st.get(rid).array("a")
        assert a.values.tobytes() == ds[var].values.tobytes()
        assert list(a.coords["x"].values) == list(ds["x"].values)
        assert st.runs_using(str(d / spec)) == [(rid, "a")]     # by content, as any input
    code, out, err = cli(d, "trace", "--store", "s", "--from", "smooth", "--sel", "y=2.5", "--sel", "x=104",
                         "--to", "a", "--json")
    assert code == 0 and json.loads(out)["count"] == 9, err


@pytest.mark.parametrize("spec,words", [
    ("cube.nc", "holds 2 variables (temp, pres); choose one as cube.nc:VARIABLE"),
    ("cube.nc:wind", "has no variable 'wind'; its variables: temp, pres"),
    ("obs.zarr:night9/pres", "has no group 'night9'"),
    ("gone.nc:temp", "file not found"),
])
def test_a_wrong_variable_is_one_line(files, spec, words):
    d, _ = files
    code, out, err = cli(d, "run", "wf.py", "--input", f"a={spec}", "--store", "s", "--engine",
                         "local")
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_openlineage_names_the_file_of_a_variable(files):
    from subzero.export.openlineage import openlineage_json
    d, ds = files
    with subzero.open_store(d / "s") as st:
        run = st.run(str(d / "wf.py"), inputs={"a": str(d / "cube.nc:temp")}, engine="local",
                     progress=False)
        doc = json.loads(openlineage_json(run))
    assert [i["name"] for i in doc["inputs"]] == [str((d / "cube.nc").resolve())]
