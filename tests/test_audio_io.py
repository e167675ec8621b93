"""Tests for audio_io: decoding every supported format, resampling, windowing, rendering transcripts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import audio_io  # noqa: E402
from tools.audio_io import AudioError, Segment, Window, Word  # noqa: E402

SR = audio_io.TARGET_SAMPLE_RATE
needs_flite = pytest.mark.skipif(shutil.which("flite") is None, reason="flite is not installed")
needs_ffmpeg = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed")


# --------------------------------------------------------------------------- helpers


def tone(freq: float, seconds: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def dominant_frequency(samples: np.ndarray, rate: int = SR) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[np.argmax(spectrum)])


def write_with_pyav(path: Path, samples: np.ndarray, rate: int, codec: str = "aac") -> None:
    av = pytest.importorskip("av")
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        frame_size = 1024
        for start in range(0, len(samples), frame_size):
            chunk = samples[start : start + frame_size][np.newaxis, :]
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format="flt", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


# (extension, writer options, source rate): soundfile writes those with a format, PyAV encodes the others
# (M4A, and the audio track of video containers) with the given codec.
FORMATS = {
    "wav": dict(format="WAV", subtype="PCM_16", rate=22050),
    "flac": dict(format="FLAC", subtype="PCM_16", rate=44100),
    "mp3": dict(format="MP3", subtype="MPEG_LAYER_III", rate=44100),
    "ogg": dict(format="OGG", subtype="VORBIS", rate=32000),
    "opus": dict(format="OGG", subtype="OPUS", rate=48000),
    "aiff": dict(format="AIFF", subtype="PCM_16", rate=44100),
    "m4a": dict(format=None, codec="aac", rate=44100),
    "mkv": dict(format=None, codec="aac", rate=48000),
    "mov": dict(format=None, codec="aac", rate=44100),
    "avi": dict(format=None, codec="pcm_s16le", rate=22050),
}


def write_audio(path: Path, samples: np.ndarray, rate: int) -> None:
    spec = FORMATS[path.suffix.lstrip(".")]
    if spec["format"] is None:
        write_with_pyav(path, samples, rate, spec["codec"])
    else:
        sf.write(str(path), samples, rate, format=spec["format"], subtype=spec["subtype"])


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory) -> Path:
    if shutil.which("flite") is None:
        pytest.skip("flite is not installed")
    path = tmp_path_factory.mktemp("speech") / "speech.wav"
    subprocess.run(["flite", "-t", "The quick brown fox jumps over the lazy dog.", "-o", str(path)], check=True)
    return path


# --------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("extension", sorted(FORMATS))
def test_every_format_decodes_to_16k_mono(tmp_path, extension):
    rate = FORMATS[extension]["rate"]
    path = tmp_path / f"tone.{extension}"
    write_audio(path, tone(440, 1.0, rate), rate)

    samples = audio_io.load_audio(path)

    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(len(samples) - SR) <= 0.06 * SR  # lossy codecs may add a little padding
    assert abs(dominant_frequency(samples) - 440) < 5
    middle = samples[len(samples) // 4 : 3 * len(samples) // 4]
    assert 0.3 < np.sqrt(2) * np.sqrt(np.mean(middle**2)) < 0.7  # amplitude 0.5 survives


@needs_flite
@needs_ffmpeg
@pytest.mark.parametrize(
    "extension, codec", [("mp3", "libmp3lame"), ("ogg", "libvorbis"), ("opus", "libopus"), ("m4a", "aac"), ("flac", "flac")]
)
def test_speech_encoded_by_ffmpeg_matches_wav(tmp_path, speech_wav, extension, codec):
    encoded = tmp_path / f"speech.{extension}"
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-y", "-i", str(speech_wav), "-ac", "2", "-ar", "48000", "-c:a", codec, str(encoded)],
        check=True,
    )
    reference = audio_io.load_audio(speech_wav)
    decoded = audio_io.load_audio(encoded)
    assert abs(len(decoded) - len(reference)) < 0.1 * SR
    assert not audio_io.is_silent(decoded)
    n = min(len(decoded), len(reference))
    envelope = lambda x: np.sqrt(np.convolve(x[:n] ** 2, np.ones(800) / 800, mode="valid"))  # noqa: E731
    assert np.corrcoef(envelope(decoded), envelope(reference))[0, 1] > 0.9


def test_stereo_44k1_is_averaged_and_resampled(tmp_path):
    left, right = tone(440, 2.0, 44100, 0.5), tone(1000, 2.0, 44100, 0.3)
    path = tmp_path / "stereo.wav"
    sf.write(str(path), np.stack([left, right], axis=1), 44100, subtype="FLOAT")

    samples = audio_io.load_audio(path)

    assert len(samples) == 32000  # 2 s at 16 kHz
    expected = (tone(440, 2.0, SR, 0.5) + tone(1000, 2.0, SR, 0.3)) / 2
    middle = slice(1000, -1000)
    assert np.max(np.abs(samples[middle] - expected[middle])) < 1e-2


def test_16k_mono_is_returned_unchanged(tmp_path):
    original = tone(300, 0.5, SR)
    path = tmp_path / "same.wav"
    sf.write(str(path), original, SR, subtype="FLOAT")
    np.testing.assert_array_equal(audio_io.load_audio(path), original)


@pytest.mark.parametrize("name", ["broken.wav", "broken.flac", "broken.mp3", "broken.m4a", "broken.opus"])
def test_corrupt_file_raises_audio_error_naming_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(AudioError) as caught:
        audio_io.load_audio(path)
    message = str(caught.value)
    assert str(path) in message and "cannot decode" in message and "\n" not in message


def test_empty_file_is_reported(tmp_path):
    path = tmp_path / "empty.wav"
    path.touch()
    with pytest.raises(AudioError, match="empty file"):
        audio_io.load_audio(path)


def test_zero_length_audio_is_reported(tmp_path):
    path = tmp_path / "nothing.wav"
    sf.write(str(path), np.zeros(0, dtype=np.float32), SR)
    with pytest.raises(AudioError, match="zero-length"):
        audio_io.load_audio(path)


def test_unsupported_extension_is_reported(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    with pytest.raises(AudioError, match="unsupported format '.txt'"):
        audio_io.load_audio(path)


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(AudioError, match="cannot read file"):
        audio_io.load_audio(tmp_path / "gone.wav")


def test_silence_detection():
    assert audio_io.is_silent(np.zeros(1000, dtype=np.float32))
    assert audio_io.is_silent(np.full(1000, 3e-5, dtype=np.float32))
    assert not audio_io.is_silent(tone(440, 0.1, SR, 0.01))


# --------------------------------------------------------------------------- windowing


def speech_like(seconds: float, burst: float = 1.3, gap: float = 0.4, seed: int = 0) -> np.ndarray:
    """Noise bursts ("words") separated by quiet gaps."""
    rng = np.random.default_rng(seed)
    samples = np.zeros(int(seconds * SR), dtype=np.float32)
    period, on = int((burst + gap) * SR), int(burst * SR)
    for start in range(0, len(samples), period):
        piece = samples[start : start + on]
        piece[:] = rng.normal(0, 0.2, len(piece))
    return samples


def assert_windows_cover(windows: list[Window], total: int, max_seconds: float) -> None:
    assert windows[0].start == 0 and windows[-1].end == total
    for before, after in zip(windows, windows[1:]):
        assert before.end == after.start  # contiguous: no gap, no overlap
    assert sum(w.num_samples for w in windows) == total
    assert all(0 < w.num_samples <= max_seconds * SR for w in windows)


def test_short_audio_is_one_window():
    assert audio_io.plan_windows(np.ones(SR * 5, dtype=np.float32), 30.0) == [Window(0, SR * 5)]


def test_two_minutes_split_at_quiet_points_without_losing_samples():
    samples = speech_like(120.0)
    windows = audio_io.plan_windows(samples, 30.0)

    assert_windows_cover(windows, len(samples), 30.0)
    assert len(windows) == 5  # each window a little shorter than 30 s
    for window in windows[:-1]:
        assert window.end_seconds - window.start_seconds >= 28.0  # cut within the last 2 s
        assert np.all(samples[window.end - 80 : window.end + 80] == 0)  # inside a gap, not a word


def test_no_quiet_point_means_hard_cut_at_limit():
    samples = np.random.default_rng(1).normal(0, 0.2, SR * 70).astype(np.float32)
    windows = audio_io.plan_windows(samples, 30.0)
    assert [(w.start, w.end) for w in windows] == [(0, 30 * SR), (30 * SR, 60 * SR), (60 * SR, 70 * SR)]


def test_meralion_length_windows_cover_long_audio():
    samples = speech_like(700.0, seed=2)
    windows = audio_io.plan_windows(samples, 300.0)
    assert_windows_cover(windows, len(samples), 300.0)
    assert len(windows) == 3


def test_pause_windows_fall_back_to_quiet_points_without_silero(monkeypatch):
    """Without the silero-vad package the windows are energy's (``plan_windows``): every sample covered, cut in a gap."""
    def missing():
        raise ImportError("voice-activity detection needs silero-vad: pip install silero-vad")

    monkeypatch.setattr(audio_io, "_silero", missing)
    samples = speech_like(120.0)
    assert audio_io.pause_windows(samples, 30.0) == audio_io.plan_windows(samples, 30.0)
    assert audio_io.pause_windows(samples[: SR * 20], 30.0) == [Window(0, SR * 20)]


