"""CLI start-up (issue 33): what a person at a terminal waits for, cold process.

Each measurement is a fresh process, alternated across the commands and
repeated (median, and the CPU time the process used, which load moves less
than wall time):

- ``python -c pass``: Python's bare start-up, the floor;
- ``subzero --version``;
- ``subzero trace --store STORE --from stars --cells 1162,112 --to raw_1``: the
  demo's star trace, end to end (text output: counts, values, sky region),
  with the engine's own time for the trace read from ``--json`` in the same
  process kind;
- ``python -X importtime`` of that trace: the import time of each library it
  loaded (self time, summed per top-level package).

``--python`` measures another interpreter (e.g. another checkout's
``.venv/bin/python``) in the same rounds, so the code before a change and after
it are compared on the same machine state; each interpreter traces its own copy
of the store (make the store with the older code: a newer one may upgrade it).

Python's bytecode: an installed SubZero, or a checkout that has run once, loads
its modules from cached bytecode (``__pycache__``), and that is what a person
waits for.  So each interpreter gets its own bytecode cache
(``PYTHONPYCACHEPREFIX`` in the benchmark's temporary folder: nothing is
written into the checkouts measured), filled by a first trace that is not
counted, and ``PYTHONDONTWRITEBYTECODE`` is dropped from the environment.
``--no-bytecode-cache`` measures the other case, every module compiled from
source by every process (a checkout whose ``__pycache__`` cannot be written, or
``PYTHONDONTWRITEBYTECODE=1``).

    .venv/bin/python benchmarks/startup.py [--store .subzero-demo] [--repeats 15]
        [--python OTHER/.venv/bin/python] [--no-bytecode-cache] [--no-write]

Without a store, one is made first (the astronomy workflow, in-process).
Targets: the trace at most 0.5 s wall on a quiet machine and at most 5x the
engine's trace time plus Python's bare start-up; ``--version`` at most 0.15 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bytecode_env, command_line, machine, update_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STAR = "1162,112"
#: where the measured processes start: not a checkout, whose ``subzero`` folder
#: ``python -m`` would import instead of the interpreter's own installation
NEUTRAL = tempfile.gettempdir()


def _timed(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + system, of the child) of one run of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=NEUTRAL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, p.stdout


def _imports(python: str, args: list[str], env: dict) -> dict[str, float]:
    """Self import time (ms) per top-level package of one cold trace."""
    p = subprocess.run([python, "-X", "importtime", "-m", "subzero.cli", *args],
                       capture_output=True, text=True, env=env, timeout=600, cwd=NEUTRAL)
    per: dict[str, float] = {}
    for line in p.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line.split("|")
        try:
            own = int(parts[0].split(":")[1])
        except ValueError:
            continue
        top = parts[2].strip().split(".")[0]
        per[top] = per.get(top, 0.0) + own / 1000
    return per


def _ensure_store(store: Path) -> None:
    if (store / "store.json").exists():
        return
    print(f"making {store} (astronomy workflow, in-process)...", flush=True)
    subprocess.run([sys.executable, "-m", "subzero.cli", "run", "workflows/astronomy.py",
                    "--store", str(store), "--engine", "local", "-q"], check=True, cwd=ROOT)


def _environment(work: Path, k: int, bytecode: bool) -> dict[str, str]:
    """The environment of interpreter ``k``'s processes: its own bytecode cache under
    ``work`` (or none: every module compiled by every process)."""
    env = bytecode_env(work / f"pycache-{k}" if bytecode else None)
    env["SUBZERO_ENGINE"] = "local"
    return env


def measure(pythons: dict[str, str], store: Path, repeats: int, bytecode: bool = True) -> dict:
    """Each interpreter traces its own copy of ``store`` (a newer SubZero may upgrade a
    store's catalog as it opens it, which an older one then refuses), with its own
    bytecode cache when ``bytecode``."""
    work = Path(tempfile.mkdtemp(prefix="sz-startup-"))
    traces, envs = {}, {}
    for k, (label, py) in enumerate(pythons.items()):
        copy = work / f"store-{k}"
        shutil.copytree(store, copy)
        traces[label] = ["trace", "--store", str(copy), "--from", "stars", "--cells", STAR,
                         "--to", "raw_1"]
        envs[label] = _environment(work, k, bytecode)
        for cmd in ([py, "-c", "pass"], [py, "-m", "subzero.cli", "--version"],
                    [py, "-m", "subzero.cli", *traces[label]]):
            _timed(cmd, envs[label])   # warm the page cache (and fill the bytecode cache)
    rows: dict[str, dict[str, list]] = {}
    for k in range(repeats):
        for label, py in pythons.items():
            trace, env = traces[label], envs[label]
            r = rows.setdefault(label, {})
            for what, cmd in (("bare", [py, "-c", "pass"]),
                              ("version", [py, "-m", "subzero.cli", "--version"]),
                              ("trace", [py, "-m", "subzero.cli", *trace])):
                wall, cpu, _ = _timed(cmd, env)
                r.setdefault(what, []).append(wall)
                r.setdefault(what + "_cpu", []).append(cpu)
            _, _, out = _timed([py, "-m", "subzero.cli", *trace, "--json"], env)
            r.setdefault("engine", []).append(json.loads(out)["seconds"])
        print(f"  round {k + 1}/{repeats}", flush=True)
    out: dict = {}
    for label, r in rows.items():
        med = {k: statistics.median(v) for k, v in r.items()}
        med["imports"] = _imports(pythons[label], traces[label], envs[label])
        out[label] = med
    shutil.rmtree(work, ignore_errors=True)
    return out


def report(result: dict, repeats: int, load: tuple[float, float], bytecode: bool = True) -> str:
    cache = ("each interpreter's modules loaded from its own bytecode cache (filled by a "
             "first, uncounted trace), as an installed SubZero loads them" if bytecode else
             "no bytecode cache (`PYTHONDONTWRITEBYTECODE=1`): every process compiles every "
             "module it imports from source")
    lines = [f"Command: `{command_line()}` — machine: {machine()}; load average "
             f"{load[0]:.1f} when it started, {load[1]:.1f} when it ended.",
             "",
             f"Cold processes, medians of {repeats} alternated rounds; CPU = user + system time "
             f"of the process; {cache}.  Trace: the demo's brightest star (`--cells {STAR}`) "
             f"back to `raw_1`, text output (count, first values, sky region).",
             "",
             "| code | python -c pass | --version (CPU) | trace wall (CPU) | engine trace | "
             "5 x engine + bare | trace over that | version <= 0.15 s | trace <= 0.5 s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for label, m in result.items():
        bound = 5 * m["engine"] + m["bare"]
        lines.append(
            f"| {label} | {m['bare'] * 1000:.0f} ms | {m['version'] * 1000:.0f} ms "
            f"({m['version_cpu'] * 1000:.0f}) | {m['trace'] * 1000:.0f} ms "
            f"({m['trace_cpu'] * 1000:.0f}) | {m['engine'] * 1000:.1f} ms | {bound * 1000:.0f} ms | "
            f"{m['trace'] / bound:.2f}x | {'met' if m['version'] <= 0.15 else 'missed'} | "
            f"{'met' if m['trace'] <= 0.5 else 'missed'} |")
    lines += ["", "Import time of one cold trace, self time summed per package (ms, "
              "`python -X importtime`):", ""]
    labels = list(result)
    tops = sorted({t for m in result.values() for t in m["imports"]},
                  key=lambda t: -max(m["imports"].get(t, 0) for m in result.values()))[:14]
    lines.append("| package | " + " | ".join(labels) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in labels) + " |")
    for t in tops:
        lines.append(f"| {t} | " + " | ".join(f"{result[k]['imports'].get(t, 0):.0f}" for k in labels) + " |")
    lines.append("| all | " + " | ".join(f"{sum(result[k]['imports'].values()):.0f}" for k in labels) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=str(ROOT / ".subzero-demo"))
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--python", help="another interpreter to measure in the same rounds "
                                     "(e.g. the code before a change)")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="compile every module in every process (PYTHONDONTWRITEBYTECODE=1)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    store = Path(a.store).resolve()
    _ensure_store(store)
    pythons = {"this code": sys.executable}
    if a.python:
        pythons["--python"] = a.python
    bytecode = not a.no_bytecode_cache
    load = os.getloadavg()[0]
    result = measure(pythons, store, a.repeats, bytecode)
    text = report(result, a.repeats, (load, os.getloadavg()[0]), bytecode)
    print(text)
    (ROOT / "benchmarks" / ".work").mkdir(parents=True, exist_ok=True)
    (ROOT / "benchmarks" / ".work" / "startup.json").write_text(json.dumps(result, indent=1))
    if not a.no_write:
        if bytecode:
            update_section("startup", "## CLI start-up (issue 33)\n\n" + text)
        else:
            update_section("startup-compiled", "### CLI start-up without a bytecode cache\n\n" + text)


if __name__ == "__main__":
    main()
