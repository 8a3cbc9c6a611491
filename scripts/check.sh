#!/usr/bin/env bash
# The checks that keep the tree clean: mypy over the whole `subzero` package and
# ruff over every Python folder. `make test` runs them before pytest.
#
# Why a link tree: the folders operators/, optimizer/ and workflows/ install as
# subzero.operators, subzero.optimizer and subzero.workflows through setuptools'
# editable-install import hook, which mypy cannot follow. build/typecheck/subzero/
# is the package as it is installed, made of symlinks, so mypy sees one namespace
# and reports errors against the real files.
# Usage: scripts/check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
PY=.venv/bin/python

tree=build/typecheck
rm -rf "$tree"
mkdir -p "$tree/subzero"
for entry in subzero/*; do
  name=$(basename "$entry")
  [ "$name" = "__pycache__" ] && continue
  ln -s "$root/$entry" "$tree/subzero/$name"
done
for pkg in operators optimizer workflows; do
  ln -s "$root/$pkg" "$tree/subzero/$pkg"
done

status=0
echo "check: mypy -p subzero" >&2
# mypy names files by their place in the link tree; the sed names them by their
# place in the repository (subzero/operators/x.py -> operators/x.py), so an
# editor can open them.
( cd "$tree" && "$root/$PY" -m mypy --config-file "$root/pyproject.toml" \
    --cache-dir "$root/build/mypy-cache" -p subzero ) \
  | sed -E 's#^subzero/(operators|optimizer|workflows)/#\1/#' || status=1
echo "check: ruff check" >&2
"$PY" -m ruff check subzero operators optimizer workflows tests benchmarks || status=1
exit $status
