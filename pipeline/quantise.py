"""A W4A16 GPTQ Whisper, made as Breeze-ASR-26's quantised release was: llm-compressor's ``oneshot`` with
``GPTQModifier(scheme="W4A16")`` (4-bit weights, groups of 128, 16-bit activations) on every Linear layer of
the encoder and the decoder except the output projection ``proj_out``, calibrated on speech, saved as
compressed-tensors (the format vLLM's Marlin kernels read).

    python -m pipeline.synth_speech --out work_data/calib_speech --num-utterances 600
    .venv-quant/bin/python -m pipeline.quantise openai/whisper-tiny.en work_data/quantised/whisper-tiny.en-w4a16 \
        --calibration work_data/calib_speech/manifest.jsonl

llm-compressor pins its own transformers, so it runs from its own environment (``make quantise-env``); the
folder it writes loads in the main one (``compressed-tensors``) as the base of the committed heads:
``python -m tools.benchmark --model heads/whisper-tiny.en --base work_data/quantised/whisper-tiny.en-w4a16``.
The calibration speech is synthetic (pipeline.synth_speech: flite voices, augmented), never the evaluation
recordings. GPTQ options (activation order, dampening, the scale observer) and the calibration (clips, their
choice, packing several clips into one 30 s window) are options, recorded in quantise_info.json. A finished
folder is kept (rerun = nothing to do); an interrupted run leaves only a staging folder, replaced next time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pipeline.collect import run_cli
from tools import cli_args
from tools.files import command_line, staged_folder

RECIPE = {"scheme": "W4A16", "targets": "Linear", "ignore": ["proj_out"]}
# GPTQ and calibration options; the defaults are the best measured on the 28 real recordings (README: none of
# higher dampening, "weight" or no activation ordering, an MSE observer, or 512 clips packed into 28 s windows
# did better than these on the word error rate).
ACTORDERS = ("static", "weight", "none")  # column order of GPTQ's updates (llm-compressor 0.14 has no "group" for GPTQ)
OBSERVERS = ("minmax", "memoryless_minmax", "memoryless_mse", "mse", "imatrix_mse")  # how each group's scale is found
DEFAULTS = {"samples": 128, "pack_seconds": 0.0, "actorder": "static", "dampening_frac": 0.01,
            "weight_observer": "minmax"}
INFO_NAME = "quantise_info.json"
GAP_SECONDS = 0.3  # silence between two clips packed into one calibration window


def is_finished(out: Path) -> bool:
    return (out / INFO_NAME).is_file() and (out / "config.json").is_file()


def calibration_clips(manifest: Path, count: int, seed: int = 0) -> list[dict]:
    """``count`` clips of a manifest (audio + text), a fixed random choice."""
    import random

    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{manifest}: no clips")
    random.Random(seed).shuffle(rows)
    for row in rows[:count]:
        row["audio"] = str((manifest.parent / row["audio"]).resolve())
    return rows[:count]


def pack_clips(clips: list[dict], seconds: float, gap: float = GAP_SECONDS) -> list[list[dict]]:
    """Consecutive clips grouped into windows of at most ``seconds`` of speech (``gap`` of silence between
    two), so that Whisper's 30 s window holds speech rather than padding; 0 = one clip a window."""
    windows: list[list[dict]] = []
    length = 0.0
    for clip in clips:
        duration = float(clip.get("duration") or seconds)
        if windows and seconds > 0 and length + gap + duration <= seconds:
            windows[-1].append(clip)
            length += gap + duration
        else:
            windows.append([clip])
            length = duration
    return windows


def window_audio(window: list[dict], gap: float = GAP_SECONDS):
    """A window's speech (its clips one after the other, ``gap`` seconds of silence between two, cut at
    Whisper's 30 s) and its transcript."""
    import numpy as np

    from tools.audio_io import load_audio

    silence = np.zeros(int(gap * 16000), dtype=np.float32)
    parts = [load_audio(clip["audio"]) for clip in window]
    samples = np.concatenate([x for part in parts for x in (silence, part)][1:])[: 30 * 16000]
    return samples, " ".join(clip["text"].strip() for clip in window)


def calibration_dataset(windows: list[list[dict]], processor, dtype):
    """Each window as the model's teacher-forced inputs: its features and its transcript as decoder ids, so
    GPTQ sees the decoder's activations on real transcripts as well as the encoder's."""
    from datasets import Dataset

    rows = []
    for window in windows:
        samples, text = window_audio(window)
        inputs = processor(audio=samples, sampling_rate=16000, text=" " + text, return_tensors="pt")
        rows.append({"input_features": inputs["input_features"].to(dtype).tolist(),
                     "decoder_input_ids": inputs["labels"].tolist()})
    return Dataset.from_list(rows)


def one_example(batch):
    import torch

    (example,) = batch
    return {key: torch.tensor(value) for key, value in example.items()}


