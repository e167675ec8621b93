#!/usr/bin/env bash
# One lease of the lent H200, in back-to-back calls (it keeps /tmp for ~30 s between calls; each call carries at most
# 64 MiB, the tracked tree ~43 MB of it). Results go to $OUT.
#   bash benchmarks/gpu/lease.sh make-bundle   HERE, before the lease: .gpu/bd (wheels for the GPU's Python 3.12, the
#                                              recordings of work_data/eval_speech as FLAC) and .gpu/t1..t4
#   bash benchmarks/gpu/lease.sh bundle        carrying .gpu/bd: the wheels the image lacks (soundfile, soxr, cffi,
#                                              pycparser, jiwer, rapidfuzz), the 28 recordings as FLAC (eval/) and
#                                              Whisper's English spelling table; then the GPU tests and call_overhead
#   bash benchmarks/gpu/lease.sh part N        carrying .gpu/tN, N = 1..4: tiny.en's float16 parts, made here with
#       python -m tools.carry_weights split ~/.cache/medusa-asr/whisper-tiny.en .gpu/t --parts 4
#   bash benchmarks/gpu/lease.sh whisper       joins the parts; the real-clip rows (compiled auto) and the first call
#   bash benchmarks/gpu/lease.sh meralion ARGS python -m tools.benchmark_gpu ARGS --out $OUT/g
# Run on 2026-12-05 on an H100 in this order (results in benchmarks/gpu/h100, real_speech/h100_tiny.en_auto,
# first_call/h100_tiny.en.json, round_cost/h100_call_overhead.json): bundle; part 1..4; whisper;
# meralion --shape meralion2-3b --sections lengths --length-methods ours --lengths 32,128 --compile-batches 1;
# meralion --shape meralion2-10b --sections batching --batches 4 --compile-batches 4 --batch-drafts none,chain,tree-32.
# The whisper call took 480 s and the 10B one 520 s of a 600 s call limit: give each a call of its own.
set -euo pipefail
W=/tmp/w; BASE=/tmp/cache/whisper-tiny.en
# the lent card names the files (h200_..., h100_...): either kind may come
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -o 'H[0-9]\+' | head -1 | tr H h || true); GPU=${GPU:-gpu}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD MEDUSA_ASR_CACHE=/tmp/cache
case "${1:?usage: lease.sh make-bundle|bundle|part N|whisper|meralion ARGS...}" in
  make-bundle)
    mkdir -p .gpu/bd/eval/flac; cp ~/.cache/medusa-asr/whisper-english-spelling.json .gpu/bd/
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        -d .gpu/bd soundfile soxr cffi pycparser jiwer rapidfuzz
    python - <<'PY'
import json, os, soundfile
source, target = "work_data/eval_speech", ".gpu/bd/eval"
with open(f"{target}/manifest.jsonl", "w") as out:
    for line in open(f"{source}/manifest.jsonl"):
        row = json.loads(line)
        audio, rate = soundfile.read(os.path.join(source, row["audio"]), dtype="int16")
        row["audio"] = "flac/" + os.path.splitext(os.path.basename(row["audio"]))[0] + ".flac"
        soundfile.write(os.path.join(target, row["audio"]), audio, rate, format="FLAC")
        out.write(json.dumps(row) + "\n")
PY
    python -m tools.carry_weights split ~/.cache/medusa-asr/whisper-tiny.en .gpu/t --parts 4 ;;
  bundle)
    mkdir -p $W/parts /tmp/cache; cp -r .gpu/bd/. $W/bd/; cp $W/bd/whisper-english-spelling.json /tmp/cache/
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W/bd/*.whl
    # a failing test is reported, and the call still measures (pipefail would end it here)
    python3 -m pytest -q -p no:cacheprovider tests/test_gpu_round_reuse.py tests/test_attention_forms.py \
        tests/test_weight_only.py > $OUT/gpu_tests.log 2>&1 || true
    tail -15 $OUT/gpu_tests.log
    python3 benchmarks/round_cost/call_overhead.py --shapes tiny.en,base --out $OUT/${GPU}_call_overhead.json \
        > $OUT/call_overhead.log 2>&1 || tail -20 $OUT/call_overhead.log
    tail -5 $OUT/call_overhead.log ;;
  part) cp -r ".gpu/t${2:?usage: part N}" $W/parts/; ls $W/parts ;;
  whisper)
    [ -f $BASE/model.safetensors ] || python3 -m tools.carry_weights join $(ls -d $W/parts/t* | sort -V) --out $BASE
    python3 -m tools.benchmark --device cuda --dtype bfloat16 --model heads/whisper-tiny.en --repeats 3 --quiet \
        --no-plot --audio $W/bd/eval/manifest.jsonl --compile --draft auto --out $OUT/gpu_tiny.en_auto \
        --summary $OUT/summary.json > $OUT/tiny.en_auto.log 2>&1 || tail -20 $OUT/tiny.en_auto.log
    tail -3 $OUT/tiny.en_auto.log
    python3 benchmarks/first_call/first_call.py --device cuda --dtype bfloat16 --model heads/whisper-tiny.en \
        --audio "$W/bd/eval/$(head -1 $W/bd/eval/manifest.jsonl | python3 -c 'import json,sys; print(json.load(sys.stdin)["audio"])')" \
        --repeats 3 --out $OUT/${GPU}_tiny.en.json > $OUT/first_call.log 2>&1 || tail -20 $OUT/first_call.log
    tail -5 $OUT/first_call.log ;;
  meralion) shift; python3 -m tools.benchmark_gpu "$@" --out $OUT/g 2>&1 | tail -30 ;;
esac
