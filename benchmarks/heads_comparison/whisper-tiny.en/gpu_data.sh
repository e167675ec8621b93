#!/usr/bin/env bash
# On the lent GPU: rebuild tiny.en from the carried fp16 parts, synthesise NUM utterances, collect them (and the 28
# real recordings) into /tmp/w. Used by capacity_8000_15ep/commands.sh (8000) and data_18000_15ep (18000).
#   bash benchmarks/heads_comparison/whisper-tiny.en/gpu_data.sh NUM
# The base travelled as three float16 parts (.gpu/pa, .gpu/pb, .gpu/pc, one per call, each copied to /tmp/w) and
# was joined here by inline Python since made into tools.carry_weights (same steps, same SHA-256 check); to rerun:
#   python -m tools.carry_weights split ~/.cache/medusa-asr/whisper-tiny.en .gpu/p --parts 3   (here; then pa=p1 ...)
set -euo pipefail
START=$(date +%s); elapsed() { echo $(( $(date +%s) - START )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
W=/tmp/w; mkdir -p $W; cp -r .gpu/pd/. $W/pd/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W/pd/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -m tools.carry_weights join $W/pa $W/pb $W/pc --out $W/tiny
cp $W/pd/tokenizer.json $W/tiny/
tar -C $W -xJf $W/pd/flite.tar.xz; xz -dc $W/pd/sentences.txt.xz > $W/sentences.txt; cp $W/pd/sentences.txt.source.json $W/
echo "ready at $(elapsed) s"
python3 -m pipeline.synth_speech --out $W/speech --num-utterances "${1:?usage: gpu_data.sh NUM_UTTERANCES}" --workers 15 --flite-bin $W/flitebundle/bin/flite \
    --text-file $W/sentences.txt --voices slt:3,rms:2,awb:2,kal16:2,kal:1 --quiet 2>&1 | tail -3
echo "synth done at $(elapsed) s"; cp $W/speech/*.json $OUT/ 2>/dev/null || true
python3 -m pipeline.collect --base $W/tiny --audio $W/speech --out $W/collect --speech --device cuda --dtype bfloat16 --batch-size 96 2>&1 | tail -3
python3 -m pipeline.collect --base $W/tiny --audio $W/pd/eval/manifest.jsonl --out $W/collect_real --speech --device cuda --dtype bfloat16 --batch-size 96 2>&1 | tail -3
echo "collect done at $(elapsed) s"; cp $W/collect/collect_info.json $OUT/ 2>/dev/null || true
echo "data done at $(elapsed) s"
