#!/usr/bin/env bash
# The tiny.en GPU rows for the retrained heads: rebuild the base from the carried fp16 parts, then tools.benchmark.
# As run: the GPU image lacks jiwer (and rapidfuzz) and Whisper's spelling table, so a second call installed those wheels,
# copied whisper-english-spelling.json into $MEDUSA_ASR_CACHE and ran the command below with --draft auto, then --draft tree-32.
set -euo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
W=/tmp/w; mkdir -p $W/pd; cp .gpu/pe/tokenizer.json $W/pd/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/pe/*.whl
export PYTHONPATH=/tmp/site
python3 - <<'PY'
import json, hashlib, torch, shutil, os
W = "/tmp/w"; os.makedirs(f"{W}/tiny", exist_ok=True)
blob = b"".join(open(f"{W}/{p}/w.part", "rb").read() for p in ("pa", "pb", "pc"))
index = json.load(open(f"{W}/pa/index.json")); sd = {}
for e in index:
    raw = torch.frombuffer(bytearray(blob[e["offset"]:e["offset"] + e["bytes"]]), dtype=torch.uint8) if e["bytes"] else torch.empty(0, dtype=torch.uint8)
    half = raw.view(getattr(torch, e["half"].split(".")[1])).reshape(e["shape"])
    sd[e["key"]] = half.to(getattr(torch, e["dtype"].split(".")[1])).contiguous()
h = hashlib.sha256()
for k in sorted(sd): h.update(sd[k].numpy().tobytes())
assert h.hexdigest() == "071a5ec4660126d5da875ff1d4e0ed78104328fddf29c807df4bc3f313851115", "weights differ"
from safetensors.torch import save_file
save_file(sd, f"{W}/tiny/model.safetensors", metadata={"format": "pt"})
for f in os.listdir(f"{W}/pa"):
    if f.endswith(".json") and f != "index.json": shutil.copy(f"{W}/pa/{f}", f"{W}/tiny/{f}")
shutil.copy(f"{W}/pd/tokenizer.json", f"{W}/tiny/tokenizer.json")
print("weights rebuilt, sha ok")
PY
mkdir -p /tmp/cache && rm -rf /tmp/cache/whisper-tiny.en && mv $W/tiny /tmp/cache/whisper-tiny.en
export MEDUSA_ASR_CACHE=/tmp/cache PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/stage && cp -r .gpu/pe/eval /tmp/stage/
python3 -m tools.benchmark --device cuda --dtype bfloat16 --model heads/whisper-tiny.en --repeats 3 --quiet --no-plot \
    --audio /tmp/stage/eval/manifest.jsonl --compile --draft auto --out $OUT/gpu_tiny.en_auto --summary $OUT/summary.json
