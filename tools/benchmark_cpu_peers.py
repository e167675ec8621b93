#!/usr/bin/env python
"""Ours against the base's generate and faster-whisper on the same clips: CPU, greedy, no timestamps.

    pip install faster-whisper        # brings CTranslate2; needed by this comparison only
    python -m tools.benchmark_cpu_peers --model heads/whisper-tiny.en --out benchmarks/cpu_peers/whisper-tiny.en \\
        --summary benchmarks/cpu_peers/summary.json --phase-clips 4

Each system goes from the clip's 16 kHz samples to its text, its own log-mel features included, one clip at a
time, warmed up, the systems interleaved per clip (in a new seeded order each repeat), each clip's median of
``--repeats``. Systems: ``hf_generate`` (the base's own greedy generate, float32), ``ours_greedy`` (our loop, one
token a pass), ``ours_auto`` (``draft="auto"``), the same two in bfloat16 (``hf_generate_bfloat16``,
``ours_auto_bfloat16``: a model loaded in bfloat16, whose products run on the CPU's bfloat16 units where it has them,
e.g. AMX), and faster-whisper over the same weights as CTranslate2 ``float32`` and ``int8`` (beam 1, temperature 0
only, no timestamps, no previous-text conditioning, no VAD, ``cpu_threads=--threads``). faster-whisper pads the
features differently, so its texts can differ from the base's: each row has its WER and ``exact_vs_float32_base``,
the share of clips whose text equals ``hf_generate``'s; a bfloat16 row also ``exact_vs_bfloat16_base``, against
``hf_generate_bfloat16``'s (ours in bfloat16 gives the bfloat16 base's ids; ``tools.benchmark --dtype bfloat16``
checks any parting against the base's near-ties).

``--phase-clips N`` then times where each call goes on the N shortest clips (features, the 30 s encoder window,
the rest of the prefill, choosing the draft, the rounds, the text), ours and faster-whisper's alike, into
OUT/results.json's ``phases``. ``--summary`` replaces this model's rows in a summary file (one row per system).
``--language en`` tells every system a multilingual base's language; without it each detects the language itself
(faster-whisper and the base's generate run the 30 s encoder once more for that, ours does not).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tools import cli_args
from tools import runtime
from tools.benchmark_environment import cpu_name, environment_info, load_average
from tools.benchmark_inputs import DEFAULT_MANIFEST, DEFAULT_MODEL, load_model, read_manifest, resolve_artifact
from tools.benchmark_report import corpus_wer
from tools.files import command_line, replace_rows, write_json_atomic

PROGRAM = "tools.benchmark_cpu_peers"
REFERENCE = "hf_generate"  # the float32 base: speed-ups and exactness are against its rows
BFLOAT16_REFERENCE = "hf_generate_bfloat16"
OURS = {"hf_generate": ("float32", {"use_medusa": False}), "ours_greedy": ("float32", {"draft": "none"}),
        "ours_auto": ("float32", {"draft": "auto"}), BFLOAT16_REFERENCE: ("bfloat16", {"use_medusa": False}),
        "ours_auto_bfloat16": ("bfloat16", {"draft": "auto"})}  # name -> (dtype of its model, generate options)
FASTER_WHISPER = {"faster_whisper_float32": "float32", "faster_whisper_int8": "int8"}
SYSTEMS = (*OURS, *FASTER_WHISPER)
ROW_FIELDS = ("model", "language", "system", "clips", "e2e_seconds", "speedup_vs_hf_generate", "wer", "exact_vs_float32_base",
              "exact_vs_bfloat16_base", "cpu", "load_before", "load_after", "command", "date")


@dataclass(frozen=True)
class PeerOptions:
    """One run: ``model`` (artifact folder) on ``audio`` (manifest), ``repeats`` timed passes per clip and system,
    ``threads`` for torch and CTranslate2 alike, ``systems`` (of ``SYSTEMS``; ``hf_generate`` always runs: it is
    the reference), ``phase_clips`` shortest clips timed by phase ``phase_repeats`` times (0: none), written to
    ``out``/results.json and, with ``summary``, as rows into that file."""

    model: str = DEFAULT_MODEL
    audio: str = DEFAULT_MANIFEST
    repeats: int = 3
    threads: int = 2
    systems: tuple = SYSTEMS
    phase_clips: int = 0
    phase_repeats: int = 5
    out: str = "work_data/cpu_peers"
    summary: str | None = None
    language: str | None = None  # a multilingual base's language, told to every system (None: each detects it)

    def __post_init__(self):
        unknown = [name for name in self.systems if name not in SYSTEMS]
        if unknown:
            raise ValueError(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
        object.__setattr__(self, "systems", tuple(dict.fromkeys((REFERENCE, *self.systems))))


# --------------------------------------------------------------------------- the systems


def faster_whisper_model(hub_id: str, compute_type: str, threads: int):
    """faster-whisper's ``WhisperModel`` over ``hub_id``'s CTranslate2 weights (``tools.real_whisper``) on the CPU."""
    try:
        from faster_whisper import WhisperModel
    except ImportError as missing:
        raise SystemExit(f"this comparison needs faster-whisper ({missing}): pip install faster-whisper") from None
    from tools.real_whisper import ensure_ct2_folder

    return WhisperModel(str(ensure_ct2_folder(hub_id)), device="cpu", compute_type=compute_type, cpu_threads=threads)


def faster_whisper_segments(hub_id: str, compute_type: str, threads: int, timestamps: bool, model=None,
                            language: str | None = None):
    """``samples -> [faster-whisper segment]``: greedy (beam 1, temperature 0 only), no previous-text
    conditioning, no VAD."""
    model = model or faster_whisper_model(hub_id, compute_type, threads)

    def transcribe(samples) -> list:
        segments, _ = model.transcribe(samples, beam_size=1, best_of=1, temperature=0.0, without_timestamps=not timestamps,
                                       condition_on_previous_text=False, vad_filter=False, language=language)
        return list(segments)

    return transcribe


def faster_whisper_decoder(hub_id: str, compute_type: str, threads: int, model=None, language: str | None = None):
    segments_of = faster_whisper_segments(hub_id, compute_type, threads, timestamps=False, model=model,
                                          language=language)

    def transcribe(samples) -> str:
        return " ".join(segment.text.strip() for segment in segments_of(samples)).strip()

    return transcribe


def transformers_decoder(model, **generate_options):
    """``samples -> text`` through ``model.generate(**generate_options)``, features and text included."""
    def transcribe(samples) -> str:
        inputs = runtime.to_model(model.prepare_audio_inputs([samples]), model)
        sequences = model.generate(**inputs, max_new_tokens=model.default_max_new_tokens, **generate_options)
        return model.decode_text(sequences, inputs)[0].strip()

    return transcribe


def make_decoders(models: dict, hub_id: str, options: PeerOptions, fw_models: dict) -> dict:
    """``models``: dtype name -> our model loaded in it."""
    told = {"language": options.language} if options.language else {}
    return {name: transformers_decoder(models[_dtype(name)], **OURS[name][1], **told) if name in OURS
            else faster_whisper_decoder(hub_id, FASTER_WHISPER[name], options.threads, fw_models[name],
                                        options.language)
            for name in options.systems}


# --------------------------------------------------------------------------- timing


def measure(decoders: dict, clips: list, repeats: int) -> dict:
    """Per system: each clip's median seconds and its text (systems interleaved per clip, in a new seeded order
    each time, so that no system always follows the same one)."""
    names, order = list(decoders), random.Random(0)
    seconds = {name: [[] for _ in clips] for name in names}
    texts = {name: [None] * len(clips) for name in names}
    for name in names:  # warm-up
        decoders[name](clips[0]["samples"])
    for _ in range(repeats):
        for index, clip in enumerate(clips):
            for name in order.sample(names, len(names)):
                start = time.perf_counter()
                texts[name][index] = decoders[name](clip["samples"])
                seconds[name][index].append(time.perf_counter() - start)
    return {name: {"seconds": [statistics.median(s) for s in seconds[name]], "texts": texts[name]} for name in names}


def summary_rows(measured: dict, references: list, meta: dict) -> list[dict]:
    """One row per system (``ROW_FIELDS``): the sum of its clips' medians, the speed-up against ``hf_generate``,
    WER, and the share of clips whose text equals ``hf_generate``'s (and, for a bfloat16 system,
    ``hf_generate_bfloat16``'s). ``meta`` gives the fields every row shares."""
    reference = measured[REFERENCE]
    reference_seconds = sum(reference["seconds"])

    def same_as(texts, base) -> float | None:
        return None if base is None else round(sum(t == b for t, b in zip(texts, base["texts"])) / len(texts), 4)

    rows = []
    for name, m in measured.items():
        bfloat16 = _dtype(name) == "bfloat16"
        rows.append({"model": meta["model"], "language": meta.get("language"), "system": name, "clips": len(m["texts"]),
                     "e2e_seconds": round(sum(m["seconds"]), 3),
                     "speedup_vs_hf_generate": round(reference_seconds / sum(m["seconds"]), 3),
                     "wer": corpus_wer(references, m["texts"]),
                     "exact_vs_float32_base": same_as(m["texts"], reference),
                     "exact_vs_bfloat16_base": same_as(m["texts"], measured.get(BFLOAT16_REFERENCE)) if bfloat16 else None,
                     **{k: meta[k] for k in ("cpu", "load_before", "load_after", "command", "date")}})
    return rows


