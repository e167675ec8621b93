"""The transcription command on the real Whisper tiny.en: subtitles carry Whisper's own segments within subtitle
limits, JSON keeps the segment times, and --vad leaves noise and a click without a transcript."""

import json

import numpy as np
import pytest
import soundfile as sf
import torch

from tools import transcribe
from conftest import requires_transformers5
from tools.text_normalizer import wer
from real_speech import long_recording, long_recording_with_sentences, real_tiny_en_medusa, with_noise
from test_transcribe import assert_subtitle_limits

pytestmark = requires_transformers5
SR = 16_000


@pytest.fixture(scope="module")
def model():
    return real_tiny_en_medusa()


def run_cli(model, argv, capsys):
    code = transcribe.main([*map(str, argv), "--quiet"], model_loader=lambda *a, **k: model)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_subtitles_and_json_carry_whisper_segments(model, tmp_path, capsys):
    audio = long_recording(tmp_path, seconds=40.0)
    sf.write(str(tmp_path / "talk.wav"), audio, SR)
    for fmt in ("srt", "vtt", "json"):
        run_cli(model, [tmp_path / "talk.wav", "--format", fmt, "--output", tmp_path / "out"], capsys)
    cues = assert_subtitle_limits((tmp_path / "out" / "talk.srt").read_text(), tmp_path / "out" / "talk.vtt",
                                  len(audio) / SR)
    record = json.loads((tmp_path / "out" / "talk.json").read_text())
    inputs = model.prepare_audio_inputs([audio])
    output = model.generate(**inputs, return_timestamps=True, return_segments=True,
                            max_new_tokens=model.default_max_new_tokens)
    expected = [(round(start, 3), round(end, 3), text) for start, end, text in model.segments(output)[0] if text]
    assert [(s["start"], s["end"], s["text"]) for s in record["segments"]] == expected
    assert len(expected) >= 3 and expected[-1][1] > 30.0  # long-form: past the first window
    assert " ".join(c.content.replace("\n", " ") for c in cues).split() == record["text"].split()
    assert "universally acknowledged" in record["text"].lower()


def test_json_words_are_whisper_token_times(model, tmp_path, capsys):
    """--word-timestamps --format json on 40 s of speech (two long-form windows): the segments are the ones the
    command writes without it (the ids are Medusa's as ever); every segment's words spell its text, in order,
    their times never go back (over the seam of the windows too) and stay inside their segment and the audio;
    and they are the base's own generate(return_token_timestamps=True) token times on the same audio and
    options, grouped into words (one teacher-forced pass per window gives the same alignment)."""
    audio = long_recording(tmp_path, seconds=40.0)
    sf.write(str(tmp_path / "talk.wav"), audio, SR)
    without = json.loads(run_cli(model, [tmp_path / "talk.wav", "--format", "json"], capsys))
    record = json.loads(run_cli(model, [tmp_path / "talk.wav", "--format", "json", "--word-timestamps"], capsys))
    assert [{k: s[k] for k in ("start", "end", "text")} for s in record["segments"]] == without["segments"]
    assert len(record["segments"]) >= 3 and record["segments"][-1]["end"] > 30.0
    times = []
    for segment in record["segments"]:
        words = segment["words"]
        assert "".join(w["word"] for w in words) == "".join(segment["text"].split())
        assert all(segment["start"] <= w["start"] <= w["end"] <= segment["end"] for w in words)
        times += [t for w in words for t in (w["start"], w["end"])]
    assert times == sorted(times) and 0.0 <= times[0] and times[-1] <= len(audio) / SR

    inputs = model.prepare_audio_inputs([audio], return_attention_mask=True)
    torch.manual_seed(transcribe.FALLBACK_SEED)
    base = model.generate(**inputs, use_medusa=False, return_timestamps=True, return_segments=True,
                          return_token_timestamps=True, max_new_tokens=model.default_max_new_tokens,
                          **transcribe.WHISPER_FALLBACK)
    expected = [[{"word": w, "start": round(start, 3), "end": round(end, 3)} for w, start, end in words]
                for (_, _, text), words in zip(model.segments(base)[0], model.segment_words(base)[0]) if text]
    assert [s["words"] for s in record["segments"]] == expected


def test_word_timed_subtitles_start_and_end_with_their_words(model, tmp_path, capsys):
    """--word-timestamps --format srt/vtt: the cues keep the subtitle limits and the text, and each starts at a word's
    start and ends at a word's end of the JSON output's words (at the SRT's millisecond resolution)."""
    audio = long_recording(tmp_path, seconds=40.0)
    sf.write(str(tmp_path / "talk.wav"), audio, SR)
    for fmt in ("srt", "vtt", "json"):
        run_cli(model, [tmp_path / "talk.wav", "--format", fmt, "--word-timestamps", "--output", tmp_path / "out"],
                capsys)
    cues = assert_subtitle_limits((tmp_path / "out" / "talk.srt").read_text(), tmp_path / "out" / "talk.vtt",
                                  len(audio) / SR)
    record = json.loads((tmp_path / "out" / "talk.json").read_text())
    assert " ".join(c.content.replace("\n", " ") for c in cues).split() == record["text"].split()
    words = [w for segment in record["segments"] for w in segment["words"]]
    starts, ends = {round(w["start"], 3) for w in words}, {round(w["end"], 3) for w in words}
    assert all(round(c.start.total_seconds(), 3) in starts and round(c.end.total_seconds(), 3) in ends for c in cues)


