#!/usr/bin/env bash
# A later lease: the other tiny.en GPU rows with the shipped heads (trained on 18 000 utterances). Calls back to back:
#   bash commands_4_more_rows.sh bundle          carrying .gpu/bd and .gpu/t1_tokenizer.json.xz (see
#                                                whisper-base/data_24000_15ep/commands_1_synth.sh for .gpu/bd)
#   bash commands_4_more_rows.sh part N          carrying .gpu/tN, N = 1..4: the base's float16 parts, made here with
#       python -m tools.carry_weights split ~/.cache/medusa-asr/whisper-tiny.en .gpu/t --parts 4
#       (its tokenizer.json moved out of .gpu/t1 and xz-compressed to .gpu/t1_tokenizer.json.xz, to keep each call
#       under 64 MiB; 4 parts since the tracked tree passed 42 MB, 3 before)
#   bash commands_4_more_rows.sh rows ARGS...    one tools.benchmark row per ARG: a draft (compiled rounds, batch 1)
#                                                or batchN (auto, graph rounds); tarred into $OUT (cat run.tar.* | tar -x)
set -euo pipefail
W=/tmp/w; BASE=/tmp/cache/whisper-tiny.en
case "${1:?usage: commands_4_more_rows.sh bundle|part N|rows ARGS...}" in
  bundle) mkdir -p $W/parts; cp -r .gpu/bd/. $W/bd/; xz -dc .gpu/t1_tokenizer.json.xz > $W/tokenizer.json; exit 0 ;;
  part) cp -r ".gpu/t${2:?usage: part N}" $W/parts/; ls $W/parts; exit 0 ;;
  rows) shift ;;
esac
START=$(date +%s); elapsed() { echo $(( $(date +%s) - START )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W/bd/*.whl
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD MEDUSA_ASR_CACHE=/tmp/cache
mkdir -p /tmp/cache; cp $W/bd/whisper-english-spelling.json /tmp/cache/
if [ ! -f $BASE/model.safetensors ]; then
  python3 -m tools.carry_weights join $(ls -d $W/parts/t* | sort -V) --out $BASE; cp $W/tokenizer.json $BASE/
fi
R=$W/results; rm -rf $R; mkdir -p $R
pack() { tar -C $W -cf $W/run.tar results; split -b 15M -d $W/run.tar $OUT/run.tar.; }
trap pack EXIT
BENCH="python3 -m tools.benchmark --device cuda --dtype bfloat16 --model heads/whisper-tiny.en --repeats 3 --quiet --no-plot --audio $W/bd/eval/manifest.jsonl"
for row in "$@"; do
  case $row in
    batch*) $BENCH --draft auto --batch-size ${row#batch} --out $R/gpu_tiny.en_${row}_graph --summary $R/summary.json > $R/$row.log 2>&1 ;;
    *) $BENCH --compile --draft $row --out $R/gpu_tiny.en_$row --summary $R/summary.json > $R/$row.log 2>&1 ;;
  esac
  echo "row $row at $(elapsed) s"
done