def gptq_recipe(actorder: str = DEFAULTS["actorder"], dampening_frac: float = DEFAULTS["dampening_frac"],
                weight_observer: str = DEFAULTS["weight_observer"]) -> dict:
    """GPTQModifier's arguments: W4A16 (4-bit weights, groups of 128) on every Linear but ``proj_out``, with
    GPTQ's column order, Hessian dampening and the observer that picks each group's scale."""
    if actorder not in ACTORDERS:
        raise ValueError(f"actorder {actorder!r}: one of {', '.join(ACTORDERS)}")
    if weight_observer not in OBSERVERS:
        raise ValueError(f"weight observer {weight_observer!r}: one of {', '.join(OBSERVERS)}")
    if not 0.0 < dampening_frac < 1.0:
        raise ValueError(f"dampening_frac {dampening_frac}: between 0 and 1")
    return {**RECIPE, "actorder": None if actorder == "none" else actorder, "dampening_frac": dampening_frac,
            "weight_observer": weight_observer}


def quantise(base: str, out: Path, manifest: Path, samples: int = DEFAULTS["samples"], recipe: dict | None = None,
             seed: int = 0, pack_seconds: float = DEFAULTS["pack_seconds"]) -> dict:
    import llmcompressor
    import torch
    import transformers
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    from modeling_medusa import resolve_base

    source = resolve_base(base)
    model = WhisperForConditionalGeneration.from_pretrained(source, dtype=torch.float32)
    processor = WhisperProcessor.from_pretrained(source)
    recipe = recipe or gptq_recipe()
    clips = calibration_clips(manifest, samples, seed)
    windows = pack_clips(clips, pack_seconds)
    dataset = calibration_dataset(windows, processor, model.dtype)
    start = time.perf_counter()
    oneshot(model=model, dataset=dataset, recipe=GPTQModifier(**recipe), num_calibration_samples=len(windows),
            max_seq_length=448, data_collator=one_example, pipeline="basic")
    seconds = time.perf_counter() - start
    info = {"base": base, "source": str(source), "recipe": recipe, "group_size": 128, "format": "compressed-tensors",
            "calibration": {"manifest": str(manifest), "clips": len(clips), "seed": seed,
                            "pack_seconds": pack_seconds, "windows": len(windows),
                            "seconds_of_audio": round(sum(c.get("duration", 0.0) for c in clips), 1)},
            "gptq_seconds": round(seconds, 1), "llmcompressor": llmcompressor.__version__,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "command": command_line("pipeline.quantise")}
    with staged_folder(out) as staged:
        model.save_pretrained(staged, save_compressed=True)
        processor.save_pretrained(staged)
        (staged / INFO_NAME).write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.quantise", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="Whisper base: a folder, or a Hub id converted here (openai/whisper-tiny.en)")
    p.add_argument("out", type=Path, help="folder to write, e.g. work_data/quantised/whisper-tiny.en-w4a16")
    p.add_argument("--calibration", type=Path, required=True, help="manifest.jsonl of speech with transcripts")
    p.add_argument("--samples", type=cli_args.positive_int, default=DEFAULTS["samples"], help="calibration clips")
    p.add_argument("--seed", type=cli_args.seed, default=0, help="random choice of the calibration clips")
    p.add_argument("--pack-seconds", type=cli_args.non_negative_float, default=DEFAULTS["pack_seconds"],
                   help="read consecutive clips into one calibration window of up to this many seconds "
                        "(0: one clip a window)")
    p.add_argument("--actorder", choices=ACTORDERS, default=DEFAULTS["actorder"], help="GPTQ activation ordering")
    p.add_argument("--dampening-frac", type=cli_args.fraction, default=DEFAULTS["dampening_frac"],
                   help="GPTQ Hessian dampening (share of its mean diagonal)")
    p.add_argument("--weight-observer", choices=OBSERVERS, default=DEFAULTS["weight_observer"],
                   help="how each group's 4-bit scale is chosen (an *mse observer searches clipping ranges)")
    args = p.parse_args(argv)
    recipe = gptq_recipe(args.actorder, args.dampening_frac, args.weight_observer)  # checked before anything loads
    if is_finished(args.out):
        print(f"[quantise] {args.out}: already made ({INFO_NAME}); nothing to do")
        return 0
    try:
        import llmcompressor  # noqa: F401
    except ImportError:
        raise SystemExit("pipeline.quantise needs llm-compressor, which pins its own transformers: "
                         "make quantise-env, then run it with .venv-quant/bin/python") from None
    info = quantise(args.base, args.out, args.calibration, args.samples, recipe, args.seed,
                    args.pack_seconds)
    print(f"[quantise] {args.out}: W4A16 GPTQ on {info['calibration']['clips']} clips "
          f"({info['calibration']['windows']} windows) in {info['gptq_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
