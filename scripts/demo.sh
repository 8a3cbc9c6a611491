#!/usr/bin/env bash
# The main job: run the LSST astronomy workflow on the two real exposures
# with lineage, then ask which raw pixels made a star, in each exposure.
set -euo pipefail
cd "$(dirname "$0")/.."
SZ=.venv/bin/subzero
STORE=.subzero-demo
STAR=1162,112          # the peak pixel of the brightest star on this sensor
echo "== subzero run workflows/astronomy.py   (2 LSST exposures, 26 operators)"
$SZ run workflows/astronomy.py --store "$STORE" --engine spark -v
for j in 1 2; do
  echo
  echo "== which pixels of raw exposure $j made the star at ($STAR)?"
  $SZ trace --store "$STORE" --from stars --cells "$STAR" --to "raw_$j" --plot "demo-star-raw_$j.png"
done
echo
echo "== the same star by its position on the sky: every raw pixel within 1 arcsec"
$SZ trace --store "$STORE" --from stars --sky 23:49:21.56,-2:44:58.9 --radius 1arcsec --to raw_1 \
  --plot demo-star-sky.png
echo
echo "== the scientists' query workload (BQ0-BQ3, FQ0)"
$SZ trace --store "$STORE" --workload workflows/astronomy_workload.json
