"""Which engine `subzero run` uses when none is asked for, and that it says so first."""

import os
import subprocess

import pytest
from conftest import EXAMPLE, subzero_exe

from subzero.cli import cli_terms
from subzero.engines.choice import EngineRequest, choose_engine, resume_engine
from subzero.errors import UsageError
from subzero.tuning import SPARK_PAYS_CELLS


def no_java():
    return None


def java17():
    return 17


def test_asked_for_engine_is_kept():
    assert choose_engine("local", None, [10**9], java17).engine == "local"
    assert choose_engine("spark", None, [1], no_java).engine == "spark"


def test_spark_settings_with_the_local_engine_are_refused_in_python_terms():
    """The API and the CLI refuse alike; the message names the Python parameters, and
    the CLI shows the same message with its flags."""
    with pytest.raises(UsageError, match=r"`master` needs the Spark engine \(`engine='spark'`\)"):
        choose_engine(EngineRequest("local", "spark://h:7077"), input_cells=[1], java_version=java17)
    with pytest.raises(UsageError, match=r"`master` and `manifest` need"):
        EngineRequest("local", "spark://h:7077", instances=True).check()
    with pytest.raises(UsageError, match=r"unknown engine 'gpu'"):
        EngineRequest("gpu").check()
    assert cli_terms("`master` needs the Spark engine (`engine='spark'`)") == \
        "--master needs the Spark engine (--engine spark)"


def test_spark_settings_choose_spark():
    for request in (EngineRequest(conf={"spark.x": "1"}), EngineRequest(session=object())):
        assert choose_engine(request, input_cells=[1], java_version=no_java).engine == "spark"
    assert choose_engine(EngineRequest(instances=True), java_version=java17).engine == "spark"
    with pytest.raises(UsageError, match="Java 17"):
        choose_engine(EngineRequest(instances=True), java_version=no_java)


def test_resume_keeps_the_runs_engine_unless_told():
    assert resume_engine(EngineRequest(), "spark").engine == "spark"
    assert resume_engine(EngineRequest("auto"), "local").engine == "local"
    assert resume_engine(EngineRequest(master="spark://h:7077"), "local").engine == "spark"
    assert resume_engine(EngineRequest("local"), "spark").engine == "local"


def test_a_master_means_spark():
    c = choose_engine(None, "spark://head:7077", [1], no_java)
    assert c.engine == "spark" and "spark://head:7077" in c.reason


def test_size_decides_without_a_master():
    small = choose_engine("auto", None, [SPARK_PAYS_CELLS - 1, 5], java17)
    assert small.engine == "local" and "--engine spark" in cli_terms(small.reason)
    big = choose_engine(None, None, [5, SPARK_PAYS_CELLS], java17)
    assert big.engine == "spark" and big.line().startswith("engine: Spark (local[*])")
    nojava = choose_engine(None, None, [SPARK_PAYS_CELLS], no_java)
    assert nojava.engine == "local" and nojava.fallback and "Java 17+" in nojava.reason


def test_cli_says_which_engine_in_its_first_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SUBZERO_ENGINE"}
    p = subprocess.run([subzero_exe(), "run", EXAMPLE, "--store", tmp_path / "st"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    first = p.stdout.splitlines()[0]
    assert first.startswith("engine: the in-process engine") and "at which Spark pays" in first
    p = subprocess.run([subzero_exe(), "run", EXAMPLE, "--store", tmp_path / "st", "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and p.stdout.lstrip().startswith("{"), p.stdout
    p = subprocess.run([subzero_exe(), "runs", "--store", tmp_path / "st", "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert '"engine": "local"' in p.stdout

