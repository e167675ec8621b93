"""Real-model test material: flite speech (short sentences, and a long recording of many sentences with
pauses, clean or under noise: ``tools.long_recording``) and the real converted Whisper tiny.en with its
committed heads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tools import long_recording as material
from tools.long_recording import with_noise  # noqa: F401  (the tests' import point)

ROOT = Path(__file__).resolve().parents[1]


def _or_skip(make, *args):
    """``make(*args)``, the test skipped where flite is not installed."""
    try:
        return make(*args)
    except material.FliteMissing as missing:
        pytest.skip(str(missing))


def flite(text: str, path: Path, voice: str = "slt") -> np.ndarray:
    return _or_skip(material.flite, text, path, voice)


def long_recording(folder: Path, seconds: float = 120.0, pause: float = 0.6) -> np.ndarray:
    """The known sentences, two voices taking turns, with pauses between them, until ``seconds`` long."""
    return long_recording_with_sentences(folder, seconds, pause)[0]


def long_recording_with_sentences(folder: Path, seconds: float = 120.0, pause: float = 0.6):
    """``long_recording`` and, for each sentence in it, ``(text, first sample, end sample)``."""
    return _or_skip(material.long_recording_with_sentences, folder, seconds, pause)


def converted_tiny_en() -> Path:
    from tools import real_whisper

    try:
        return real_whisper.ensure_converted("openai/whisper-tiny.en")
    except real_whisper.ConversionError as error:
        pytest.skip(f"tiny.en unavailable: {error}")


def real_tiny_en_medusa(heads: str = "whisper-tiny.en"):
    """heads/whisper-tiny.en (or other tiny.en heads in heads/) on the real converted base."""
    from modeling_medusa import MedusaForASR

    return MedusaForASR.from_pretrained(str(ROOT / "heads" / heads),
                                        base_model_name_or_path=str(converted_tiny_en()))
