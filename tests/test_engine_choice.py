"""Which engine `subzero run` uses when none is asked for, and that it says so first."""

import os
import subprocess

from conftest import EXAMPLE, subzero_exe

from subzero.engines.choice import choose_engine
from subzero.tuning import SPARK_PAYS_CELLS


def no_java():
    return None


def java17():
    return 17


def test_asked_for_engine_is_kept():
    assert choose_engine("local", "spark://h:7077", [10**9], java17).engine == "local"
    assert choose_engine("spark", None, [1], no_java).engine == "spark"


def test_a_master_means_spark():
    c = choose_engine(None, "spark://head:7077", [1], no_java)
    assert c.engine == "spark" and "spark://head:7077" in c.reason


def test_size_decides_without_a_master():
    small = choose_engine("auto", None, [SPARK_PAYS_CELLS - 1, 5], java17)
    assert small.engine == "local" and "--engine spark" in small.reason
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
