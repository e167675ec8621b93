#!/usr/bin/env bash
# Train draft heads for a base model in one command: synthesise speech -> collect the frozen base's
# hidden states (and, for Whisper, its encoder outputs) -> train the heads -> export a Hub-ready artifact.
# Every step resumes where it stopped. The default recipe is the shipped heads': path heads that attend to the
# speech, soft labels, an 8192-token draft vocabulary, 15 epochs (HEADS="medusa" for the earlier recipe). The
# whisper-base heads: NUM_UTTERANCES=24000 LANGUAGE=en (tiny.en's: NUM_UTTERANCES=18000; 15 epochs for both; on whisper-base
# 15 epochs instead of 5 raised the real-speech tokens per 16-node round from 2.24 to 2.45).
#
#   pipeline/train_heads.sh BASE [WORK_DIR] [ARTIFACT_DIR]
#   e.g. pipeline/train_heads.sh "$(python -m tools.real_whisper openai/whisper-tiny.en)" work_data
#
# ARTIFACT_DIR defaults to WORK_DIR/artifacts/<base name>: a shipped (git-tracked) artifact such as
# heads/whisper-tiny.en is replaced only when named and forced (FORCE=1).
#
# Environment: NUM_UTTERANCES (10000), WORKERS (2), DEVICE (cpu), BATCH (16), EPOCHS (15), TRAIN_BATCH (64),
# LR (2e-3), HEADS (path-speech | path | medusa), EVAL_DATA (a collect folder of real speech to replay on), BASE_ID (Hub id
# recorded in the artifact when BASE is a local folder), FLITE_BIN, TEXT_FILE + TEXT_LICENCE, PYTHON,
# LANGUAGE / TASK (multilingual Whisper; default: detect the language, transcribe), FORCE (export over anything),
# TRUST_BASE_CODE=1 (run a MERaLiON-2 base's own code: --trust-base-code).
set -euo pipefail
BASE=${1:?usage: pipeline/train_heads.sh BASE [WORK_DIR] [ARTIFACT_DIR]}
TRUST=${TRUST_BASE_CODE:+--trust-base-code}
WORK=${2:-work_data}
OUT=${3:-$WORK/artifacts/$(basename "$BASE")}
PY=${PYTHON:-python}
case "${HEADS:-path-speech}" in
  path-speech) SPEECH=--speech; RECIPE="--head-kind path --speech-attention --soft-labels 0.5 --draft-vocab 8192" ;;
  path) SPEECH=; RECIPE="--head-kind path --soft-labels 0.5 --draft-vocab 8192" ;;
  medusa) SPEECH=; RECIPE="" ;;
  *) echo "HEADS=${HEADS}: use path-speech, path or medusa" >&2; exit 2 ;;
esac

$PY -m pipeline.synth_speech --out "$WORK/train_speech" --num-utterances "${NUM_UTTERANCES:-10000}" \
    --workers "${WORKERS:-2}" ${FLITE_BIN:+--flite-bin "$FLITE_BIN"} \
    ${TEXT_FILE:+--text-file "$TEXT_FILE" --text-licence "$TEXT_LICENCE"}
$PY -m pipeline.collect --base "$BASE" $TRUST --audio "$WORK/train_speech" --out "$WORK/collect" \
    --batch-size "${BATCH:-16}" --device "${DEVICE:-cpu}" ${LANGUAGE:+--language "$LANGUAGE"} ${TASK:+--task "$TASK"} $SPEECH
# shellcheck disable=SC2086  # RECIPE is a list of options
$PY -m pipeline.train --data "$WORK/collect" --base "$BASE" $TRUST --out "$WORK/ckpt" $RECIPE \
    --epochs "${EPOCHS:-15}" --batch-size "${TRAIN_BATCH:-64}" --lr "${LR:-2e-3}" --device "${DEVICE:-cpu}" \
    ${EVAL_DATA:+--eval-data "$EVAL_DATA"}
$PY -m pipeline.export --base "$BASE" $TRUST ${BASE_ID:+--base-id "$BASE_ID"} \
    --heads "$WORK/ckpt/best.safetensors" --out "$OUT" --data-info "$WORK/train_speech/manifest.jsonl" \
    ${FORCE:+--force}
