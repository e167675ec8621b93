#!/usr/bin/env python
"""Ours against CTranslate2 (faster-whisper's engine) on the same clips: CPU, greedy, no timestamps.

    pip install faster-whisper        # brings ctranslate2; needed by this comparison only
    python -m tools.benchmark_ctranslate2 --model heads/whisper-tiny.en --audio work_data/eval_real/manifest.jsonl --out OUT

Each decoder goes from the clip's 16 kHz samples to its text, its own feature extraction included, one clip at a
time, warmed up, interleaved, medians of ``--repeats``: faster-whisper over the same weights as CTranslate2 float32
and int8 (beam 1, temperature 0 only, no timestamps, no previous-text conditioning, no VAD), the base's own
``generate`` and ours (``draft="auto"``). faster-whisper pads the features differently, so its texts can differ from
the base's: WER is reported for each decoder, speed as seconds per clip. Writes OUT/results.json (with the command).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from tools import cli_args
from tools import runtime
from tools.benchmark_inputs import DEFAULT_MODEL, load_model, read_manifest, resolve_artifact
from tools.benchmark_report import corpus_wer
from tools.files import command_line, write_json_atomic

CT2_COMPUTE_TYPES = ("float32", "int8")


def faster_whisper_segments(hub_id: str, compute_type: str, threads: int, timestamps: bool):
    """``samples -> [faster-whisper segment]``: faster-whisper over ``hub_id``'s CTranslate2 weights on the CPU,
    greedy (beam 1, temperature 0 only), no previous-text conditioning, no VAD."""
    try:
        from faster_whisper import WhisperModel
    except ImportError as missing:
        raise SystemExit(f"this comparison needs faster-whisper ({missing}): pip install faster-whisper") from None
    from tools.real_whisper import ensure_ct2_folder

    model = WhisperModel(str(ensure_ct2_folder(hub_id)), device="cpu", compute_type=compute_type, cpu_threads=threads)

    def transcribe(samples) -> list:
        segments, _ = model.transcribe(samples, beam_size=1, best_of=1, temperature=0.0, without_timestamps=not timestamps,
                                       condition_on_previous_text=False, vad_filter=False)
        return list(segments)

    return transcribe


def ctranslate2_decoder(hub_id: str, compute_type: str, threads: int):
    segments_of = faster_whisper_segments(hub_id, compute_type, threads, timestamps=False)

    def transcribe(samples) -> str:
        return " ".join(segment.text.strip() for segment in segments_of(samples))

    return transcribe


def transformers_decoder(model, use_medusa: bool):
    def transcribe(samples) -> str:
        inputs = runtime.to_model(model.prepare_audio_inputs([samples]), model)
        sequences = model.generate(**inputs, max_new_tokens=model.default_max_new_tokens, use_medusa=use_medusa)
        return model.decode_text(sequences, inputs)[0].strip()

    return transcribe


def measure(decoders: dict, clips: list, repeats: int) -> dict:
    """Per decoder: each clip's median seconds and its text (the decoders interleaved, order rotated)."""
    names = list(decoders)
    seconds = {name: [[] for _ in clips] for name in names}
    texts = {name: [None] * len(clips) for name in names}
    for name in names:  # warm-up
        decoders[name](clips[0]["samples"])
    for repeat in range(repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for index, clip in enumerate(clips):
            for name in order:
                start = time.perf_counter()
                texts[name][index] = decoders[name](clip["samples"])
                seconds[name][index].append(time.perf_counter() - start)
    return {name: {"seconds": [statistics.median(s) for s in seconds[name]], "texts": texts[name]} for name in names}


def summarise(measured: dict, clips: list) -> dict:
    references = [clip["text"] for clip in clips]
    ours = sum(measured["ours"]["seconds"])
    return {name: {"seconds_total": round(sum(m["seconds"]), 4),
                   "ms_per_clip_median": round(1000 * statistics.median(m["seconds"]), 2),
                   "wer": corpus_wer(references, m["texts"]),
                   "ours_speedup": round(sum(m["seconds"]) / ours, 3)}
            for name, m in measured.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.benchmark_ctranslate2", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="artifact folder with heads")
    p.add_argument("--audio", required=True, help="manifest.jsonl of clips (audio, text)")
    p.add_argument("--repeats", type=cli_args.positive_int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import torch

    model, base, declared = load_model(resolve_artifact(args.model), "cpu", torch.float32)
    if model.family != "whisper":
        raise SystemExit("tools.benchmark_ctranslate2 compares Whisper artifacts only")
    from tools import audio_io

    clips = [{"id": row["id"], "text": row["text"], "samples": audio_io.load_audio(row["audio"])}
             for row in read_manifest(args.audio)]
    threads = torch.get_num_threads()
    decoders = {f"ctranslate2_{kind}": ctranslate2_decoder(declared, kind, threads) for kind in CT2_COMPUTE_TYPES}
    decoders.update(hf_generate=transformers_decoder(model, use_medusa=False), ours=transformers_decoder(model, True))
    measured = measure(decoders, clips, args.repeats)
    import ctranslate2
    import transformers

    result = {"command": command_line("tools.benchmark_ctranslate2", argv),
              "date": time.strftime("%Y-%m-%d"), "model": args.model, "base": declared, "device": "cpu",
              "threads": threads, "torch": torch.__version__, "transformers": transformers.__version__,
              "ctranslate2": ctranslate2.__version__, "clips": len(clips), "repeats": args.repeats,
              "summary": summarise(measured, clips),
              "per_clip": [{"id": clip["id"], **{name: {"ms": round(1000 * m["seconds"][i], 2), "text": m["texts"][i]}
                                                  for name, m in measured.items()}} for i, clip in enumerate(clips)]}
    write_json_atomic(Path(args.out) / "results.json", result, indent=1)
    for name, row in result["summary"].items():
        print(f"{name:22s} {row['seconds_total']:8.2f} s total  {row['ms_per_clip_median']:8.1f} ms/clip median  "
              f"WER {row['wer']:.4f}  x ours {row['ours_speedup']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
