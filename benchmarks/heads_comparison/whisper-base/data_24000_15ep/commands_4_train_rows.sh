#!/usr/bin/env bash
# Call 4 of 4: the shipped recipe (path heads reading the speech, 1 layer, 15 epochs) trained on the 24 000 utterances,
# exported over heads/whisper-base in this call's copy of the tree, and the GPU rows measured with it; everything
# comes back as one tar in parts of 15 MiB (cat run.tar.* | tar -x).
set -euo pipefail
START=$(date +%s); elapsed() { echo $(( $(date +%s) - START )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD MEDUSA_ASR_CACHE=/tmp/cache
W=/tmp/w; BASE=/tmp/cache/whisper-base; R=$W/results; mkdir -p $R
cp $W/bd/whisper-english-spelling.json /tmp/cache/
pack() { cp $W/speech/*.json $W/collect/collect_info.json $R/ 2>/dev/null || true
  tar -C $W -cf $W/run.tar results; split -b 15M -d $W/run.tar $OUT/run.tar.; }
trap pack EXIT
# (resumes: a no-op when call 3 finished it)
python3 -m pipeline.collect --base $BASE --speech --language en --device cuda --dtype bfloat16 --batch-size 96 \
    --audio $W/speech --out $W/collect 2>&1 | tail -2
echo "collect checked at $(elapsed) s"
python3 -m pipeline.compare_heads --base $BASE --data $W/collect --eval-data $W/collect_real --out $W/compare \
    --epochs 15 --batch-size 64 --lr 2e-3 --device cuda --variants path-speech 2>&1 | grep -v "it/s\]" | tail -15
mkdir -p $R/compare; cp $W/compare/comparison.* $W/compare/path-speech/metrics.json $R/compare/
echo "trained at $(elapsed) s"
python3 -m pipeline.export --base $BASE --base-id openai/whisper-base --heads $W/compare/path-speech/best.safetensors \
    --out heads/whisper-base --data-info $W/speech/manifest.jsonl --force 2>&1 | tail -3
cp -r heads/whisper-base $R/artifact
for draft in auto tree-32; do
  python3 -m tools.benchmark --device cuda --dtype bfloat16 --model heads/whisper-base --repeats 3 --quiet --no-plot \
      --audio $W/bd/eval/manifest.jsonl --compile --draft $draft --out $R/gpu_base_$draft --summary $R/summary.json
  echo "row $draft at $(elapsed) s"
done
