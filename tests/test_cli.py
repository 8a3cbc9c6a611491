"""The CLI end to end: happy paths, --json, and one clear line per mistake."""

import json
import textwrap

import numpy as np
import pytest
from conftest import EXAMPLE

CYCLE = """
from subzero import Workflow, Operator
class I(Operator):
    def run(self, ctx, x, y=None):
        return x
def workflow():
    wf = Workflow('cyc'); wf.input('a')
    wf.add('x', I(), 'y')
    wf.add('y', I(), 'x')
    return wf
"""

RAISES = """
from subzero import Workflow, Operator
class Bad(Operator):
    def run(self, ctx, x):
        return x / 0 if False else [][1]
def workflow():
    wf = Workflow('r'); a = wf.input('a', default='a.npy')
    wf.add('explode', Bad(), a)
    return wf
"""

OOB = """
import numpy as np
from subzero import Workflow, Operator, Mode
class Oob(Operator):
    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}
    def run(self, ctx, x):
        ctx.lwrite(np.array([[0, 99]]), np.array([[0, 0]]))
        return x
def workflow():
    wf = Workflow('o'); a = wf.input('a', default='a.npy')
    wf.add('oob', Oob(), a)
    return wf
"""


def one_line(err: str) -> str:
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("subzero: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def wfdir(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(12.0).reshape(3, 4))
    for name, text in (("cycle.py", CYCLE), ("raises.py", RAISES), ("oob.py", OOB),
                       ("noworkflow.py", "x = 1\n")):
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_run_trace_runs_show(cli, tmp_path):
    st = tmp_path / "st"
    code, out, err = cli("run", EXAMPLE, "--store", st, "--strategy", "stars=full", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["run_id"] == 1 and {o["name"] for o in info["ops"]} == {"calib", "smooth", "clean", "stars"}
    code, out, err = cli("trace", "--store", st, "--from", "stars", "--cells", "40,70", "--to", "raw", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["direction"] == "backward" and res["count"] == len(res["cells"]) > 1
    assert res["cells"] == sorted(res["cells"]) and [40, 70] in res["cells"]
    # the same through an explicit path
    code, out2, _ = cli("trace", "--store", st, "--from", "stars", "--cells", "40,70",
                        "--path", "stars:0,clean:0,calib:0", "--json")
    assert json.loads(out2)["cells"] == res["cells"]
    # forward with a box SPEC, human output
    code, out, _ = cli("trace", "--store", st, "--run", "1", "--from", "raw", "--cells", "10:12,18:22",
                       "--to", "stars")
    assert code == 0 and "forward trace raw -> stars: 8 cell(s) in" in out and "bounding box" in out
    code, out, _ = cli("runs", "--store", st)
    assert code == 0 and "complete" in out and "example" in out
    code, out, _ = cli("show", "1", "--store", st)
    assert code == 0 and "full:fullone:backward" in out and "lineage total" in out
    code, out, _ = cli("show", "--store", st, "--json")
    assert json.loads(out)["run"]["id"] == 1


def test_cell_list_spec_and_multi_input_path(cli, tmp_path):
    st = tmp_path / "st"
    cli("run", EXAMPLE, "--store", st)
    code, out, err = cli("trace", "--store", st, "--from", "calib", "--cells", "1,2;3,4",
                         "--path", "calib:1", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["to"] == "flat" and res["cells"] == [[1, 2], [3, 4]]


@pytest.mark.parametrize("args,msg", [
    (["run", "{d}/missing.py"], "workflow file not found"),
    (["run", "{d}/noworkflow.py"], "does not define workflow()"),
    (["run", "{d}/cycle.py"], "has a cycle through x, y"),
    (["run", "{d}/raises.py"], "operator 'explode' (Bad) failed: IndexError"),
    (["run", "{d}/oob.py", "--strategy", "oob=full"], "operator 'oob' wrote lineage for output cell (0, 99)"),
    (["run", EXAMPLE, "--strategy", "calib=full"], "does not support strategy full:fullone:backward"),
    (["run", EXAMPLE, "--strategy", "nope=full"], "unknown operator 'nope'"),
    (["run", EXAMPLE, "--strategy", "stars=full:payone"], "uses encoding fullone or fullmany"),
    (["run", EXAMPLE, "--strategy", "stars"], "malformed --strategy 'stars'"),
    (["run", EXAMPLE, "--input", "zz=x.npy"], "has no input 'zz'"),
])
def test_run_errors(cli, wfdir, args, msg):
    args = [a.format(d=wfdir) for a in args] + ["--store", wfdir / "st"]
    code, out, err = cli(*args)
    assert code == 2
    line = one_line(err)
    assert msg in line, line


def test_failed_run_recorded_and_listed(cli, wfdir):
    st = wfdir / "st"
    assert cli("run", EXAMPLE, "--store", st)[0] == 0
    import os
    cwd = os.getcwd()
    os.chdir(wfdir)
    try:
        code, _, err = cli("run", "raises.py", "--store", st)
    finally:
        os.chdir(cwd)
    assert code == 2
    code, out, _ = cli("runs", "--store", st)
    assert "failed" in out and "explode" in out
    code, out, _ = cli("trace", "--store", st, "--from", "stars", "--cells", "1,1", "--to", "raw")
    assert code == 0   # 'latest' = the latest complete run


@pytest.mark.parametrize("args,msg", [
    (["--run", "7", "--from", "stars", "--cells", "1,1", "--to", "raw"], "unknown run '7'"),
    (["--run", "abc", "--from", "stars", "--cells", "1,1", "--to", "raw"], "unknown run 'abc'"),
    (["--from", "galaxies", "--cells", "1,1", "--to", "raw"], "unknown array 'galaxies'"),
    (["--from", "stars", "--cells", "1,1", "--to", "moon"], "unknown array 'moon'"),
    (["--from", "stars", "--cells", "64,1", "--to", "raw"], "cell (64, 1) is outside stars (shape (64, 96))"),
    (["--from", "stars", "--cells", "0:65,1", "--to", "raw"], "outside stars"),
    (["--from", "stars", "--cells", "1,x", "--to", "raw"], "malformed cell SPEC '1,x'"),
    (["--from", "stars", "--cells", "1,2,3", "--to", "raw"], "has 3 coordinates but stars has 2 dimensions"),
    (["--from", "smooth", "--cells", "1,1", "--to", "stars"], "are not connected"),
    (["--from", "stars", "--cells", "1,1", "--path", "smooth:0"], "does not touch array 'stars'"),
    (["--from", "stars", "--cells", "1,1", "--path", "stars:3"], "has 1 inputs"),
    (["--from", "stars", "--cells", "1,1", "--path", "stars"], "malformed --path step 'stars'"),
    (["--from", "stars", "--cells", "1,1"], "exactly one of --to ARRAY or --path"),
])
def test_trace_errors(cli, tmp_path, args, msg):
    st = tmp_path / "st"
    assert cli("run", EXAMPLE, "--store", st)[0] == 0
    code, out, err = cli("trace", "--store", st, *args)
    assert code == 2
    assert msg in one_line(err)


def test_trace_without_store(cli, tmp_path):
    code, _, err = cli("trace", "--store", tmp_path / "none", "--from", "a", "--cells", "1", "--to", "b")
    assert code == 2 and "no SubZero store" in one_line(err)


def test_console_script_subprocess_one_line(shell, wfdir):
    """The installed console script: errors are one line, never a traceback."""
    code, out, err = shell("run", wfdir / "cycle.py", "--store", wfdir / "st")
    assert code == 2 and "cycle" in one_line(err)
    code, out, err = shell("run", EXAMPLE, "--store", wfdir / "st", "-q")
    assert code == 0 and out.strip().splitlines()[-1] == "1"
    code, out, err = shell("--help")
    assert code == 0 and "trace" in out


def test_runs_lists_under_a_header_row(cli, wfdir):
    st = wfdir / "st"
    code, out, _ = cli("runs", "--store", st)
    assert code == 2                                      # no store yet: one clear line
    assert cli("run", EXAMPLE, "--store", st)[0] == 0
    code, out, _ = cli("runs", "--store", st)
    header, row = out.splitlines()
    assert header.split() == ["id", "status", "workflow", "started", "duration", "trust"]
    assert row.split()[:3] == ["1", "complete", "example"] and row.split()[-1] == "trusted"
    assert header.index("trust") == row.index("trusted")
    assert header.index("status") == row.index("complete")      # the columns line up


def test_show_of_a_failed_run_says_its_inputs_were_not_stored(cli, wfdir):
    st = wfdir / "st"
    code, _, _ = cli("run", wfdir / "raises.py", "--store", st, "--input", f"a={wfdir / 'a.npy'}")
    assert code == 2
    code, out, err = cli("show", "1", "--store", st)
    assert code == 0, err
    assert "shape None" not in out
    assert f"input a = {wfdir / 'a.npy'}  not stored (the run is failed)" in out


def test_run_json_and_show_json_print_one_run_object(cli, tmp_path):
    st = tmp_path / "st"
    code, out, err = cli("run", EXAMPLE, "--store", st, "--json")
    assert code == 0, err
    ran = json.loads(out)
    code, out, _ = cli("show", "1", "--store", st, "--json")
    shown = json.loads(out)
    assert set(ran) == set(shown) == {"run_id", "workflow", "run", "ops", "arrays", "strategies",
                                      "downgrades", "trust", "binding", "coordinates",
                                      "input_digests", "rerun", "tags"}
    assert ran["trust"] == shown["trust"] == "trusted"
    assert ran["run_id"] == shown["run"]["id"] == 1 and ran["workflow"] == "example"
    assert set(ran["run"]) == set(shown["run"]) and ran["ops"] == shown["ops"]
    assert shown["run"]["status"] == "complete"            # run --json shows the finished run


@pytest.mark.parametrize("cmd", [["trace"], ["run", EXAMPLE], ["optimize", EXAMPLE], ["runs"], ["show"],
                                 ["trust"]])
def test_an_unknown_flag_shows_the_sub_command_usage(cli, capsys, cmd):
    with pytest.raises(SystemExit) as e:
        cli(*cmd, "--bogus")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: subzero {cmd[0]} " in err and "usage: subzero [-h]" not in err
    assert err.strip().splitlines()[-1] == f"subzero {cmd[0]}: error: unrecognized arguments: --bogus"


def test_every_command_says_what_it_does_and_every_option_is_explained(shell):
    """`subzero --help` lists every command, and each command's --help describes it and
    each of its options (a hidden option is hidden on purpose: --debug after a command),
    and ends with examples that parse."""
    import argparse
    import shlex

    from subzero.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    code, top, err = shell("--help")
    assert code == 0, err
    for name, p in sub.choices.items():
        assert name in top
        assert p.description and len(p.description) > 40, f"{name} has no description"
        for action in p._actions:
            if action.help == argparse.SUPPRESS:
                assert action.dest == "debug", f"{name} hides {action.option_strings}"
                continue
            assert action.help, f"{name}: {action.option_strings or action.dest} is not explained"
        code, out, err = shell(name, "--help")
        assert code == 0 and err == "", (name, err)
        assert out.startswith(f"usage: subzero {name}") and p.description.split()[0] in out
        examples = out.split("\nexamples:\n")[-1].splitlines() if "\nexamples:\n" in out else []
        assert examples and all(x.strip().startswith("subzero ") for x in examples), (name, out)
        for x in examples:                      # each example parses: its flags exist
            args = shlex.split(x.split("  #")[0])[1:]
            parsed, extra = parser.parse_known_args(args)
            assert not extra and parsed.cmd == args[0], (name, x, extra)
        assert any(x.strip().startswith(f"subzero {name}") for x in examples), name


def test_make_clean_removes_the_demo_files(tmp_path):
    import shutil
    import subprocess
    from pathlib import Path
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shutil.copy(Path(__file__).resolve().parent.parent / "Makefile", tmp_path)
    made = ["demo-star-raw_1.png", "demo-star-raw_2.png", "demo-trace.png", ".subzero-demo/x", ".subzero/x"]
    for name in made:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "keep.png").write_text("x")
    subprocess.run(["make", "-s", "clean"], cwd=tmp_path, check=True, capture_output=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Makefile", "keep.png"]


def test_optimize_progress_is_quiet_unless_on_a_terminal(capsys):
    """`subzero optimize` passes progress=None (a terminal decides) or False (--json)."""
    from subzero.optimizer import Progress
    quiet = Progress(None)                  # pytest captures stderr: not a terminal
    assert not quiet.on
    quiet.note("calibrating")
    with quiet.bar("calibrating", 3.0) as advance:
        advance(3.0)
    assert capsys.readouterr().err == ""
    loud = Progress(True)
    loud.note("calibrating this machine")
    with loud.bar("workload", 2, unit="query") as advance:
        advance()
        advance()
    err = capsys.readouterr().err
    assert "subzero: calibrating this machine" in err and "workload:" in err and "/2 " in err
    ticks = []
    old_form = Progress.of(lambda: ticks.append(1))     # the older callable argument
    with old_form.bar("workload", 2, unit="query") as advance:
        advance()
    assert ticks == [1] and not old_form.on and Progress.of(old_form) is old_form
