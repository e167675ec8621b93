"""The audio reader on hostile input: implausible headers refused before decoding, memory bounded while decoding
long files, channels that cancel, samples outside [-1, 1], truncated and unreadable files (issue 53)."""

from __future__ import annotations

import os
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools import audio_io  # noqa: E402
from tools.audio_io import AudioError  # noqa: E402

SR = audio_io.TARGET_SAMPLE_RATE


def tone(freq: float, seconds: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def wav_bytes(rate: int, channels: int, bits: int, payload: bytes, float_samples: bool = False,
              data_size: int | None = None) -> bytes:
    """A WAV file of whatever header fields it is given (PCM or IEEE float), ``data_size`` as the data chunk
    claims it (default: the payload's)."""
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 3 if float_samples else 1, channels, rate, (rate * block) & 0xFFFFFFFF,
                      block & 0xFFFF, bits)
    data_size = len(payload) if data_size is None else data_size
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", data_size) + payload
    return b"RIFF" + struct.pack("<I", min(len(body), 0xFFFFFFFF)) + body


# A process's peak resident set in KiB (ru_maxrss would carry the parent's over fork and exec).
PEAK_RSS_KIB = ("def peak_rss_kib():\n"
                "    return int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])")


def load_in_subprocess(path: Path, memory_limit: int = 2 << 30, timeout: float = 60.0,
                       **options) -> subprocess.CompletedProcess:
    """``load_audio(path)`` in a fresh process held to ``memory_limit`` bytes of address space; it prints the
    error's one line, or the samples' count, then its peak resident set in KiB."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tools import audio_io\n{PEAK_RSS_KIB}\n"
            f"try:\n    print(len(audio_io.load_audio({str(path)!r}, **{options!r})))\n"
            "except audio_io.AudioError as error:\n    print(error)\n"
            "print(peak_rss_kib())")
    return run_limited(code, memory_limit, timeout)


def run_limited(code: str, memory_limit: int, timeout: float) -> subprocess.CompletedProcess:
    """``python -c code`` in a fresh process held to ``memory_limit`` bytes of address space."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit)


# --------------------------------------------------------------------------- bounded memory


def test_a_one_hertz_header_is_refused_before_decoding(tmp_path):
    """16,000 samples claimed at 1 Hz are 4.4 hours once resampled: refused from the header, in a process held
    to 2 GB (the old reader went past 11 GB)."""
    path = tmp_path / "one_hertz.wav"
    path.write_bytes(wav_bytes(1, 1, 16, np.zeros(16_000, dtype="<i2").tobytes()))
    done = load_in_subprocess(path)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stderr[-2000:]
    assert lines[0].startswith(f"{path}: implausible sample rate 1 Hz") and "re-export" in lines[0]


@pytest.mark.parametrize("rate", [999, 768_001, 2**31 - 1])
def test_implausible_rates_are_refused_in_one_line(tmp_path, rate):
    path = tmp_path / "rate.wav"
    path.write_bytes(wav_bytes(rate, 1, 16, np.zeros(64, dtype="<i2").tobytes()))
    with pytest.raises(AudioError, match=f"implausible sample rate {rate} Hz") as caught:
        audio_io.load_audio(path)
    assert "\n" not in str(caught.value)


def test_audio_over_the_duration_limit_is_refused_from_its_header(tmp_path, monkeypatch):
    path = tmp_path / "long.wav"
    sf.write(str(path), tone(440, 3.0, 8000), 8000)
    decoded = []
    monkeypatch.setattr(audio_io, "_decode_mono", lambda *args: decoded.append(args))
    with pytest.raises(AudioError, match=r"over the 0.000555556 h limit.*--max-audio-hours"):
        audio_io.load_audio(path, max_seconds=2.0)
    assert not decoded  # refused before any sample was decoded


def test_a_header_that_understates_the_length_is_held_to_the_limit_while_decoding(tmp_path, monkeypatch):
    path = tmp_path / "long.wav"
    sf.write(str(path), tone(440, 3.0, 8000), 8000)
    opened = audio_io._soundfile_reader(path)
    lying = audio_io._Reader(audio_io.StreamInfo(8000, 1, 1.0), opened.blocks, True)
    monkeypatch.setattr(audio_io, "_soundfile_reader", lambda path: lying)
    monkeypatch.setattr(audio_io, "BLOCK_SAMPLES", 4000)
    with pytest.raises(AudioError, match="more audio than its header says, over the"):
        audio_io.load_audio(path, max_seconds=2.0)


