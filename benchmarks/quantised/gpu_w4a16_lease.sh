#!/usr/bin/env bash
# Real W4A16 GPTQ Whisper rows on the lent GPU (int4 kernel on the checkpoint's 4-bit values), calls back to back
# (a warm machine keeps /tmp for 30 s after each call). Made here first:
#   make quantise-env; .venv-quant/bin/python -m pipeline.quantise ...      (work_data/quantised/whisper-M-w4a16)
#   python -m tools.carry_weights split work_data/quantised/whisper-tiny.en-w4a16 .gpu/qt --parts 3   (base: .gpu/qb, 4)
#   .gpu/qd: the wheels of compressed-tensors 0.19 and its dependencies (pydantic, pydantic-core, loguru,
#            annotated-types, typing-inspection, typing-extensions, psutil; pip download for cp312), soundfile, soxr,
#            cffi, pycparser, jiwer, rapidfuzz, and the 28 recordings (eval/) with whisper-english-spelling.json
# Then, one call each:
#   bash gpu_w4a16_lease.sh setup          carrying .gpu/qd
#   bash gpu_w4a16_lease.sh carry qb1      carrying .gpu/qb1 (then qb2 ...)
#   bash gpu_w4a16_lease.sh row base 4     joins qb1..qb4 and measures the row into $OUT
set -euo pipefail
Q=/tmp/q
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD MEDUSA_ASR_CACHE=/tmp/cache
case "${1:?usage: gpu_w4a16_lease.sh setup|carry PART|row MODEL PARTS}" in
  setup)
    mkdir -p $Q /tmp/cache; cp -r .gpu/qd $Q/; cp $Q/qd/whisper-english-spelling.json /tmp/cache/
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $Q/qd/*.whl
    python3 -c "import compressed_tensors, soundfile; print('compressed-tensors', compressed_tensors.__version__)" ;;
  carry)
    cp -r ".gpu/${2:?usage: gpu_w4a16_lease.sh carry PART}" $Q/; ls $Q ;;
  row)
    model=${2:?model: tiny.en or base}; parts=${3:?number of parts}
    prefix=$([ "$model" = base ] && echo qb || echo qt)
    python3 -m tools.carry_weights join $(for i in $(seq $parts); do echo $Q/$prefix$i; done) --out $Q/whisper-$model-w4a16
    python3 -m tools.benchmark --device cuda --dtype bfloat16 --model heads/whisper-$model --base $Q/whisper-$model-w4a16 \
        --audio $Q/qd/eval/manifest.jsonl --repeats 3 --quiet --no-plot --draft auto --int4-kernel \
        --out $OUT/gpu_${model}_w4a16_int4 --quantised-summary $OUT/quantised.json 2>&1 | tail -25 ;;
esac
