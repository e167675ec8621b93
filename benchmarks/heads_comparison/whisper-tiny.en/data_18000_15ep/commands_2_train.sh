#!/usr/bin/env bash
# Data scaling, call 2 of 2 (on the same machine, right after call 1): 1 and 2 layers per head on the 18 000 utterances.
set -euo pipefail
START=$(date +%s); elapsed() { echo $(( $(date +%s) - START )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD
W=/tmp/w
# (collect resumes: a no-op when call 1 finished it)
python3 -m pipeline.collect --base $W/tiny --audio $W/speech --out $W/collect --speech --device cuda --dtype bfloat16 --batch-size 96 2>&1 | tail -2
echo "collect checked at $(elapsed) s"
COMPARE="python3 -m pipeline.compare_heads --base $W/tiny --data $W/collect --eval-data $W/collect_real --out $W/compare --epochs 15 --batch-size 64 --lr 2e-3 --device cuda --keep-going"
save() { mkdir -p $OUT/compare; cp $W/compare/comparison.* $OUT/compare/ 2>/dev/null || true
  for v in $W/compare/*/; do n=$(basename $v); cp $v/metrics.json $OUT/compare/${n}_metrics.json 2>/dev/null || true; done; }
$COMPARE --variants path-speech,path-speech-2l 2>&1 | grep -v "it/s\]" | tail -15; save
echo "call 2 done at $(elapsed) s"