def write_stereo_pcm(path: Path, seconds: float, rate: int = 48_000) -> None:
    """A stereo 16-bit recording written a second at a time (this process stays small)."""
    with sf.SoundFile(str(path), "w", rate, 2, subtype="PCM_16") as audio:
        second = np.stack([tone(440, 1.0, rate, 0.3), tone(660, 1.0, rate, 0.3)], axis=1)
        for _ in range(int(seconds)):
            audio.write(second)


def test_a_long_file_decodes_in_a_small_multiple_of_its_result(tmp_path):
    """Three minutes of 48 kHz stereo: the peak resident set grows by under 3x the 16 kHz float32 result (the old
    reader held the 48 kHz stereo samples, their mean and more: 9x)."""
    path, short = tmp_path / "three_minutes.wav", tmp_path / "short.wav"
    write_stereo_pcm(path, 180)
    write_stereo_pcm(short, 1)
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tools import audio_io\n{PEAK_RSS_KIB}\n"
            f"audio_io.load_audio({str(short)!r})\n"  # (the libraries' first-use memory)
            "before = peak_rss_kib()\n"
            f"samples = audio_io.load_audio({str(path)!r})\n"
            "print(len(samples), samples.nbytes, peak_rss_kib() - before)")
    count, result_bytes, growth_kib = map(int, subprocess.run([sys.executable, "-c", code], check=True,
                                                              capture_output=True, text=True).stdout.split())
    assert count == 180 * SR
    assert growth_kib * 1024 < 3 * result_bytes


def test_the_command_takes_a_duration_limit(tmp_path, capsys):
    from test_transcribe import run

    path = tmp_path / "long.wav"
    sf.write(str(path), tone(440, 8.0, SR), SR)
    code, model, _, err = run([path, "--max-audio-hours", "0.001"], capsys=capsys)
    assert code == 1 and not model.batches and "over the 0.001 h limit" in err
    code, model, _, err = run([path, "--max-audio-hours", "0.01"], capsys=capsys)
    assert code == 0 and model.batches
    with pytest.raises(SystemExit):
        run([path, "--max-audio-hours", "0"])


# --------------------------------------------------------------------------- what the samples hold


def test_stereo_whose_channels_cancel_is_read_from_one_channel(tmp_path):
    left = tone(440, 1.0, 44_100)
    path = tmp_path / "inverted.wav"
    sf.write(str(path), np.stack([left, -left], axis=1), 44_100, subtype="FLOAT")
    notes = []
    samples = audio_io.load_audio(path, note=notes.append)
    np.testing.assert_allclose(samples, soxr.resample(left, 44_100, SR, quality="HQ"), atol=1e-6)
    assert len(notes) == 1 and "channels cancel" in notes[0] and "channel 1 of 2 alone" in notes[0]


def test_a_speaker_a_channel_is_still_mixed(tmp_path):
    """Two voices, one a channel (a phone call), keep both: the mean, not the louder channel."""
    left, right = tone(300, 1.0, SR, 0.5), tone(700, 1.0, SR, 0.2)
    path = tmp_path / "call.wav"
    sf.write(str(path), np.stack([left, right], axis=1), SR, subtype="FLOAT")
    notes = []
    np.testing.assert_allclose(audio_io.load_audio(path, note=notes.append), (left + right) / 2, atol=1e-6)
    assert not notes


def test_cancelling_channels_no_longer_read_as_silence_by_the_command(tmp_path, capsys):
    from test_transcribe import run

    left = tone(440, 2.0, SR)
    path = tmp_path / "inverted.wav"
    sf.write(str(path), np.stack([left, -left], axis=1), SR, subtype="FLOAT")
    code, model, _, err = run([path], capsys=capsys)
    assert code == 0 and model.windows_seen == [2 * SR] and "silent" not in err.split("Summary")[0]
    assert f"note: {path}: its channels cancel" in err


def test_a_float_wav_of_integer_values_is_scaled_back_with_a_note(tmp_path):
    speech = tone(440, 1.0, SR, 0.6)
    path = tmp_path / "int16_as_float.wav"
    sf.write(str(path), speech * 32767, SR, subtype="FLOAT")
    notes = []
    samples = audio_io.load_audio(path, note=notes.append)
    np.testing.assert_allclose(samples, speech * 32767 / 32768, atol=1e-6)
    assert len(notes) == 1 and "far outside [-1, 1]" in notes[0] and "scaled by 1/32768" in notes[0]


