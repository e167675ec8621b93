"""A W4A16 GPTQ Whisper, made as Breeze-ASR-26's quantised release was: llm-compressor's ``oneshot`` with
``GPTQModifier(scheme="W4A16")`` (4-bit weights, groups of 128, 16-bit activations) on every Linear layer of
the encoder and the decoder except the output projection ``proj_out``, calibrated on speech, saved as
compressed-tensors (the format vLLM's Marlin kernels read).

    .venv-quant/bin/python -m pipeline.quantise openai/whisper-tiny.en work_data/quantised/whisper-tiny.en-w4a16 \
        --calibration work_data/exp_speech/manifest.jsonl

llm-compressor pins its own transformers, so it runs from its own environment (``make quantise-env``); the
folder it writes loads in the main one (``compressed-tensors``) as the base of the committed heads:
``python -m tools.benchmark --model heads/whisper-tiny.en --base work_data/quantised/whisper-tiny.en-w4a16``.
The calibration speech is synthetic (the training manifest), never the evaluation recordings. A finished
folder is kept (rerun = nothing to do); an interrupted run leaves only a staging folder, replaced next time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pipeline.collect import run_cli
from tools.files import staged_folder

RECIPE = {"scheme": "W4A16", "targets": "Linear", "ignore": ["proj_out"]}
INFO_NAME = "quantise_info.json"


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


def calibration_dataset(clips: list[dict], processor, dtype):
    """Each clip as the model's teacher-forced inputs: its features and its transcript as decoder ids, so
    GPTQ sees the decoder's activations on real transcripts as well as the encoder's."""
    from datasets import Dataset

    from tools.audio_io import load_audio

    rows = []
    for clip in clips:
        samples = load_audio(clip["audio"])
        inputs = processor(audio=samples, sampling_rate=16000, text=" " + clip["text"].strip(), return_tensors="pt")
        rows.append({"input_features": inputs["input_features"].to(dtype).tolist(),
                     "decoder_input_ids": inputs["labels"].tolist()})
    return Dataset.from_list(rows)


def one_example(batch):
    import torch

    (example,) = batch
    return {key: torch.tensor(value) for key, value in example.items()}


def quantise(base: str, out: Path, manifest: Path, samples: int) -> dict:
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
    clips = calibration_clips(manifest, samples)
    dataset = calibration_dataset(clips, processor, model.dtype)
    start = time.perf_counter()
    oneshot(model=model, dataset=dataset, recipe=GPTQModifier(**RECIPE), num_calibration_samples=len(clips),
            max_seq_length=448, data_collator=one_example, pipeline="basic")
    seconds = time.perf_counter() - start
    info = {"base": base, "source": str(source), "recipe": RECIPE, "group_size": 128, "format": "compressed-tensors",
            "calibration": {"manifest": str(manifest), "clips": len(clips),
                            "seconds_of_audio": round(sum(c.get("duration", 0.0) for c in clips), 1)},
            "gptq_seconds": round(seconds, 1), "llmcompressor": llmcompressor.__version__,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "command": " ".join(["python -m pipeline.quantise", *sys.argv[1:]])}
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
    p.add_argument("--samples", type=int, default=256, help="calibration clips")
    args = p.parse_args(argv)
    if is_finished(args.out):
        print(f"[quantise] {args.out}: already made ({INFO_NAME}); nothing to do")
        return 0
    try:
        import llmcompressor  # noqa: F401
    except ImportError:
        raise SystemExit("pipeline.quantise needs llm-compressor, which pins its own transformers: "
                         "make quantise-env, then run it with .venv-quant/bin/python") from None
    info = quantise(args.base, args.out, args.calibration, args.samples)
    print(f"[quantise] {args.out}: W4A16 GPTQ on {info['calibration']['clips']} clips in {info['gptq_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
