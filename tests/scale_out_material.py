"""Shared by the Ray Data and Ray Serve tests: a few short flite clips, a file that is not audio, and what the
single-process command (``tools.transcribe``) writes for the clips."""

from __future__ import annotations

import json
from pathlib import Path

from real_speech import flite, real_tiny_en_medusa
from tools import transcribe

SENTENCES = (("The quick brown fox jumped over the lazy dog near the river bank.", "slt"),
             ("Please call Stella. Ask her to bring these things with her from the store.", "rms"),
             ("It is a truth universally acknowledged that a single man must be in want of a wife.", "awb"))


def speech_clips(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"clip{i}.wav" for i in range(len(SENTENCES))]
    for path, (text, voice) in zip(paths, SENTENCES):
        flite(text, path, voice)
    return paths


def not_audio(folder: Path) -> Path:
    path = folder / "broken.wav"
    path.write_bytes(b"this is not a wave file" * 64)
    return path


def single_process_records(paths: list[Path], folder: Path, model=None) -> dict[str, dict]:
    """Per clip path, the JSON record ``python -m tools.transcribe CLIPS --format json`` writes."""
    model = model or real_tiny_en_medusa()
    code = transcribe.main([*map(str, paths), "--format", "json", "--output", str(folder), "--quiet"],
                           model_loader=lambda *a, **k: model)
    assert code == 0
    return {str(p.resolve()): json.loads((folder / f"{p.stem}.json").read_text()) for p in paths}
