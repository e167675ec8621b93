#!/usr/bin/env bash
# Started by `lease.sh start` in the lent machine's copy of the tree, in the background: synthesise 32 000
# utterances, collect them and the 28 real recordings with the base (once its parts have arrived), train the shipped
# recipe (path heads reading the speech, 1 layer per head, 15 epochs; the 2-layer variant gained 0.03 tokens per
# round at 18 000 and costs a CPU round more, so this lease trains the shipped shape only), export it over
# heads/whisper-tiny.en, and measure the GPU rows with it (auto, chain, tree of 32). Results under /tmp/w/results.
set -euo pipefail
START=$(date +%s); stage() { echo "[$(( $(date +%s) - START )) s] $*"; }
W=/tmp/w; BASE=/tmp/cache/whisper-tiny.en; R=$W/results; mkdir -p $R /tmp/cache
trap 'stage "ended (status $?)"; touch $W/ended' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W/bd/*.whl
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD MEDUSA_ASR_CACHE=/tmp/cache
cp $W/bd/whisper-english-spelling.json /tmp/cache/
tar -C $W -xJf $W/bd/flite.tar.xz; xz -dc $W/bd/sentences.txt.xz > $W/sentences.txt; cp $W/bd/sentences.txt.source.json $W/
stage "synthesis starts"
python3 -m pipeline.synth_speech --out $W/speech --num-utterances 32000 --workers 15 --flite-bin $W/flitebundle/bin/flite \
    --text-file $W/sentences.txt --voices slt:3,rms:2,awb:2,kal16:2,kal:1 --quiet 2>&1 | tail -3
cp $W/speech/*.json $R/; stage "synthesis done"
while [ ! -f $W/parts/ready ]; do sleep 2; done
python3 -m tools.carry_weights join $W/parts/t1 $W/parts/t2 $W/parts/t3 --out $BASE; cp $W/tokenizer.json $BASE/
COLLECT="python3 -m pipeline.collect --base $BASE --speech --device cuda --dtype bfloat16 --batch-size 96"
$COLLECT --audio $W/bd/eval/manifest.jsonl --out $W/collect_real 2>&1 | tail -2
$COLLECT --audio $W/speech --out $W/collect 2>&1 | tail -2
cp $W/collect/collect_info.json $R/; stage "collection done"
python3 -m pipeline.compare_heads --base $BASE --data $W/collect --eval-data $W/collect_real --out $W/compare \
    --epochs 15 --batch-size 64 --lr 2e-3 --device cuda --keep-going --variants path-speech 2>&1 \
    | grep -v "it/s\]" | tail -8
mkdir -p $R/compare; cp $W/compare/comparison.* $R/compare/
for v in $W/compare/*/; do n=$(basename $v); cp $v/metrics.json $R/compare/${n}_metrics.json; cp $v/best.safetensors $R/compare/${n}_best.safetensors; done
stage "training done"
CHOSEN=path-speech
stage "exporting $CHOSEN"; echo "$CHOSEN" > $R/chosen.txt
python3 -m pipeline.export --base $BASE --base-id openai/whisper-tiny.en --heads $W/compare/$CHOSEN/best.safetensors \
    --out heads/whisper-tiny.en --data-info $W/speech/manifest.jsonl --force 2>&1 | tail -2
cp -r heads/whisper-tiny.en $R/artifact
BENCH="python3 -m tools.benchmark --device cuda --dtype bfloat16 --model heads/whisper-tiny.en --repeats 3 --quiet --no-plot --audio $W/bd/eval/manifest.jsonl"
for draft in auto chain tree-32; do
  $BENCH --compile --draft $draft --out $R/gpu_tiny.en_$draft --summary $R/summary.json > $R/gpu_tiny.en_$draft.log 2>&1
  stage "row $draft"; grep -A2 "vs own greedy: end" $R/gpu_tiny.en_$draft/results.md | head -2 || true
done