@needs_flite
def test_cuts_in_real_speech_fall_between_words(speech_wav):
    speech = audio_io.load_audio(speech_wav)
    samples = np.tile(speech, int(np.ceil(65 * SR / len(speech))))[: 65 * SR]
    windows = audio_io.plan_windows(samples, 30.0)
    assert_windows_cover(windows, len(samples), 30.0)
    overall_rms = np.sqrt(np.mean(samples**2))
    for window in windows[:-1]:
        around_cut = samples[window.end - 160 : window.end + 160]
        assert np.sqrt(np.mean(around_cut**2)) < 0.1 * overall_rms


# --------------------------------------------------------------------------- rendering


SEGMENTS = [
    Segment(0.0, 5.48, "first segment"),
    Segment(5.48, 8.9, "second\nsegment --> with <tags> & arrows"),
    Segment(8.9, 10.0, ""),  # a silent tail: no cue
    Segment(3600.0, 3605.25, "past the hour"),
]


def srt_cues(text: str) -> list[tuple[int, float, float, str]]:
    import srt

    return [(c.index, c.start.total_seconds(), c.end.total_seconds(), c.content) for c in srt.parse(text)]


def vtt_cues(text: str, tmp_path) -> list[tuple[float, float, str]]:
    import webvtt

    (tmp_path / "cues.vtt").write_text(text)
    seconds = lambda stamp: sum(float(part) * 60**i for i, part in enumerate(reversed(stamp.split(":"))))  # noqa: E731
    return [(round(seconds(c.start), 3), round(seconds(c.end), 3), c.text) for c in webvtt.read(str(tmp_path / "cues.vtt"))]


