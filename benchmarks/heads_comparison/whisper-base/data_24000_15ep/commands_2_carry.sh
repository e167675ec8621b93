#!/usr/bin/env bash
# Call 2 of 4, seven times back to back (carrying .gpu/bN, N = 1..7): the base's float16 parts, made here with
#   python -m tools.carry_weights split ~/.cache/medusa-asr/whisper-base .gpu/b --parts 7
#   bash benchmarks/heads_comparison/whisper-base/data_24000_15ep/commands_2_carry.sh N
set -euo pipefail
mkdir -p /tmp/w/parts && cp -r ".gpu/b${1:?usage: commands_2_carry.sh PART}" /tmp/w/parts/
ls /tmp/w/parts; tail -c 300 /tmp/w/synth.log 2>/dev/null || true; ls /tmp/w/speech 2>/dev/null | wc -l
