#!/usr/bin/env bash
# Data scaling, call 1 of 2 (on the lent GPU): synthesise and collect 18 000 utterances.
set -euo pipefail
bash benchmarks/heads_comparison/whisper-tiny.en/gpu_data.sh 18000
