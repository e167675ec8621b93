"""Real-model test material: flite speech (short sentences, and a long recording of many sentences with
pauses, clean or under noise) and the real converted Whisper tiny.en with its committed heads."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# Public-domain prose (Austen, Pride and Prejudice, ch. 1-2), read sentence by sentence.
LONG_TEXT = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
    "of a wife.",
    "However little known the feelings or views of such a man may be on his first entering a neighbourhood, this "
    "truth is so well fixed in the minds of the surrounding families, that he is considered the rightful property "
    "of some one or other of their daughters.",
    "My dear Mr. Bennet, said his lady to him one day, have you heard that Netherfield Park is let at last?",
    "Mr. Bennet replied that he had not.",
    "But it is, returned she; for Mrs. Long has just been here, and she told me all about it.",
    "Mr. Bennet made no answer.",
    "Do you not want to know who has taken it? cried his wife impatiently.",
    "You want to tell me, and I have no objection to hearing it.",
    "This was invitation enough.",
    "Why, my dear, you must know, Mrs. Long says that Netherfield is taken by a young man of large fortune from "
    "the north of England; that he came down on Monday in a chaise and four to see the place, and was so much "
    "delighted with it, that he agreed with Mr. Morris immediately.",
    "That he is to take possession before Michaelmas, and some of his servants are to be in the house by the end "
    "of next week.",
    "What is his name?",
    "Bingley.",
    "Is he married or single?",
    "Oh! Single, my dear, to be sure! A single man of large fortune; four or five thousand a year.",
    "What a fine thing for our girls!",
    "How so? How can it affect them?",
    "My dear Mr. Bennet, replied his wife, how can you be so tiresome! You must know that I am thinking of his "
    "marrying one of them.",
    "Is that his design in settling here?",
    "Design! Nonsense, how can you talk so! But it is very likely that he may fall in love with one of them, and "
    "therefore you must visit him as soon as he comes.",
    "I see no occasion for that. You and the girls may go, or you may send them by themselves, which perhaps will "
    "be still better, for as you are as handsome as any of them, Mr. Bingley may like you the best of the party.",
    "My dear, you flatter me. I certainly have had my share of beauty, but I do not pretend to be anything "
    "extraordinary now.",
    "When a woman has five grown-up daughters, she ought to give over thinking of her own beauty.",
    "In such cases, a woman has not often much beauty to think of.",
    "But, my dear, you must indeed go and see Mr. Bingley when he comes into the neighbourhood.",
    "It is more than I engage for, I assure you.",
]


def flite(text: str, path: Path, voice: str = "slt") -> np.ndarray:
    binary = shutil.which("flite")
    if binary is None:
        pytest.skip("flite not installed (apt-get install flite)")
    import soundfile as sf

    subprocess.run([binary, "-voice", voice, "-t", text, "-o", str(path)], check=True, capture_output=True)
    audio, rate = sf.read(path, dtype="float32")
    assert rate == 16000
    return audio


def long_recording(folder: Path, seconds: float = 120.0, pause: float = 0.6) -> np.ndarray:
    """The sentences above, two voices taking turns, with pauses between them, until ``seconds`` long."""
    return long_recording_with_sentences(folder, seconds, pause)[0]


def long_recording_with_sentences(folder: Path, seconds: float = 120.0, pause: float = 0.6):
    """``long_recording`` and, for each sentence in it, ``(text, first sample, end sample)``."""
    pieces, sentences, total, index = [], [], 0, 0
    silence = np.zeros(int(pause * 16000), dtype=np.float32)
    while total < seconds * 16000:
        text = LONG_TEXT[index % len(LONG_TEXT)]
        audio = flite(text, folder / f"long{index}.wav", ("slt", "rms")[index % 2])
        sentences.append((text, total, total + len(audio)))
        pieces += [audio, silence]
        total += len(audio) + len(silence)
        index += 1
    return np.concatenate(pieces), sentences


def with_noise(audio: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    from pipeline.augment import add_noise

    return add_noise(audio, snr_db, "pink", np.random.default_rng(seed)).astype(np.float32)


def converted_tiny_en() -> Path:
    from pipeline import real_whisper

    try:
        return real_whisper.ensure_converted("openai/whisper-tiny.en")
    except real_whisper.ConversionError as error:
        pytest.skip(f"tiny.en unavailable: {error}")


def real_tiny_en_medusa():
    """heads/whisper-tiny.en on the real converted base."""
    from modeling_medusa import MedusaForASR

    return MedusaForASR.from_pretrained(str(ROOT / "heads" / "whisper-tiny.en"),
                                        base_model_name_or_path=str(converted_tiny_en()))