def _dtype(name: str) -> str | None:
    """The dtype our model runs in for system ``name`` (None: faster-whisper's)."""
    return OURS[name][0] if name in OURS else None


def merge_summary(existing: list[dict], rows: list[dict]) -> list[dict]:
    """``existing`` without the rows of ``rows``' model and language setting, then ``rows``."""
    return replace_rows(existing, rows, lambda row: (row["model"], row.get("language")))


# --------------------------------------------------------------------------- where a call's time goes


class Stopwatch:
    """Seconds summed per phase name; ``wrap(name, fn)`` times every call of ``fn``."""

    def __init__(self):
        self.seconds = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - start)

        return timed


class _TimedFeatures:
    """faster-whisper's feature extractor, its calls timed (its other attributes passed through)."""

    def __init__(self, extractor, watch: Stopwatch):
        self._extractor, self._call = extractor, watch.wrap("features", extractor.__call__)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._extractor, name)


def ours_phases(model, samples, generate_options: dict) -> dict:
    """Seconds of one call of ours (or the base's generate) by phase: features, the encoder (its module's forward),
    the rest of the prefill (cross-attention keys and values, the prompt's pass), setup (choosing the draft),
    rounds, the text; ``other`` is the call's remainder."""
    watch, encoder = Stopwatch(), model.base.model.encoder
    starts = []
    handles = [encoder.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter())),
               encoder.register_forward_hook(lambda *_: watch.add("encoder", time.perf_counter() - starts.pop()))]
    try:
        start = time.perf_counter()
        inputs = watch.wrap("features", lambda: runtime.to_model(model.prepare_audio_inputs([samples]), model))()
        out = model.generate(**inputs, max_new_tokens=model.default_max_new_tokens, return_stats=True,
                             **generate_options)
        sequences, stats = out
        watch.wrap("text", model.decode_text)(sequences, inputs)
        total = time.perf_counter() - start
    finally:
        for handle in handles:
            handle.remove()
    phases = dict(watch.seconds)
    if "prefill_seconds" in stats:
        phases["prefill_rest"] = stats["prefill_seconds"] - phases.get("encoder", 0.0)
        phases["setup"], phases["rounds"] = stats["setup_seconds"], stats["rounds_seconds"]
    else:  # the base's generate: everything after the encoder is its decoding
        phases["decoding"] = total - sum(phases.values())
    phases["other"] = total - sum(phases.values())
    phases["total"] = total
    ours = "prefill_seconds" in stats
    return {"seconds": phases, **({k: stats.get(k) for k in ("new_tokens", "rounds", "draft")} if ours else {})}