def test_format_timestamp():
    assert audio_io.format_timestamp(0) == "00:00:00,000"
    assert audio_io.format_timestamp(3661.5) == "01:01:01,500"
    assert audio_io.format_timestamp(59.9996) == "00:01:00,000"
    assert audio_io.format_timestamp(7.25, ".") == "00:00:07.250"


def test_srt_parses_back():
    cues = srt_cues(audio_io.render_srt(SEGMENTS))
    assert [c[0] for c in cues] == [1, 2, 3]
    assert [(c[1], c[2]) for c in cues] == [(0.0, 5.48), (5.48, 8.9), (3600.0, 3605.25)]
    assert cues[1][3] == "second segment -> with <tags> & arrows"


def test_vtt_parses_back(tmp_path):
    cues = vtt_cues(audio_io.render_vtt(SEGMENTS), tmp_path)
    assert [(c[0], c[1]) for c in cues] == [(0.0, 5.48), (5.48, 8.9), (3600.0, 3605.25)]
    assert cues[1][2] == "second segment -&gt; with &lt;tags&gt; &amp; arrows"


LONG_SEGMENT = Segment(10.0, 31.0, "It is a truth universally acknowledged, that a single man in possession of a "
                                   "good fortune, must be in want of a wife. Antidisestablishmentarianismically-speaking"
                                   "-it-is-a-very-long-word indeed.")


