#!/usr/bin/env bash
# The main job: run the example workflow with lineage, then trace a star
# back to the raw image and a raw region forward to the star map.
set -euo pipefail
cd "$(dirname "$0")/.."
SZ=.venv/bin/subzero
STORE=.subzero-demo
echo "== subzero run workflows/example.py"
$SZ run workflows/example.py --store "$STORE" --strategy clean=comp --strategy stars=full -v
echo
echo "== backward: which raw pixels made the star at (40, 70)?"
$SZ trace --store "$STORE" --from stars --cells 40,70 --to raw
echo
echo "== forward: what did the raw region [10:12, 18:22] affect in the star map?"
$SZ trace --store "$STORE" --from raw --cells 10:12,18:22 --to stars
