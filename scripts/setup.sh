#!/usr/bin/env bash
# Create .venv when missing, install SubZero into it (skipped when nothing
# changed), and check for Java 17+ (needed by the Spark engine).
# Usage: scripts/setup.sh [--require-java]
set -euo pipefail
cd "$(dirname "$0")/.."

PY=""
for cand in python3.13 python3.12 python3.11 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    PY="$cand"; break
  fi
done
if [ -z "$PY" ]; then
  echo "setup: SubZero needs Python 3.11 or newer; install it (e.g. apt-get install python3.11 python3.11-venv) and retry." >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)" >&2
  "$PY" -m venv .venv || { echo "setup: could not create a virtualenv; install the venv module (e.g. apt-get install python3-venv)." >&2; exit 1; }
fi

stamp=.venv/.subzero-installed
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! .venv/bin/python -c 'import subzero' 2>/dev/null; then
  echo "setup: installing SubZero and its dependencies into .venv (first time takes a few minutes)" >&2
  .venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  if ! .venv/bin/python -m pip install -e '.[test,bench]' > .venv/pip-install.log 2>&1 \
     || ! .venv/bin/python -c 'import subzero, lmdb, rtree, swiglpk, zarr, pyspark, zstandard, duckdb, starlette, uvicorn, plotly, playwright, threadpoolctl' 2>>.venv/pip-install.log; then
    grep -v -E "^WARNING: Location .* is ignored" .venv/pip-install.log | tail -25 >&2
    echo "setup: installation failed (pip's last messages above; full log in .venv/pip-install.log)." >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi

# SubZero's own modules compiled once, beside their sources (as pip compiles what it
# installs): an editable install leaves that to the first import, and where
# PYTHONDONTWRITEBYTECODE is set (some CI and container images) every process
# compiled them again -- 0.2 s of each `subzero` command.  Only changed files are
# compiled again; a stale one is never used (Python checks each source's mtime)
.venv/bin/python -m compileall -q -j 0 subzero optimizer operators workflows >/dev/null

# Java 17+ for PySpark
java_ok=0
if command -v java >/dev/null 2>&1; then
  ver=$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
  major=${ver%%.*}
  [ "$major" = "1" ] && major=$(echo "$ver" | cut -d. -f2)
  if [ -n "$major" ] && [ "$major" -ge 17 ] 2>/dev/null; then java_ok=1; fi
fi
if [ "$java_ok" = 1 ]; then
  echo ok > .venv/.java-ok
else
  rm -f .venv/.java-ok
  msg="Java 17+ was not found (PySpark needs it for the Spark engine). Install it, e.g. 'apt-get install openjdk-17-jre-headless' on Debian/Ubuntu or 'brew install openjdk@17' on macOS, or set JAVA_HOME. Until then use '--engine local'; Spark tests are skipped."
  if [ "${1:-}" = "--require-java" ]; then echo "setup: $msg" >&2; exit 1; fi
  echo "setup: warning: $msg" >&2
fi