@pytest.mark.parametrize("segment", [LONG_SEGMENT, Segment(0.0, 30.0, "one two"), Segment(2.0, 3.0, "a b c " * 20)],
                         ids=["long", "few-words-long-time", "many-words-short-time"])
def test_long_segments_become_cues_within_subtitle_limits(segment, tmp_path):
    """At most 42 characters a line, 2 lines and 7 s a cue, the words in order, inside the segment's time."""
    cues = srt_cues(audio_io.render_srt([segment]))
    assert vtt_cues(audio_io.render_vtt([segment]), tmp_path) == [c[1:] for c in cues]
    assert " ".join(c[3].replace("\n", " ") for c in cues).replace(" ", "") == segment.text.replace(" ", "")
    for index, start, end, text in cues:
        assert segment.start <= start < end <= segment.end and end - start <= 7.0
        lines = text.split("\n")
        assert len(lines) <= 2 and all(len(line) <= 42 for line in lines)
    assert [c[1] for c in cues] == sorted(c[1] for c in cues)
    assert all(a[2] <= b[1] + 1e-3 for a, b in zip(cues, cues[1:]))


def test_a_segment_is_shared_out_evenly_between_its_cues():
    """83 characters need three 42-character lines, so two cues: filled greedily the second held one stray word
    ("time.", on screen for 0.4 s); shared out evenly each holds about half the words, and each cue's lines too."""
    segment = Segment(0.0, 5.5, "Speculative decoding lets a few small extra heads guessed in X words ahead of time.")
    cues = audio_io.subtitle_cues([segment])
    assert [c.text for c in cues] == ["Speculative decoding\nlets a few small extra",
                                      "heads guessed in X words ahead of time."]
    assert cues[0].start == 0.0 and cues[0].end == cues[1].start and cues[1].end == 5.5


def test_cues_and_lines_end_where_phrases_end_when_that_costs_little_evenness():
    """A cue or a line ends after a comma or a full stop where it need run no more than 1.25x the evenest split's
    longest for it; the evenest split stays where no phrase ends near enough."""
    def cue_texts(text, seconds=6.0):
        return [c.text for c in audio_io.subtitle_cues([Segment(0.0, seconds, text)])]

    assert cue_texts("Stuff it into you, his belly counseled him.") == ["Stuff it into you,\nhis belly counseled him."]
    assert cue_texts("He hoped there would be stew for dinner, turnips and carrots and bruised potatoes and fat "
                     "mutton pieces.") == ["He hoped there would be stew for dinner,",
                                           "turnips and carrots and bruised\npotatoes and fat mutton pieces."]
    assert cue_texts("a b c d e f g h i j k l m n o p q r s t u v w x y z, a b c d e f g h i j k l m n o p") == [
        "a b c d e f g h i j k l m n o p q r s t u\nv w x y z, a b c d e f g h i j k l m n o p"]


