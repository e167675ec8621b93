"""The audio reader fed random headers from a fixed seed: rates, channel counts, sample formats (8- to 32-bit
integers, float, double), lengths from none to a few thousand frames, truncated data, garbage bytes. Each file
either decodes to its known samples or is refused with a one-line AudioError, in a process held to 1.5 GB of
address space (issue 53)."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools import audio_io  # noqa: E402

SEED, CASES = 53, 400
MEMORY_LIMIT = 3 << 29  # address space of the fuzzing process
PEAK_RSS_LIMIT_KIB = 400 << 10
RATES = (0, 1, 8, 999, 1000, 8000, 11025, 16000, 22050, 44100, 48000, 96000, 192000, 768000, 768001, 10**7,
         2**32 - 1)
CHANNELS = (1, 1, 2, 2, 3, 6, 8)
ODD_CHANNELS = (0, 1025, 65535)
LENGTHS = (0, 1, 2, 3)
# name: (bits, stored as float, full scale of the stored integers); WAV keeps 8-bit samples unsigned, AIFF signed
SAMPLE_FORMATS = {"int8": (8, False, 2**7), "int16": (16, False, 2**15), "int24": (24, False, 2**23),
                  "int32": (32, False, 2**31), "float": (32, True, 1.0), "double": (64, True, 1.0)}
# what goes wrong with a file: nothing, its data cut short, a data chunk that claims more than is there, garbage
# over its header, garbage after its data, or garbage from the first byte
MUTATIONS = ("none", "none", "none", "truncated", "claims_more", "garbage_header", "garbage_after", "garbage")
STRICT = ("none", "truncated", "claims_more", "garbage_after")  # the samples that are there are known
SUBFORMAT_TAIL = bytes.fromhex("000000001000800000aa00389b71")  # KSDATAFORMAT_SUBTYPE_*'s GUID after its tag


def random_case(rng: np.random.Generator) -> dict:
    container = "aiff" if rng.random() < 0.25 else "wav"
    formats = [name for name in SAMPLE_FORMATS if container == "wav" or not SAMPLE_FORMATS[name][1]]
    sample_format = formats[rng.integers(len(formats))]
    rate = int(RATES[rng.integers(len(RATES))] if rng.random() < 0.6 else rng.integers(1, 200_000))
    channels = int(ODD_CHANNELS[rng.integers(len(ODD_CHANNELS))] if rng.random() < 0.05
                   else CHANNELS[rng.integers(len(CHANNELS))])
    frames = int(LENGTHS[rng.integers(len(LENGTHS))] if rng.random() < 0.3 else rng.integers(4, 4000))
    if channels > 8:
        frames = min(frames, 2)
    scale = {0: 1.0, 1: 32767.0, 2: 1e30}[int(rng.choice(3, p=[0.8, 0.15, 0.05]))]  # floats only
    return {"container": container, "format": sample_format, "rate": rate, "channels": channels, "frames": frames,
            "extensible": bool(rng.random() < 0.3), "scale": scale, "nan": bool(rng.random() < 0.05),
            "mutation": MUTATIONS[rng.integers(len(MUTATIONS))]}


def stored_samples(case: dict, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The samples as stored (integers or floats) and as a reader should see them, float64 [frames, channels]."""
    bits, is_float, full_scale = SAMPLE_FORMATS[case["format"]]
    shape = (case["frames"], case["channels"])
    if is_float:
        stored = np.clip(rng.normal(0, 0.3, shape), -1, 1) * case["scale"]
        if case["nan"] and stored.size:
            stored.flat[rng.integers(stored.size)] = np.nan
        return stored, stored.astype(np.float32 if bits == 32 else np.float64).astype(np.float64)
    stored = rng.integers(-full_scale, full_scale, shape, dtype=np.int64)
    return stored, stored / full_scale


def encode(case: dict, stored: np.ndarray) -> bytes:
    bits, is_float, _ = SAMPLE_FORMATS[case["format"]]
    big_endian = case["container"] == "aiff"
    if is_float:
        return stored.astype(f"{'>' if big_endian else '<'}f{bits // 8}").tobytes()
    values = stored.reshape(-1)
    if bits == 8 and not big_endian:
        values = values + 128  # (WAV's 8-bit samples are unsigned)
    little = values.astype("<i8").view(np.uint8).reshape(-1, 8)[:, : bits // 8]
    return (little[:, ::-1] if big_endian else little).tobytes()


def wav_file(case: dict, payload: bytes, data_size: int) -> bytes:
    bits, is_float, _ = SAMPLE_FORMATS[case["format"]]
    tag = 3 if is_float else 1
    channels, rate = case["channels"], case["rate"]
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 0xFFFE if case["extensible"] else tag, channels & 0xFFFF, rate,
                      (rate * block) & 0xFFFFFFFF, block & 0xFFFF, bits)
    if case["extensible"]:
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", tag) + SUBFORMAT_TAIL
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", data_size) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def extended(rate: int) -> bytes:
    """``rate`` as AIFF's 80-bit extended float."""
    if rate == 0:
        return bytes(10)
    exponent = rate.bit_length() - 1
    return struct.pack(">HQ", 16383 + exponent, rate << (63 - exponent))