def faster_whisper_phases(fw_model, samples, language: str | None = None) -> dict:
    """Seconds of one faster-whisper call by phase: features, the encoder (each ``encode``; a multilingual model
    whose language is not given encodes twice, once to detect it), and the rest (prompt, decoding, text)."""
    watch = Stopwatch()
    extractor, encode = fw_model.feature_extractor, fw_model.encode
    fw_model.feature_extractor, fw_model.encode = _TimedFeatures(extractor, watch), watch.wrap("encoder", encode)
    try:
        start = time.perf_counter()
        segments, _ = fw_model.transcribe(samples, beam_size=1, best_of=1, temperature=0.0, without_timestamps=True,
                                          condition_on_previous_text=False, vad_filter=False, language=language)
        segments = list(segments)
        total = time.perf_counter() - start
    finally:
        fw_model.feature_extractor = extractor
        del fw_model.encode  # (the instance attribute: the class's method again)
    phases = dict(watch.seconds)
    phases["decoding"] = total - sum(phases.values())
    phases["total"] = total
    return {"seconds": phases, "new_tokens": sum(len(s.tokens) for s in segments)}


def measure_phases(models: dict, fw_models: dict, clips: list, systems: tuple, repeats: int,
                   language: str | None = None) -> dict:
    """Per system, per clip: the median milliseconds of each phase over ``repeats`` interleaved calls (after one
    warm-up call each); and per system the phases' medians summed over the clips."""
    def one(name, samples):
        if name in OURS:
            return ours_phases(models[_dtype(name)], samples, {**OURS[name][1], **({"language": language} if language else {})})
        return faster_whisper_phases(fw_models[name], samples, language)

    per_clip, order = [], random.Random(0)
    for clip in clips:
        runs = {name: [] for name in systems}
        for name in systems:
            one(name, clip["samples"])
        for _ in range(repeats):
            for name in order.sample(systems, len(systems)):
                runs[name].append(one(name, clip["samples"]))
        per_clip.append({"id": clip["id"], "duration_s": clip["duration"],
                         **{name: _median_phases(r) for name, r in runs.items()}})
    totals = {name: {phase: round(sum(c[name]["ms"][phase] for c in per_clip), 2)
                     for phase in per_clip[0][name]["ms"]} for name in systems}
    return {"clips": len(clips), "repeats": repeats, "ms_summed_over_clips": totals, "per_clip": per_clip}


