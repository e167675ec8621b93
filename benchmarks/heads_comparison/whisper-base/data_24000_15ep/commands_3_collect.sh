#!/usr/bin/env bash
# Call 3 of 4: the base rebuilt from its parts (SHA-256 checked), the synthesis awaited (and resumed had it stopped),
# the 24 000 utterances and the 28 real recordings collected in bf16 (collect resumes where a call's limit cut it).
set -euo pipefail
START=$(date +%s); elapsed() { echo $(( $(date +%s) - START )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD
W=/tmp/w; BASE=/tmp/cache/whisper-base
[ -f $BASE/model.safetensors ] || python3 -m tools.carry_weights join $(ls -d $W/parts/b* | sort -V) --out $BASE
while pgrep -f pipeline.synth_speech > /dev/null; do sleep 5; done
python3 -m pipeline.synth_speech --out $W/speech --num-utterances 24000 --workers 15 --flite-bin $W/flitebundle/bin/flite \
    --text-file $W/sentences.txt --voices slt:3,rms:2,awb:2,kal16:2,kal:1 --quiet 2>&1 | tail -3
echo "synth done at $(elapsed) s"
COLLECT="python3 -m pipeline.collect --base $BASE --speech --language en --device cuda --dtype bfloat16 --batch-size 96"
$COLLECT --audio $W/bd/eval/manifest.jsonl --out $W/collect_real 2>&1 | tail -2
timeout $(( 570 - $(elapsed) )) $COLLECT --audio $W/speech --out $W/collect 2>&1 | tail -3 || echo "collect cut at $(elapsed) s"
echo "call 3 done at $(elapsed) s"
