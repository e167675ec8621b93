#!/usr/bin/env bash
# On the lent GPU, one call: synthesise and collect 8 000 utterances, then compare head capacities.
set -euo pipefail
bash benchmarks/heads_comparison/whisper-tiny.en/gpu_data.sh 8000
START=$(date +%s); elapsed() { echo $(( $(date +%s) - START )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD
W=/tmp/w
COMPARE="python3 -m pipeline.compare_heads --base $W/tiny --data $W/collect --eval-data $W/collect_real --out $W/compare --epochs 15 --batch-size 64 --lr 2e-3 --device cuda --keep-going"
save() { mkdir -p $OUT/compare; cp $W/compare/comparison.* $OUT/compare/ 2>/dev/null || true
  for v in $W/compare/*/; do n=$(basename $v); cp $v/metrics.json $OUT/compare/${n}_metrics.json 2>/dev/null || true
    cp $v/best.safetensors $OUT/compare/${n}_best.safetensors 2>/dev/null || true; done; }
$COMPARE --variants path-speech,path-speech-2l 2>&1 | grep -v "it/s\]" | tail -15; save
echo "two variants done at $(elapsed) s"
if [ "$(elapsed)" -lt 160 ]; then  # (as run: 400 s counted from before the data step, which took 240)
  timeout $(( 320 - $(elapsed) )) $COMPARE --variants path-speech,path-speech-2l,path-speech-3l 2>&1 | grep -v "it/s\]" | tail -15 || echo "3l cut by the time limit"
  save
fi
echo "all done at $(elapsed) s"
