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
# Environment: AUDIO (your own speech instead of synthesised: a folder, a manifest.jsonl or an HF dataset NAME[:CONFIG];
# no transcripts needed), NUM_UTTERANCES (10000), WORKERS (2), DEVICE (cpu), BATCH (16), EPOCHS (15), TRAIN_BATCH (64),
# MAX_NEW_TOKENS (the family's default), STEP_LOG (a file each step appends its name, start, end and output folder to),
# LR (2e-3), HEADS (path-speech | path | medusa), LAYERS (1: residual layers a head), SOFT_LABELS (0.5: the weight of the
# base's own distribution in the loss, 1 = teacher only; path heads), EVAL_DATA (collect folders of real speech to
# replay on, comma-separated), BASE_ID (Hub id recorded in the artifact when BASE is a local folder), FLITE_BIN,
# TEXT_FILE + TEXT_LICENCE, PYTHON, LANGUAGE / TASK (multilingual Whisper; default: detect the language, transcribe),
# FORCE (export over anything), TRUST_BASE_CODE=1 (run a MERaLiON-2 base's own code: --trust-base-code).
# Multilingual, timestamp-aware heads (multilingual Whisper): LANGUAGES=de,fr,... also synthesises
# LANGUAGE_UTTERANCES (1000) clips a language with espeak-ng (ESPEAK_BIN) from TEXT_DIR/<language>.txt (default: GNOME
# help, `python -m pipeline.multilingual_texts --source gnome-help`), collected with that language forced;
# TIMESTAMP_UTTERANCES=N collects the last N of the NUM_UTTERANCES clips with the base's timestamps on.
# INIT_HEADS=FILE fine-tunes trained heads (their draft vocabulary plus the new data's DRAFT_VOCAB most frequent tokens)
# instead of training new ones (with more LAYERS than they have, the added layers start as the identity); DRAFT_VOCAB
# (8192) is the draft vocabulary otherwise.
set -euo pipefail
BASE=${1:?usage: pipeline/train_heads.sh BASE [WORK_DIR] [ARTIFACT_DIR]}
TRUST=${TRUST_BASE_CODE:+--trust-base-code}
WORK=${2:-work_data}
OUT=${3:-$WORK/artifacts/$(basename "$BASE")}
PY=${PYTHON:-python}
case "${HEADS:-path-speech}" in
  path-speech) SPEECH=--speech; RECIPE="--head-kind path --speech-attention --soft-labels ${SOFT_LABELS:-0.5} --draft-vocab ${DRAFT_VOCAB:-8192}" ;;
  path) SPEECH=; RECIPE="--head-kind path --soft-labels ${SOFT_LABELS:-0.5} --draft-vocab ${DRAFT_VOCAB:-8192}" ;;
  medusa) SPEECH=; RECIPE="" ;;
  *) echo "HEADS=${HEADS}: use path-speech, path or medusa" >&2; exit 2 ;;
esac

N=${NUM_UTTERANCES:-10000}
TS=${TIMESTAMP_UTTERANCES:-0}
TEXTS=${TEXT_DIR:-$WORK/texts}
LANGS=${LANGUAGES:-}
step() {  # NAME OUTPUT_FOLDER COMMAND...: run one step; with STEP_LOG set, append its wall-clock span as a JSON line
  local name=$1 out=$2 start
  shift 2
  start=$(date +%s.%N)
  "$@"
  [ -z "${STEP_LOG:-}" ] || printf '{"step": "%s", "start": %s, "end": %s, "out": "%s"}\n' \
      "$name" "$start" "$(date +%s.%N)" "$out" >> "$STEP_LOG"
}
SPEECH_IN=${AUDIO:-$WORK/train_speech}
if [ -z "${AUDIO:-}" ]; then
  step synthesise "$WORK/train_speech" $PY -m pipeline.synth_speech --out "$WORK/train_speech" --num-utterances "$N" \
      --workers "${WORKERS:-2}" ${FLITE_BIN:+--flite-bin "$FLITE_BIN"} \
      ${TEXT_FILE:+--text-file "$TEXT_FILE" --text-licence "$TEXT_LICENCE"}
fi
for L in ${LANGS//,/ }; do
  [ -f "$TEXTS/$L.txt" ] || $PY -m pipeline.multilingual_texts --source gnome-help --languages "$L" --out "$TEXTS"
  step "synthesise_$L" "$WORK/speech_$L" $PY -m pipeline.synth_speech --out "$WORK/speech_$L" \
      --num-utterances "${LANGUAGE_UTTERANCES:-1000}" --workers "${WORKERS:-2}" --voices "espeak-$L" \
      ${ESPEAK_BIN:+--espeak-bin "$ESPEAK_BIN"} --text-file "$TEXTS/$L.txt" \
      ${FLITE_BIN:+--flite-bin "$FLITE_BIN"}
done

COLLECT=(--base "$BASE" $TRUST --batch-size "${BATCH:-16}" --device "${DEVICE:-cpu}" ${TASK:+--task "$TASK"} $SPEECH
         ${MAX_NEW_TOKENS:+--max-new-tokens "$MAX_NEW_TOKENS"})
step collect "$WORK/collect" $PY -m pipeline.collect "${COLLECT[@]}" --audio "$SPEECH_IN" --out "$WORK/collect" \
    --limit $((N - TS)) ${LANGUAGE:+--language "$LANGUAGE"}
DATA=(--data "$WORK/collect")
INFO=()
if [ -z "${AUDIO:-}" ]; then INFO+=(--data-info "$WORK/train_speech/manifest.jsonl"); fi
if [ "$TS" -gt 0 ]; then
  step collect_timestamps "$WORK/collect_timestamps" \
      $PY -m pipeline.collect "${COLLECT[@]}" --audio "$SPEECH_IN" --out "$WORK/collect_timestamps" \
      --skip $((N - TS)) --timestamps ${LANGUAGE:+--language "$LANGUAGE"}
  DATA+=(--data "$WORK/collect_timestamps")
fi
for L in ${LANGS//,/ }; do
  step "collect_$L" "$WORK/collect_$L" \
      $PY -m pipeline.collect "${COLLECT[@]}" --audio "$WORK/speech_$L" --out "$WORK/collect_$L" --language "$L"
  DATA+=(--data "$WORK/collect_$L")
  INFO+=(--data-info "$WORK/speech_$L/manifest.jsonl")
done
EVALS=()
EVAL_LIST=${EVAL_DATA:-}
for E in ${EVAL_LIST//,/ }; do EVALS+=(--eval-data "$E"); done
# shellcheck disable=SC2086  # RECIPE is a list of options
step train "$WORK/ckpt" $PY -m pipeline.train "${DATA[@]}" --base "$BASE" $TRUST --out "$WORK/ckpt" $RECIPE \
    --layers "${LAYERS:-1}" --epochs "${EPOCHS:-15}" --batch-size "${TRAIN_BATCH:-64}" --lr "${LR:-2e-3}" --device "${DEVICE:-cpu}" \
    ${EVALS[@]+"${EVALS[@]}"} ${INIT_HEADS:+--init-heads "$INIT_HEADS"}
step export "$OUT" $PY -m pipeline.export --base "$BASE" $TRUST ${BASE_ID:+--base-id "$BASE_ID"} \
    --heads "$WORK/ckpt/best.safetensors" --out "$OUT" ${INFO[@]+"${INFO[@]}"} ${FORCE:+--force}