def test_a_float_wav_a_little_past_full_scale_is_kept(tmp_path):
    loud = tone(440, 0.5, SR, 1.4)
    path = tmp_path / "hot.wav"
    sf.write(str(path), loud, SR, subtype="FLOAT")
    notes = []
    np.testing.assert_array_equal(audio_io.load_audio(path, note=notes.append), loud)
    assert not notes


def test_the_scaling_note_is_a_warning_by_default(tmp_path):
    path = tmp_path / "int16_as_float.wav"
    sf.write(str(path), tone(440, 0.5, SR) * 32767, SR, subtype="FLOAT")
    with pytest.warns(audio_io.AudioNote, match="scaled by 1/32768"):
        audio_io.load_audio(path)


@pytest.mark.parametrize("value", [1e30, np.inf, np.nan])
def test_absurd_or_non_finite_samples_are_refused_in_one_line(tmp_path, value):
    samples = tone(440, 0.5, 22_050)
    samples[100] = value if not np.isfinite(value) else samples[100]
    samples = samples * 1e30 if np.isfinite(value) else samples
    path = tmp_path / "absurd.wav"
    sf.write(str(path), np.stack([samples, samples], axis=1), 22_050, subtype="FLOAT")
    with pytest.raises(AudioError) as caught:
        audio_io.load_audio(path)
    message = str(caught.value)
    assert "\n" not in message and "re-export" in message
    assert ("beyond any audio scale" if np.isfinite(value) else "NaN or infinite") in message


# --------------------------------------------------------------------------- files that cannot be read


def test_a_truncated_mp3_is_named_truncated(tmp_path):
    whole = tmp_path / "whole.mp3"
    sf.write(str(whole), tone(440, 2.0, 44_100), 44_100, format="MP3")
    path = tmp_path / "cut.mp3"
    path.write_bytes(whole.read_bytes()[:300])
    with pytest.raises(AudioError) as caught:
        audio_io.load_audio(path)
    message = str(caught.value)
    assert "truncated or damaged" in message and "re-download or re-encode" in message
    assert "does not exist" not in message and "\n" not in message


def test_an_mp3_cut_in_the_middle_is_transcribed_as_far_as_it_goes_with_a_note(tmp_path):
    whole = tmp_path / "whole.mp3"
    sf.write(str(whole), tone(440, 10.0, 44_100), 44_100, format="MP3")
    path = tmp_path / "cut.mp3"
    path.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    notes = []
    samples = audio_io.load_audio(path, note=notes.append)
    assert 4 * SR < len(samples) < 6 * SR
    assert len(notes) == 1 and "truncated? its header says 10.0 s" in notes[0] and "re-download" in notes[0]
    notes.clear()
    audio_io.load_audio(whole, note=notes.append)
    assert not notes


def test_another_format_under_an_audio_name_is_named_so(tmp_path):
    path = tmp_path / "notes.mp3"
    path.write_bytes(b"%PDF-1.4\n" + bytes(range(256)) * 4)
    with pytest.raises(AudioError, match=r"corrupt or not \.mp3.*rename it"):
        audio_io.load_audio(path)


def as_a_user_who_may_not_read_it(code: str) -> subprocess.CompletedProcess:
    """``code`` run where file permissions hold: as root, without the capabilities that bypass them."""
    command = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: file permissions cannot be tested")
        dropped = "-dac_override,-dac_read_search"
        command = [setpriv, f"--inh-caps={dropped}", f"--bounding-set={dropped}", *command]
    return subprocess.run(command, capture_output=True, text=True)


def test_an_unreadable_file_is_named_unreadable(tmp_path):
    path = tmp_path / "locked.wav"
    sf.write(str(path), tone(440, 0.5, SR), SR)
    path.chmod(0)
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tools import audio_io\n"
            f"try:\n    audio_io.load_audio({str(path)!r})\nexcept audio_io.AudioError as error:\n    print(error)")
    message = as_a_user_who_may_not_read_it(code).stdout.strip()
    assert message == (f"{path}: permission denied: this user may not read the file; make it readable "
                       f"(chmod a+r {path}) or run as a user who may")
