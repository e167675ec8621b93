#!/usr/bin/env python
"""Long-form timestamped transcription of a recording of known sentences: ours, the base's own ``generate`` and
faster-whisper, side by side (segments, their timing, WER, speed).

    pip install faster-whisper        # needed by this comparison only
    python -m tools.compare_segments --model heads/whisper-tiny.en --seconds 180 --out benchmarks/segments/whisper-tiny.en
    python -m tools.compare_segments --model heads/whisper-base --audio work_data/eval_speech/manifest.jsonl --seconds 180

The recording is ``tools.long_recording``'s: public-domain sentences read by two flite voices in turn with
0.6 s pauses, or with ``--audio MANIFEST`` that manifest's recorded clips joined with the same pauses (in order,
then reversed, until ``--seconds``), so each sentence's start and end are known; it is decoded clean and under pink
noise at ``--snr-db``. Each decoder takes the whole recording and returns its segments (start, end, text), greedy,
temperature 0 only, no conditioning on the previous window's text, no VAD: ours (``draft="auto"``) and the base
through Whisper's long-form ``generate(return_timestamps=True, return_segments=True)`` (their ids must be equal; ours also says its draft and tokens per verify pass),
faster-whisper through its ``transcribe`` over the same weights (CTranslate2 float32, beam 1, its own features,
so its text may differ). Reported per decoder: seconds (median of ``--repeats``, interleaved), segment count and
durations, how far each segment's start and end lie from the nearest sentence start and end, and WER against the
sentences. Writes OUT/results.json (with the command) and OUT/results.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from tools import cli_args
from tools import runtime
from tools.benchmark_cpu_peers import faster_whisper_segments
from tools.benchmark_inputs import load_model, resolve_artifact
from tools.benchmark_report import corpus_wer
from tools.files import command_line, write_atomic, write_json_atomic
from tools.markdown import markdown_table

SAMPLE_RATE = 16000
JOINED = "recorded clips of"  # (in the recording's description: a manifest's clips, joined)


def ours_decoder(model, use_medusa: bool):
    """Whisper's long-form generate (ours or the base's own): the segments, the ids they hold and (ours) the
    tokens each verify pass emitted."""
    def transcribe(samples):
        inputs = runtime.to_model(model.prepare_audio_inputs([samples]), model)
        output, stats = model.generate(**inputs, return_timestamps=True, return_segments=True, use_medusa=use_medusa,
                                       return_stats=True)
        runtime.synchronize(model)
        ids = [token for segment in output["segments"][0] for token in segment["tokens"].tolist()]
        return model.segments(output)[0], ids, stats

    return transcribe


def faster_whisper_decoder(hub_id: str, threads: int):
    segments_of = faster_whisper_segments(hub_id, "float32", threads, timestamps=True)

    def transcribe(samples):
        return [(s.start, s.end, s.text.strip()) for s in segments_of(samples)], None, None

    return transcribe


def boundary_errors(times: list[float], references: list[float]) -> dict:
    """Seconds from each of ``times`` to the nearest of ``references``: median and largest."""
    if not times:
        return {"median_s": None, "max_s": None}
    errors = [min(abs(t - r) for r in references) for t in times]
    return {"median_s": statistics.median(errors), "max_s": max(errors)}


def describe(segments: list, sentences: list, seconds: list[float]) -> dict:
    """One decoder's figures on one recording: timing, segments, their boundaries and WER."""
    durations = [end - start for start, end, _ in segments]
    starts = [start / SAMPLE_RATE for _, start, _ in sentences]
    ends = [end / SAMPLE_RATE for _, _, end in sentences]
    text = " ".join(t for _, _, t in segments)
    return {"seconds": statistics.median(seconds), "segments": len(segments),
            "median_segment_s": statistics.median(durations) if durations else None,
            "max_segment_s": max(durations, default=None),
            "start_error": boundary_errors([s for s, _, _ in segments], starts),
            "end_error": boundary_errors([e for _, e, _ in segments], ends),
            "wer": corpus_wer([" ".join(t for t, _, _ in sentences)], [text]), "text": text,
            "segment_list": [list(s) for s in segments]}


def compare(decoders: dict, samples: np.ndarray, sentences: list, repeats: int) -> dict:
    """Every decoder on the recording, warmed up, ``repeats`` times interleaved (order rotated)."""
    names = list(decoders)
    outputs = {name: decoders[name](samples) for name in names}  # warm-up; outputs are deterministic
    seconds = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[: repeat % len(names)]:
            start = time.perf_counter()
            decoders[name](samples)
            seconds[name].append(time.perf_counter() - start)
    rows = {name: describe(outputs[name][0], sentences, seconds[name]) for name in names}
    rows["ours"]["ids_equal_base"] = outputs["ours"][1] == outputs["base"][1]
    stats = outputs["ours"][2] or {}
    rows["ours"].update({k: stats[k] for k in ("draft", "mean_accepted_per_round", "rounds") if k in stats})
    return rows


