"""A long recording of known sentences for long-form checks and comparisons: public-domain prose read by
flite's voices in turn, or recorded clips joined, with pauses between the sentences, clean or under noise; each
sentence's text and place.

The flite recording needs the ``flite`` binary (``apt-get install flite``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
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


class FliteMissing(RuntimeError):
    """No flite binary on this machine."""


def flite(text: str, path: Path, voice: str = "slt") -> np.ndarray:
    """``text`` spoken by flite's ``voice`` (written to ``path``) as 16 kHz float32 samples."""
    import soundfile as sf

    binary = shutil.which("flite")
    if binary is None:
        raise FliteMissing("flite is not installed: apt-get install flite")
    subprocess.run([binary, "-voice", voice, "-t", text, "-o", str(path)], check=True, capture_output=True)
    audio, rate = sf.read(path, dtype="float32")
    if rate != SAMPLE_RATE:
        raise RuntimeError(f"flite wrote {rate} Hz audio, expected {SAMPLE_RATE}")
    return audio


def long_recording_with_sentences(folder: Path, seconds: float = 120.0, pause: float = 0.6):
    """The sentences above, two voices taking turns, with ``pause`` seconds between them, until ``seconds`` long;
    and for each sentence in it ``(text, first sample, end sample)``."""

    def spoken(index):
        text = LONG_TEXT[index % len(LONG_TEXT)]
        return text, flite(text, Path(folder) / f"long{index}.wav", ("slt", "rms")[index % 2])

    return join_with_pauses(spoken, seconds, pause)


def joined_recording(clips: list[tuple[str, np.ndarray]], seconds: float, pause: float = 0.6):
    """Recorded clips ``(text, samples)`` joined with ``pause`` seconds between them, in order, then in reverse
    order (new neighbours at every join), and so on until ``seconds`` long; and for each clip in it ``(text, first
    sample, end sample)``. No real recording of several minutes with its text ships in a package we can reach, so
    the long-form checks on real speech join the real clips."""
    if not clips:
        raise ValueError("no clips to join")

    def clip(index):
        turn, place = divmod(index, len(clips))
        return clips[place if turn % 2 == 0 else len(clips) - 1 - place]

    return join_with_pauses(clip, seconds, pause)


def join_with_pauses(piece, seconds: float, pause: float):
    """``piece(0)``, ``piece(1)``, ... (each ``(text, samples)``) with ``pause`` seconds after each, until ``seconds``
    long; and for each piece ``(text, first sample, end sample)``."""
    pieces, sentences, total, index = [], [], 0, 0
    silence = np.zeros(int(pause * SAMPLE_RATE), dtype=np.float32)
    while total < seconds * SAMPLE_RATE:
        text, audio = piece(index)
        sentences.append((text, total, total + len(audio)))
        pieces += [np.asarray(audio, dtype=np.float32), silence]
        total += len(audio) + len(silence)
        index += 1
    return np.concatenate(pieces), sentences


def with_noise(audio: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    """``audio`` under pink noise at ``snr_db`` (over the whole recording)."""
    from tools.augment import add_noise

    return add_noise(audio, snr_db, "pink", np.random.default_rng(seed)).astype(np.float32)