def test_cues_of_a_segment_with_word_times_start_and_end_with_their_words():
    """With word timestamps a cue runs from its first word's start to its last word's end (a word split to fit a
    line shares its time by characters); words that are not the text's own between spaces (a language written
    without them), or times that would give a cue no time on screen, leave the segment's time shared out by
    characters."""
    words = (Word("Speculative", 0.2, 1.1), Word("decoding", 1.1, 1.6), Word("lets", 1.6, 2.0), Word("a", 2.0, 2.2),
             Word("few", 2.2, 2.4), Word("small", 2.4, 2.7), Word("extra", 2.7, 3.1), Word("heads", 3.4, 3.7),
             Word("guessed", 3.7, 4.0), Word("in", 4.0, 4.1), Word("X", 4.1, 4.3), Word("words", 4.3, 4.6),
             Word("ahead", 4.6, 4.9), Word("of", 4.9, 5.0), Word("time.", 5.0, 5.3))
    segment = Segment(0.0, 5.5, " ".join(w.word for w in words), words)
    cues = audio_io.subtitle_cues([segment])
    assert [(c.start, c.end, c.text) for c in cues] == [
        (0.2, 3.1, "Speculative decoding\nlets a few small extra"), (3.4, 5.3, "heads guessed in X words ahead of time.")]
    long_word = Segment(10.0, 20.0, "a " + "x" * 50, (Word("a", 10.0, 11.0), Word("x" * 50, 12.0, 17.0)))
    assert [(c.start, c.end) for c in audio_io.subtitle_cues([long_word])] == [(10.0, 16.2), (16.2, 17.0)]
    unspaced = Segment(0.0, 2.0, "你好世界", tuple(Word(ch, i * 0.5, i * 0.5 + 0.5) for i, ch in enumerate("你好世界")))
    stuck = Segment(0.0, 2.0, "one two", (Word("one", 1.0, 1.0), Word("two", 1.0, 1.0)))
    for other in (unspaced, stuck):
        assert audio_io.subtitle_cues([other]) == audio_io.subtitle_cues([Segment(other.start, other.end, other.text)])
    assert audio_io.subtitle_cues([unspaced])[0].text == "你好世界"


def test_a_windows_segment_moves_to_the_files_times_with_its_words():
    words = (Word("a", 0.5, 1.0), Word("b", 1.0, 2.0))
    assert Segment(0.5, 2.0, "a b", words).shifted(25.0) == Segment(25.5, 27.0, "a b",
                                                                    (Word("a", 25.5, 26.0), Word("b", 26.0, 27.0)))


def test_windows_in_regions_cover_the_speech_only():
    samples = np.zeros(200 * SR, dtype=np.float32)
    regions = [(1 * SR, 5 * SR), (8 * SR, 20 * SR), (25 * SR, 32 * SR), (40 * SR, 120 * SR)]
    windows = audio_io.windows_in_regions(samples, regions, 30.0)
    assert [(w.start // SR, w.end // SR) for w in windows[:2]] == [(1, 20), (25, 32)]
    assert windows[2].start == 40 * SR and windows[-1].end == 120 * SR
    assert all(w.num_samples <= 30 * SR for w in windows)
    assert sum(w.num_samples for w in windows[2:]) == 80 * SR


def test_render_txt_and_json():
    assert audio_io.render_transcript("txt", " hello ", [], {}) == "hello\n"
    assert audio_io.render_transcript("json", "", [], {"text": "é"}) == '{\n  "text": "é"\n}\n'
    with pytest.raises(ValueError):
        audio_io.render_transcript("doc", "", [], {})


# --------------------------------------------------------------------------- finding inputs


def test_find_audio_files_folders_globs_and_errors(tmp_path):
    (tmp_path / "a" / "deep").mkdir(parents=True)
    for name in ["a/one.wav", "a/deep/two.flac", "a/notes.txt", "a/.hidden.wav", "three.mp3"]:
        (tmp_path / name).write_bytes(b"x")
    sources, errors = audio_io.find_audio_files(
        [str(tmp_path / "a"), str(tmp_path / "*.mp3"), str(tmp_path / "a" / "one.wav"), str(tmp_path / "nope.wav"), str(tmp_path / "*.ogg")]
    )
    assert [s.key for s in sources] == ["a/deep/two.flac", "a/one.wav", "three.mp3"]  # deduplicated
    assert [e.problem for e in errors] == ["no such file or folder", "pattern matches no supported audio files"]


def test_output_names_disambiguate_duplicate_stems(tmp_path):
    for name in ["a/x.wav", "b/x.wav", "c/y.wav", "c/y.mp3", "z.flac"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    sources, _ = audio_io.find_audio_files([str(tmp_path)])
    names = {s.key: n for s, n in audio_io.output_names(sources, "srt").items()}
    assert names == {
        "a/x.wav": "a__x.srt",
        "b/x.wav": "b__x.srt",
        "c/y.mp3": "c__y.mp3.srt",
        "c/y.wav": "c__y.wav.srt",
        "z.flac": "z.srt",
    }
