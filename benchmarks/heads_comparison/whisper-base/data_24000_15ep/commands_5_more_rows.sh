#!/usr/bin/env bash
# A second lease: the other whisper-base GPU rows with the shipped heads. Carried first: .gpu/bd (one call, as in
# commands_1_synth.sh but without starting the synthesis: bash commands_5_more_rows.sh bundle), then the seven parts
# (commands_2_carry.sh N), then this script with no argument: join, then the rows, tarred into $OUT as in call 4.
set -euo pipefail
W=/tmp/w
if [ "${1:-}" = bundle ]; then mkdir -p $W; cp -r .gpu/bd/. $W/bd/; exit 0; fi
START=$(date +%s); elapsed() { echo $(( $(date +%s) - START )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W/bd/*.whl
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD MEDUSA_ASR_CACHE=/tmp/cache
BASE=/tmp/cache/whisper-base; R=$W/results; mkdir -p $R
[ -f $BASE/model.safetensors ] || python3 -m tools.carry_weights join $(ls -d $W/parts/b* | sort -V) --out $BASE
cp $W/bd/whisper-english-spelling.json /tmp/cache/
pack() { tar -C $W -cf $W/run.tar results; split -b 15M -d $W/run.tar $OUT/run.tar.; }
trap pack EXIT
BENCH="python3 -m tools.benchmark --device cuda --dtype bfloat16 --model heads/whisper-base --repeats 3 --quiet --no-plot --audio $W/bd/eval/manifest.jsonl"
for draft in chain tree tree-64; do
  $BENCH --compile --draft $draft --out $R/gpu_base_$draft --summary $R/summary.json > $R/gpu_base_$draft.log 2>&1
  echo "row $draft at $(elapsed) s"; grep -A3 "vs own greedy: end" $R/gpu_base_$draft/results.md | head -2
done
for batch in 4 16 64; do  # (64: one batch of the 28 recordings, so not kept as a batch-64 row)
  $BENCH --draft auto --batch-size $batch --out $R/gpu_base_batch${batch}_graph --summary $R/summary.json > $R/batch$batch.log 2>&1
  echo "row batch $batch at $(elapsed) s"
done
