#!/usr/bin/env bash
# The tiny.en GPU rows for the retrained heads: rebuild the base from the carried fp16 parts, then tools.benchmark.
# The base travelled as three float16 parts (.gpu/pa, .gpu/pb, .gpu/pc, one per call, each copied to /tmp/w) and
# was joined here by inline Python since made into tools.carry_weights (same steps, same SHA-256 check); to rerun:
#   python -m tools.carry_weights split ~/.cache/medusa-asr/whisper-tiny.en .gpu/p --parts 3   (here; then pa=p1 ...)
# As run: the GPU image lacks jiwer (and rapidfuzz) and Whisper's spelling table, so a second call installed those wheels,
# copied whisper-english-spelling.json into $MEDUSA_ASR_CACHE and ran the command below with --draft auto, then --draft tree-32.
set -euo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
W=/tmp/w; mkdir -p $W/pd; cp .gpu/pe/tokenizer.json $W/pd/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/pe/*.whl
export PYTHONPATH=/tmp/site
python3 -m tools.carry_weights join $W/pa $W/pb $W/pc --out $W/tiny
cp $W/pd/tokenizer.json $W/tiny/
mkdir -p /tmp/cache && rm -rf /tmp/cache/whisper-tiny.en && mv $W/tiny /tmp/cache/whisper-tiny.en
export MEDUSA_ASR_CACHE=/tmp/cache PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/stage && cp -r .gpu/pe/eval /tmp/stage/
python3 -m tools.benchmark --device cuda --dtype bfloat16 --model heads/whisper-tiny.en --repeats 3 --quiet --no-plot \
    --audio /tmp/stage/eval/manifest.jsonl --compile --draft auto --out $OUT/gpu_tiny.en_auto --summary $OUT/summary.json