def _median_phases(runs: list[dict]) -> dict:
    names = list(dict.fromkeys(k for r in runs for k in r["seconds"]))
    ms = {k: round(1000 * statistics.median(r["seconds"].get(k, 0.0) for r in runs), 2) for k in names}
    return {"ms": ms, **{k: runs[-1][k] for k in ("new_tokens", "rounds", "draft") if runs[-1].get(k) is not None}}


# --------------------------------------------------------------------------- the command


def parse_options(argv=None) -> PeerOptions:
    p = argparse.ArgumentParser(prog=f"python -m {PROGRAM}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="artifact folder with heads (a Whisper base)")
    p.add_argument("--audio", default=DEFAULT_MANIFEST, help="manifest.jsonl of clips (audio, text)")
    p.add_argument("--repeats", type=cli_args.positive_int, default=3, help="timed calls per clip and system")
    p.add_argument("--threads", type=cli_args.positive_int, default=2, help="torch and CTranslate2 threads")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    p.add_argument("--phase-clips", type=cli_args.non_negative_int, default=0,
                   help="time each call by phase on this many shortest clips (0: not)")
    p.add_argument("--phase-repeats", type=cli_args.positive_int, default=5, help="calls per clip and system there")
    p.add_argument("--out", default=PeerOptions.out, help="folder for results.json")
    p.add_argument("--summary", help="summary JSON to put this model's rows in (one per system)")
    p.add_argument("--language", help="a multilingual base's language, told to every system (default: each detects "
                                      "it; an English-only base takes none)")
    args = p.parse_args(argv)
    try:
        return PeerOptions(model=args.model, audio=args.audio, repeats=args.repeats, threads=args.threads,
                           systems=tuple(s.strip() for s in args.systems.split(",") if s.strip()),
                           phase_clips=args.phase_clips, phase_repeats=args.phase_repeats, out=args.out,
                           summary=args.summary, language=args.language)
    except ValueError as err:
        p.error(str(err))


def load_clips(manifest: str) -> list[dict]:
    from tools import audio_io

    return [{"id": row["id"], "text": row["text"], "duration": row.get("duration"),
             "samples": audio_io.load_audio(row["audio"])} for row in read_manifest(manifest)]


def run(options: PeerOptions, command: str) -> dict:
    import torch

    torch.set_num_threads(options.threads)
    runtime.quiet_generate_notices(False)  # (the base's generate repeats its deprecation notices on every call)
    artifact = resolve_artifact(options.model)
    model, _, declared = load_model(artifact, "cpu", torch.float32)  # (the reference's: always timed)
    if model.family != "whisper":
        raise SystemExit(f"{PROGRAM} compares Whisper artifacts only")
    models = {"float32": model}
    for dtype in {_dtype(name) for name in options.systems} - {None, "float32"}:
        models[dtype] = load_model(artifact, "cpu", getattr(torch, dtype))[0]
    clips = load_clips(options.audio)
    fw_models = {name: faster_whisper_model(declared, FASTER_WHISPER[name], options.threads)
                 for name in options.systems if name in FASTER_WHISPER}
    decoders = make_decoders(models, declared, options, fw_models)
    load_before = load_average()
    measured = measure(decoders, clips, options.repeats)
    load_after = load_average()
    meta = {"model": options.model, "language": options.language, "cpu": cpu_name(), "load_before": load_before, "load_after": load_after,
            "command": command, "date": time.strftime("%Y-%m-%d")}
    rows = summary_rows(measured, [clip["text"] for clip in clips], meta)
    result = {"command": command, "date": meta["date"], "options": asdict(options), "base": declared,
              "cpu": meta["cpu"], "threads": options.threads, "versions": _versions(),
              "environment": environment_info("cpu", torch.float32, options.threads),
              "load_before": load_before, "load_after": load_after,
              "timing": "each clip's median of the repeats, summed; audio samples -> text, features included; "
                        "systems interleaved per clip, in a new seeded order each repeat; one warm-up call each",
              "rows": rows,
              "per_clip": [{"id": clip["id"], "duration_s": clip["duration"],
                            **{name: {"ms": round(1000 * m["seconds"][i], 2), "text": m["texts"][i]}
                               for name, m in measured.items()}} for i, clip in enumerate(clips)]}
    if options.phase_clips:
        shortest = sorted(clips, key=lambda clip: clip["duration"] or len(clip["samples"]) / 16000)
        phase_load = load_average()
        result["phases"] = measure_phases(models, fw_models, shortest[:options.phase_clips], options.systems,
                                          options.phase_repeats, options.language)
        result["phases"]["load_before"], result["phases"]["load_after"] = phase_load, load_average()
    return result


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "transformers", "ctranslate2", "faster-whisper"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def main(argv=None) -> int:
    options = parse_options(argv)
    result = run(options, command_line(PROGRAM, argv))
    write_json_atomic(Path(options.out) / "results.json", result, indent=1)
    if options.summary:
        path = Path(options.summary)
        import json

        existing = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
        write_json_atomic(path, merge_summary(existing, result["rows"]), indent=1)
    for row in result["rows"]:
        print(f"{row['system']:24s} {row['e2e_seconds']:8.2f} s  x generate {row['speedup_vs_hf_generate']:.2f}  "
              f"WER {row['wer']:.4f}  same text as generate {row['exact_vs_float32_base']:.0%}")
    for name, phases in result.get("phases", {}).get("ms_summed_over_clips", {}).items():
        print(f"{name:24s} " + "  ".join(f"{k} {v:.0f}" for k, v in phases.items()) + " ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