def recording(manifest: str | None, seconds: float) -> tuple:
    """(samples, sentences, what the recording is): flite's voices, or the manifest's clips joined."""
    from tools.long_recording import joined_recording, long_recording_with_sentences

    if manifest is None:
        with tempfile.TemporaryDirectory() as folder:
            return (*long_recording_with_sentences(Path(folder), seconds), "flite voices (slt, rms) reading Austen")
    from tools.audio_io import load_audio
    from tools.benchmark_inputs import read_manifest

    rows = read_manifest(manifest)
    untexted = [row["id"] for row in rows if not row["text"]]
    if untexted:
        raise SystemExit(f"{manifest}: clips without a text ({', '.join(untexted[:3])}): every joined clip needs one")
    samples, sentences = joined_recording([(row["text"], load_audio(row["audio"])) for row in rows], seconds)
    return samples, sentences, f"{len(rows)} {JOINED} {manifest} joined ({len(sentences)} in all)"


def recording_kind(results: dict) -> str:
    """What a run decoded, in a few words: the manifest's clips joined, or flite's voices."""
    return "recorded clips joined" if JOINED in results.get("recording", "") else "flite voices"


def render(results: dict) -> str:
    lines = ["# Long-form segments: ours, the base's generate, faster-whisper", "",
             f"Model `{results['model']}`, {results['seconds_of_audio']:.0f} s of known sentences "
             f"({results['sentences']} sentences; {results.get('recording', 'flite voices')}), {results['device']}, "
             f"{results['dtype']}, medians of "
             f"{results['repeats']}. Boundary error: seconds from each segment start (end) to the nearest "
             "sentence start (end).", ""]
    for condition, rows in results["conditions"].items():
        body = [[name, f"{r['seconds']:.2f}", r["segments"], _f(r["median_segment_s"]), _f(r["max_segment_s"]),
                 _f(r["start_error"]["median_s"]), _f(r["end_error"]["median_s"]), f"{100 * r['wer']:.1f} %",
                 {True: "yes", False: "no"}.get(r.get("ids_equal_base"), ""),
                 f"{r['draft']}, {r['mean_accepted_per_round']:.2f}" if "draft" in r else ""]
                for name, r in rows.items()]
        lines += [f"## {condition}", "", markdown_table(
            ["decoder", "seconds", "segments", "median segment s", "longest s", "start error s (median)",
             "end error s (median)", "WER", "ids = base's", "draft, tokens per round"], body), ""]
    lines += [f"Command: `{results['command']}`", ""]
    return "\n".join(lines)


def _f(value) -> str:
    return "" if value is None else f"{value:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compare_segments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="heads/whisper-tiny.en", help="folder (or Hub repo) with the Medusa heads")
    parser.add_argument("--seconds", type=cli_args.positive_float, default=180.0, help="length of the recording")
    parser.add_argument("--audio", help="a manifest of recorded clips with their texts, joined into the recording "
                        "(default: flite's voices)")
    parser.add_argument("--snr-db", type=cli_args.any_float, default=10.0, help="the noisy condition's signal-to-noise ratio")
    parser.add_argument("--repeats", type=cli_args.positive_int, default=3)
    parser.add_argument("--threads", type=cli_args.positive_int, default=None, help="CPU threads for every decoder (default: torch's)")
    parser.add_argument("--out", default="benchmarks/segments/whisper-tiny.en")
    args = parser.parse_args(argv)

    import torch

    from tools.long_recording import with_noise

    if args.threads:
        torch.set_num_threads(args.threads)
    artifact = resolve_artifact(args.model)
    model, _, declared = load_model(artifact, torch.device("cpu"), torch.float32)
    decoders = {"ours": ours_decoder(model, True), "base": ours_decoder(model, False),
                "faster-whisper": faster_whisper_decoder(declared, torch.get_num_threads())}
    clean, sentences, source = recording(args.audio, args.seconds)
    conditions = {"clean": clean, f"pink noise, {args.snr_db:g} dB SNR": with_noise(clean, args.snr_db)}
    results = {"model": str(args.model), "base": declared, "device": "cpu",
               "dtype": "float32", "threads": torch.get_num_threads(), "repeats": args.repeats,
               "seconds_of_audio": len(clean) / SAMPLE_RATE, "sentences": len(sentences), "recording": source,
               "sentence_times": [[t, s / SAMPLE_RATE, e / SAMPLE_RATE] for t, s, e in sentences],
               "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
               "command": command_line("tools.compare_segments", argv), "conditions": {}}
    out = Path(args.out)
    for name, samples in conditions.items():
        print(f"[compare_segments] {name}: {len(samples) / SAMPLE_RATE:.0f} s, {len(decoders)} decoders", flush=True)
        results["conditions"][name] = compare(decoders, samples, sentences, args.repeats)
        write_json_atomic(out / "results.json", results)  # a run cut short keeps the finished condition
    write_atomic(out / "results.md", render(results))
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