def test_vad_gives_noise_and_a_click_no_transcript(model, tmp_path, capsys):
    rng = np.random.default_rng(0)
    sf.write(str(tmp_path / "noise.wav"), rng.normal(0, 0.05, 3 * SR).astype(np.float32), SR)
    sf.write(str(tmp_path / "click.wav"), rng.normal(0, 0.3, int(0.05 * SR)).astype(np.float32), SR)
    files = [tmp_path / "noise.wav", tmp_path / "click.wav"]
    without = run_cli(model, [*files, "--format", "json"], capsys)
    assert any(json.loads(line)["text"] for line in without.splitlines())  # Whisper hallucinates on these
    # with --vad no speech is found, so nothing is transcribed: each file fails (no output) and says why
    code = transcribe.main([*map(str, files), "--format", "json", "--vad", "--quiet"], model_loader=lambda *a, **k: model)
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.count("voice-activity detection found no speech") == 2



@pytest.fixture(scope="module")
def three_minutes(tmp_path_factory):
    return long_recording_with_sentences(tmp_path_factory.mktemp("three_minutes"), seconds=180.0)


@pytest.mark.parametrize("noise", [None, 10.0])
def test_long_audio_keeps_its_words(model, three_minutes, noise, tmp_path, capsys):
    """Three minutes of known sentences (clean, or under continuous pink noise at 10 dB) through the command with
    --vad (the speech cut into windows at its pauses, each decoded on its own): within 1 WER point of the same
    sentences cut out of that audio and transcribed one by one, so no speech is lost at the window seams. Without
    --vad the command runs Whisper's own sequential long-form (the base's output): within 1 point on clean audio;
    under the noise tiny.en's greedy long-form loops on one window as the base's generate does (WER 41 % against
    15 % one by one), and the default temperature fallback's sampled retry brings it under 25 %."""
    clean, sentences = three_minutes
    audio = clean if noise is None else with_noise(clean, snr_db=noise)
    references = [text for text, _, _ in sentences]
    sf.write(str(tmp_path / "talk.wav"), audio, SR)
    one_by_one = []
    for batch in range(0, len(sentences), 8):
        clips = [audio[start:end] for _, start, end in sentences[batch:batch + 8]]
        inputs = model.prepare_audio_inputs(clips)
        one_by_one += model.decode_text(model.generate(**inputs), inputs)
    alone_wer = wer(references, one_by_one)
    whole_wer = wer([" ".join(references)], [run_cli(model, [tmp_path / "talk.wav"], capsys)])
    vad_wer = wer([" ".join(references)], [run_cli(model, [tmp_path / "talk.wav", "--vad", "--batch-size", "8"], capsys)])
    assert vad_wer <= alone_wer + 0.01, (vad_wer, alone_wer)
    if noise is None:
        assert whole_wer <= alone_wer + 0.01, (whole_wer, alone_wer)
    else:
        assert whole_wer < 0.25, f"the long-form loop is back: WER {whole_wer:.3f} (one by one {alone_wer:.3f})"


def test_windows_of_a_long_noisy_recording_are_cut_in_its_pauses(three_minutes):
    """The windows a model without its own long-form (MERaLiON-2) gets: 30 s at most, every sample covered, each cut
    at a pause of the speech by Silero's probability, under continuous pink noise at 10 dB too (no quiet point by
    energy there)."""
    from tools import audio_io

    clean, _ = three_minutes
    windows = audio_io.pause_windows(with_noise(clean, snr_db=10.0), max_seconds=30.0)
    assert windows[0].start == 0 and windows[-1].end == len(clean) and len(windows) >= 6
    assert all(w.end == after.start for w, after in zip(windows, windows[1:]))
    assert all(w.num_samples <= 30 * SR for w in windows)
    speech_level = np.sqrt(np.mean(clean[np.abs(clean) > 0] ** 2))
    for window in windows[:-1]:
        around = clean[window.end - SR // 20 : window.end + SR // 20]  # 50 ms either side of the cut
        assert np.sqrt(np.mean(around**2)) < 0.05 * speech_level, window.end / SR


def test_vad_cuts_a_long_noisy_recording_in_its_pauses(three_minutes):
    """Silero's regions asked to fit 30 s windows, under continuous pink noise at 10 dB (no quiet point by energy,
    and Silero hears no silence either: the whole file is one region): every part fits a window, and every cut
    falls in a pause of the speech (the clean recording is silent around it), never inside a word."""
    from tools import audio_io

    clean, _ = three_minutes
    regions = audio_io.speech_regions(with_noise(clean, snr_db=10.0), max_seconds=30.0)
    assert len(regions) >= 6 and all(end - start <= 30 * SR for start, end in regions)
    speech_level = np.sqrt(np.mean(clean[np.abs(clean) > 0] ** 2))
    for (_, end), (start, _) in zip(regions, regions[1:]):  # each seam between two regions
        middle = (end + start) // 2
        around = clean[middle - SR // 20 : middle + SR // 20]  # 50 ms either side
        assert np.sqrt(np.mean(around**2)) < 0.05 * speech_level, middle / SR
