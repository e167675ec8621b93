"""Join short clips into recordings of up to one Whisper window, for collecting on a CPU.

    python -m pipeline.join_clips --audio work_data/train_speech/manifest.jsonl --out work_data/train_joined

Whisper's encoder always reads a 30 s window, so a 7 s clip costs a CPU as much encoder time as 28 s of speech
while yielding a quarter of the tokens: joining the synthesised clips in manifest order (with a short pause
between them) into recordings of at most ``--max-seconds`` gives ``pipeline.collect`` several sentences'
tokens per encoder pass, as real long-form speech does. Each row of OUT/manifest.jsonl keeps the joined text,
the clips it holds and their sources and licences.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pipeline.collect import run_cli
from tools import cli_args
from tools.audio_io import load_audio
from tools.files import write_atomic, write_atomic_with

SAMPLE_RATE = 16000


def read_manifest(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as err:
        raise SystemExit(f"{path}: cannot read the clips' manifest ({err}); pass a manifest.jsonl written by "
                         "pipeline.synth_speech") from None


def groups(rows: list[dict], max_seconds: float, pause: float) -> list[list[dict]]:
    """Consecutive rows whose durations, with a pause between each two, fit in ``max_seconds``."""
    out, current, length = [], [], 0.0
    for row in rows:
        seconds = float(row["duration"])
        if current and length + pause + seconds > max_seconds:
            out.append(current)
            current, length = [], 0.0
        length += seconds + (pause if current else 0.0)
        current.append(row)
    return out + [current] if current else out


def join(folder: Path, group: list[dict], pause: float) -> np.ndarray:
    silence = np.zeros(int(pause * SAMPLE_RATE), dtype=np.float32)
    parts = []
    for row in group:
        parts += [silence] if parts else []
        parts.append(load_audio(folder / row["audio"], SAMPLE_RATE))
    return np.concatenate(parts)


def write_wav(path: Path, audio: np.ndarray) -> None:
    import soundfile as sf

    write_atomic_with(path, lambda temp: sf.write(temp, audio, SAMPLE_RATE, subtype="PCM_16", format="WAV"))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--audio", required=True, type=Path, help="manifest.jsonl of the clips (pipeline.synth_speech)")
    p.add_argument("--out", required=True, type=Path, help="folder for the joined recordings and their manifest")
    p.add_argument("--max-seconds", type=cli_args.positive_float, default=28.0, help="longest recording (Whisper's window is 30 s)")
    p.add_argument("--pause", type=cli_args.non_negative_float, default=0.5, help="seconds of silence between two clips")
    args = p.parse_args(argv)
    if not 0 < args.max_seconds <= 30:
        raise SystemExit(f"--max-seconds {args.max_seconds}: use a value in (0, 30], one Whisper window")
    rows = [r for r in read_manifest(args.audio) if float(r["duration"]) <= args.max_seconds]
    manifest = []
    for index, group in enumerate(groups(rows, args.max_seconds, args.pause)):
        name = f"joined{index:06d}"
        audio = join(args.audio.parent, group, args.pause)
        write_wav(args.out / "wavs" / f"{name}.wav", audio)
        manifest.append({"id": name, "audio": f"wavs/{name}.wav", "text": " ".join(r["text"] for r in group),
                         "duration": round(len(audio) / SAMPLE_RATE, 3), "clips": [r["id"] for r in group],
                         "sources": sorted({r.get("source", "") for r in group}),
                         "licences": sorted({r.get("licence", "") for r in group})})
    write_atomic(args.out / "manifest.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in manifest))
    seconds = sum(r["duration"] for r in manifest)
    print(f"[join_clips] {len(rows)} clips -> {len(manifest)} recordings, {seconds / 60:.1f} min, in {args.out}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
