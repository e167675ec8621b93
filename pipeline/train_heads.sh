#!/usr/bin/env bash
# Train Medusa heads for a base model in one command: synthesise speech -> collect the frozen base's
# hidden states -> train the heads -> export a Hub-ready artifact. Every step resumes where it stopped.
#
#   pipeline/train_heads.sh BASE [WORK_DIR] [ARTIFACT_DIR]
#   e.g. pipeline/train_heads.sh "$(python -m pipeline.real_whisper openai/whisper-tiny.en)" work_data
#
# ARTIFACT_DIR defaults to WORK_DIR/artifacts/<base name>: a shipped (git-tracked) artifact such as
# heads/whisper-tiny.en is replaced only when named and forced (FORCE=1).
#
# Environment: NUM_UTTERANCES (10000), WORKERS (2), DEVICE (cpu), BATCH (16), EPOCHS (3), BASE_ID (Hub id
# recorded in the artifact when BASE is a local folder), FLITE_BIN, TEXT_FILE + TEXT_LICENCE, PYTHON,
# LANGUAGE / TASK (multilingual Whisper; default: detect the language, transcribe), FORCE (export over anything).
set -euo pipefail
BASE=${1:?usage: pipeline/train_heads.sh BASE [WORK_DIR] [ARTIFACT_DIR]}
WORK=${2:-work_data}
OUT=${3:-$WORK/artifacts/$(basename "$BASE")}
PY=${PYTHON:-python}

$PY -m pipeline.synth_speech --out "$WORK/train_speech" --num-utterances "${NUM_UTTERANCES:-10000}" \
    --workers "${WORKERS:-2}" ${FLITE_BIN:+--flite-bin "$FLITE_BIN"} \
    ${TEXT_FILE:+--text-file "$TEXT_FILE" --text-licence "$TEXT_LICENCE"}
$PY -m pipeline.collect --base "$BASE" --audio "$WORK/train_speech" --out "$WORK/collect" \
    --batch-size "${BATCH:-16}" --device "${DEVICE:-cpu}" ${LANGUAGE:+--language "$LANGUAGE"} ${TASK:+--task "$TASK"}
$PY -m pipeline.train --data "$WORK/collect" --base "$BASE" --out "$WORK/ckpt" \
    --epochs "${EPOCHS:-3}" --device "${DEVICE:-cpu}"
$PY -m pipeline.export --base "$BASE" ${BASE_ID:+--base-id "$BASE_ID"} \
    --heads "$WORK/ckpt/best.safetensors" --out "$OUT" --data-info "$WORK/train_speech/manifest.jsonl" \
    ${FORCE:+--force}
