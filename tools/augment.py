"""Deterministic audio augmentation of synthetic clips, applied in numpy after synthesis.

    params = plan_augmentation(clip_id, seed, PRESETS["default"])   # a small JSON-able dict, {} for none
    audio = apply_augmentation(audio, 16000, params)

Each effect is drawn for a share of the clips: speed perturbation (resampling with soxr: tempo and pitch
change together, as in Kaldi-style speed perturbation; the synthesiser's own rate varies the tempo alone),
a little reverberation (a synthetic exponentially decaying impulse response), additive white/pink/brown
noise at a chosen SNR, and a random gain. The parameters come from a generator seeded by the clip id, so a
clip is the same on every run and machine; they are recorded in the clip's manifest row.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, replace

import numpy as np

NOISE_COLOURS = ("white", "pink", "brown")
PEAK = 0.99  # after the gain: louder clips are scaled down to this peak instead of clipping


@dataclass(frozen=True)
class AugmentConfig:
    speed_fraction: float = 0.0
    speed_range: tuple[float, float] = (0.9, 1.1)
    reverb_fraction: float = 0.0
    rt60_range: tuple[float, float] = (0.15, 0.6)  # seconds
    noise_fraction: float = 0.0
    snr_range: tuple[float, float] = (5.0, 30.0)  # dB
    gain_fraction: float = 0.0
    gain_range: tuple[float, float] = (-12.0, 6.0)  # dB

    def active(self) -> bool:
        return any(f > 0 for f in (self.speed_fraction, self.reverb_fraction, self.noise_fraction,
                                   self.gain_fraction))

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


PRESETS = {
    "none": AugmentConfig(),
    "default": AugmentConfig(speed_fraction=0.5, reverb_fraction=0.2, noise_fraction=0.4, gain_fraction=0.5),
}


def make_config(preset: str, **fractions: float | None) -> AugmentConfig:
    """A preset with some fractions overridden (None keeps the preset's)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown --augment {preset!r}; choose from {', '.join(PRESETS)}")
    chosen = {k: v for k, v in fractions.items() if v is not None}
    bad = [k for k, v in chosen.items() if not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"augmentation fractions must be within 0-1: {', '.join(bad)}")
    return replace(PRESETS[preset], **chosen)


def clip_seed(clip_id: str, seed: int) -> int:
    # a stable hash: Python's hash() of a str changes between processes
    return int.from_bytes(hashlib.sha256(f"{seed}:{clip_id}:augment".encode()).digest()[:8], "little")


def plan_augmentation(clip_id: str, seed: int, config: AugmentConfig) -> dict:
    """Which effects clip ``clip_id`` gets and their parameters (empty dict: none)."""
    rng = random.Random(clip_seed(clip_id, seed))
    params: dict = {}
    # every draw happens whether or not the effect is chosen, so changing one fraction leaves the others' draws
    draws = {
        "speed": (rng.random(), round(rng.uniform(*config.speed_range), 3)),
        "reverb": (rng.random(), {"rt60": round(rng.uniform(*config.rt60_range), 3),
                                  "direct_db": round(rng.uniform(0.0, 10.0), 1)}),
        "noise": (rng.random(), {"colour": rng.choice(NOISE_COLOURS), "snr_db": round(rng.uniform(*config.snr_range), 1)}),
        "gain_db": (rng.random(), round(rng.uniform(*config.gain_range), 1)),
    }
    fractions = {"speed": config.speed_fraction, "reverb": config.reverb_fraction, "noise": config.noise_fraction,
                 "gain_db": config.gain_fraction}
    for name, (u, value) in draws.items():
        if u < fractions[name]:
            params[name] = value
    if params:
        params["seed"] = rng.getrandbits(32)  # for the noise and the impulse response
    return params


def change_speed(audio: np.ndarray, sr: int, factor: float) -> np.ndarray:
    """Play ``factor`` times faster (shorter by 1/factor), pitch shifted with it."""
    import soxr

    return soxr.resample(audio, sr * factor, sr, quality="HQ").astype(np.float32)


def coloured_noise(n: int, colour: str, rng: np.random.Generator) -> np.ndarray:
    """Unit-power noise whose power spectrum falls as 1/f^0 (white), 1/f (pink) or 1/f^2 (brown)."""
    white = rng.standard_normal(n)
    exponent = NOISE_COLOURS.index(colour)
    if exponent:
        spectrum = np.fft.rfft(white)
        f = np.arange(len(spectrum), dtype=np.float64)
        f[0] = 1.0
        spectrum /= f ** (exponent / 2)
        spectrum[0] = 0.0
        white = np.fft.irfft(spectrum, n)
    return (white / np.sqrt(np.mean(white ** 2))).astype(np.float32)


def add_noise(audio: np.ndarray, snr_db: float, colour: str, rng: np.random.Generator) -> np.ndarray:
    """Add noise at ``snr_db``: clip power over noise power, both averaged over the whole clip."""
    power = float(np.mean(audio.astype(np.float64) ** 2))
    if power == 0.0:
        return audio
    noise = coloured_noise(len(audio), colour, rng) * np.sqrt(power / 10 ** (snr_db / 10))
    return (audio + noise).astype(np.float32)


def impulse_response(sr: int, rt60: float, direct_db: float, rng: np.random.Generator) -> np.ndarray:
    """A direct path followed by exponentially decaying noise (60 dB down after ``rt60`` s)."""
    n = int(rt60 * sr)
    t = np.arange(n) / sr
    tail = rng.standard_normal(n) * np.exp(-6.908 * t / rt60)  # ln(1000) = 6.908: amplitude -60 dB at rt60
    tail[: int(0.002 * sr)] = 0.0  # early reflections arrive a few ms after the direct sound
    tail *= np.sqrt(10 ** (-direct_db / 10) / np.sum(tail ** 2))  # reverberant energy below the direct path
    tail[0] = 1.0
    return tail


def reverberate(audio: np.ndarray, sr: int, rt60: float, direct_db: float, rng: np.random.Generator) -> np.ndarray:
    """Convolve with a synthetic room response (FFT convolution), same length and RMS as the input."""
    ir = impulse_response(sr, rt60, direct_db, rng)
    n = len(audio) + len(ir) - 1
    size = 1 << (n - 1).bit_length()
    wet = np.fft.irfft(np.fft.rfft(audio, size) * np.fft.rfft(ir, size), size)[: len(audio)]
    rms_in, rms_out = np.sqrt(np.mean(audio ** 2)), np.sqrt(np.mean(wet ** 2))
    return (wet * (rms_in / rms_out if rms_out > 0 else 1.0)).astype(np.float32)


def apply_gain(audio: np.ndarray, gain_db: float) -> np.ndarray:
    return (audio * 10 ** (gain_db / 20)).astype(np.float32)


def limit_peak(audio: np.ndarray) -> np.ndarray:
    peak = float(np.max(np.abs(audio))) if len(audio) else 0.0
    return (audio * (PEAK / peak)).astype(np.float32) if peak > PEAK else audio


def apply_augmentation(audio: np.ndarray, sr: int, params: dict) -> np.ndarray:
    """``audio`` (float32 mono) with the planned effects, in the order speed, reverb, noise, gain."""
    if not params:
        return audio
    rng = np.random.default_rng(params["seed"])
    audio = np.asarray(audio, dtype=np.float32)
    if "speed" in params:
        audio = change_speed(audio, sr, params["speed"])
    if "reverb" in params:
        audio = reverberate(audio, sr, params["reverb"]["rt60"], params["reverb"]["direct_db"], rng)
    if "noise" in params:
        audio = add_noise(audio, params["noise"]["snr_db"], params["noise"]["colour"], rng)
    if "gain_db" in params:
        audio = apply_gain(audio, params["gain_db"])
    return limit_peak(audio)