def aiff_file(case: dict, payload: bytes, data_size: int) -> bytes:
    bits = SAMPLE_FORMATS[case["format"]][0]
    comm = struct.pack(">hIh", case["channels"] & 0x7FFF, case["frames"], bits) + extended(case["rate"])
    ssnd = struct.pack(">II", 0, 0) + payload
    body = (b"AIFF" + b"COMM" + struct.pack(">I", len(comm)) + comm
            + b"SSND" + struct.pack(">I", data_size + 8) + ssnd)
    return b"FORM" + struct.pack(">I", len(body)) + body


def make_file(case: dict, stored: np.ndarray, rng: np.random.Generator) -> tuple[bytes, int]:
    """The file's bytes and how many whole frames of data it holds."""
    payload = encode(case, stored)
    block = max(case["channels"] * SAMPLE_FORMATS[case["format"]][0] // 8, 1)
    mutation, data_size = case["mutation"], len(payload)
    if mutation == "truncated" and payload:
        payload = payload[: int(rng.integers(len(payload)))]
    if mutation == "claims_more":
        data_size = min(len(payload) + block * int(rng.integers(1, 10**6)), 2**32 - 9)
    whole = (aiff_file if case["container"] == "aiff" else wav_file)(case, payload, data_size)
    header = len(whole) - len(payload)
    if mutation == "garbage_header":
        for index in rng.integers(0, header, int(rng.integers(1, 6))):
            whole = whole[:index] + bytes([int(rng.integers(256))]) + whole[index + 1:]
    elif mutation == "garbage_after":
        whole += b"junk" + struct.pack("<I" if case["container"] == "wav" else ">I", 64) + rng.bytes(64)
    elif mutation == "garbage":
        whole = rng.bytes(int(rng.integers(1, 4096)))
    return whole, len(payload) // block


def expected_decode(heard: np.ndarray, rate: int) -> np.ndarray:
    """What the reader should make of these samples, worked out on its own: the channels' mean unless it
    cancels (then the loudest channel), integer values stored as floats brought back to full scale, 16 kHz."""
    import soxr

    energy = np.sum(heard**2, axis=0)
    mixed, total = float(np.sum(np.sum(heard, axis=1) ** 2)), float(np.sum(energy))
    mono = heard[:, int(np.argmax(energy))] if total and mixed < 0.5 * total else heard.mean(axis=1)
    peak = float(np.max(np.abs(heard)))
    if peak > audio_io.FLOAT_HEADROOM:
        mono = mono / next(scale for scale in audio_io.INTEGER_FULL_SCALES if peak <= scale)
    mono = mono.astype(np.float32)
    return mono if rate == audio_io.TARGET_SAMPLE_RATE else soxr.resample(mono, rate, audio_io.TARGET_SAMPLE_RATE,
                                                                          quality="HQ")


def check_case(case: dict, path: Path, heard: np.ndarray) -> str:
    """"decoded" or "refused"; AssertionError where the reader did neither as it should."""
    strict = case["mutation"] in STRICT
    plausible = audio_io.MIN_SAMPLE_RATE <= case["rate"] <= audio_io.MAX_SAMPLE_RATE
    usable = bool(heard.size) and bool(np.all(np.isfinite(heard))) and np.max(np.abs(heard)) <= 2.0**31
    must_decode = strict and plausible and usable and 1 <= case["channels"] <= 8
    must_refuse = strict and (not plausible or (heard.size and not usable))
    try:
        samples = audio_io.load_audio(path, note=lambda message: None)
    except audio_io.AudioError as error:
        message = str(error)
        assert message.startswith(f"{path}: ") and "\n" not in message, (case, message)
        assert not must_decode, (case, message)
        if must_refuse and not plausible:
            assert "sample rate" in message or "cannot decode" in message, (case, message)
        return "refused"
    assert not must_refuse, case
    assert samples.dtype == np.float32 and samples.ndim == 1 and np.all(np.isfinite(samples)), case
    assert samples.size == 0 or np.max(np.abs(samples)) < 16, case
    if strict:
        expected = expected_decode(heard, case["rate"])
        assert samples.shape == expected.shape, (case, samples.shape, expected.shape)
        np.testing.assert_allclose(samples, expected, atol=1e-4, err_msg=str(case))
    return "decoded"


def fuzz(folder: str, seed: int = SEED, cases: int = CASES) -> dict:
    """Run the cases; the outcomes counted by kind."""
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    for number in range(cases):
        case = random_case(rng)
        stored, heard = stored_samples(case, rng)
        data, whole_frames = make_file(case, stored, rng)
        path = Path(folder) / f"case{number}.{case['container']}"
        path.write_bytes(data)
        outcome = check_case(case, path, heard[:whole_frames])
        key = f"{outcome} ({'strict' if case['mutation'] in STRICT else 'garbage'})"
        counts[key] = counts.get(key, 0) + 1
        path.unlink()
    return counts


def test_random_headers_decode_right_or_are_refused_in_one_line_in_bounded_memory(tmp_path):
    code = (f"import json, sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]\n"
            f"import test_audio_fuzz\ncounts = test_audio_fuzz.fuzz({str(tmp_path)!r})\n"
            "peak = int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n"
            "print(json.dumps({'counts': counts, 'peak_rss_kib': peak}))")
    from test_audio_reader import run_limited

    done = run_limited(code, MEMORY_LIMIT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    counts = result["counts"]
    assert sum(counts.values()) == CASES
    assert counts.get("decoded (strict)", 0) >= CASES // 4 and counts.get("refused (strict)", 0) >= CASES // 10
    assert counts.get("refused (garbage)", 0) >= CASES // 20
    assert result["peak_rss_kib"] < PEAK_RSS_LIMIT_KIB
