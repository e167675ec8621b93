#!/usr/bin/env bash
# Data scaling, call 1 of 2: rebuild tiny.en from the carried fp16 parts, synthesise 18 000 utterances, collect them.
set -euo pipefail
START=$(date +%s); elapsed() { echo $(( $(date +%s) - START )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
W=/tmp/w; mkdir -p $W; cp -r .gpu/pd/. $W/pd/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W/pd/*.whl
export PYTHONPATH=/tmp/site:$PWD
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
tar -C $W -xJf $W/pd/flite.tar.xz; xz -dc $W/pd/sentences.txt.xz > $W/sentences.txt; cp $W/pd/sentences.txt.source.json $W/
echo "ready at $(elapsed) s"
python3 -m pipeline.synth_speech --out $W/speech --num-utterances 18000 --workers 15 --flite-bin $W/flitebundle/bin/flite \
    --text-file $W/sentences.txt --voices slt:3,rms:2,awb:2,kal16:2,kal:1 --quiet 2>&1 | tail -3
echo "synth done at $(elapsed) s"; cp $W/speech/*.json $OUT/ 2>/dev/null || true
python3 -m pipeline.collect --base $W/tiny --audio $W/speech --out $W/collect --speech --device cuda --dtype bfloat16 --batch-size 96 2>&1 | tail -3
python3 -m pipeline.collect --base $W/tiny --audio $W/pd/eval/manifest.jsonl --out $W/collect_real --speech --device cuda --dtype bfloat16 --batch-size 96 2>&1 | tail -3
echo "collect done at $(elapsed) s"; cp $W/collect/collect_info.json $OUT/ 2>/dev/null || true
echo "call 1 done at $(elapsed) s"
