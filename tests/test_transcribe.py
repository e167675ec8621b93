"""Tests for the transcription command, run in-process against a fake model."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools import transcribe  # noqa: E402

torch.set_num_threads(1)
SR = 16_000
STATS = {"rounds": 4, "drafted_tokens": 16, "accepted_tokens": 6, "mean_accepted_per_round": 2.5, "new_tokens": 10}


class FakeModel:
    """Same interface as MedusaForASR; a "transcript" says how many samples a window had."""

    family = "whisper"
    word_timestamps = temperature_fallback = True
    max_audio_seconds = 30.0
    pad_token_id = 0
    default_max_new_tokens = 224

    def __init__(self, fail_on_samples: int | None = None, interrupt_on_samples: int | None = None):
        self.batches: list[list[int]] = []  # window lengths of each transcribed batch
        self.fail_on_samples = fail_on_samples
        self.interrupt_on_samples = interrupt_on_samples

    def check_prompt_options(self, language=None, task=None):
        if language == "xx":
            raise ValueError("Unknown Whisper language 'xx'; use a code such as 'en'.")

    def prepare_audio_inputs(self, arrays, **prompt_options):
        assert all(a.dtype == np.float32 and a.ndim == 1 for a in arrays)
        self.prompt_options = prompt_options
        return {"input_features": torch.zeros(len(arrays), 2), "lengths": torch.tensor([len(a) for a in arrays])}

    def generate(self, input_features, lengths, max_new_tokens, use_medusa, return_stats, compile=False,
                 temperature=None, compression_ratio_threshold=None):  # (a Whisper's temperature fallback)
        assert return_stats and max_new_tokens > 0
        assert use_medusa or not compile, "compile is a Medusa option"
        self.compiled_calls = getattr(self, "compiled_calls", 0) + compile
        if max_new_tokens > transcribe.WARMUP_NEW_TOKENS:
            self.batches.append(lengths.tolist())
        if self.fail_on_samples in lengths.tolist():
            raise RuntimeError("CUDA out of memory")
        if self.interrupt_on_samples in lengths.tolist():
            raise KeyboardInterrupt
        sequences = torch.stack([torch.tensor([7, int(n), 0]) for n in lengths])
        return sequences, dict(STATS)

    def decode_text(self, sequences, inputs):
        return [f" {int(row[1])} samples " for row in sequences]

    @property
    def windows_seen(self) -> list[int]:
        return [n for batch in self.batches for n in batch]


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    samples = np.zeros(int(seconds * SR), dtype=np.float32)
    for start in range(0, len(samples), int(1.7 * SR)):
        piece = samples[start : start + int(1.3 * SR)]
        piece[:] = rng.normal(0, 0.2, len(piece))
    return samples


def write_wav(path: Path, seconds: float = 1.0, seed: int = 0, rate: int = SR) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), speech_like(seconds, seed)[: int(seconds * rate)], rate)
    return path


def run(argv, model=None, capsys=None):
    model = model or FakeModel()
    loader = lambda path, device, dtype, **options: model  # noqa: E731
    code = transcribe.main([*map(str, argv), "--quiet"], model_loader=loader)
    out, err = capsys.readouterr() if capsys else ("", "")
    return code, model, out, err


# --------------------------------------------------------------------------- batch transcription


def test_long_file_is_transcribed_whole_by_windows(tmp_path, capsys):
    audio = write_wav(tmp_path / "talk.wav", seconds=120.0)
    code, model, out, err = run([audio], capsys=capsys)

    assert code == 0
    lengths = model.windows_seen
    assert sum(lengths) == 120 * SR and len(lengths) == 5  # nothing lost at the seams
    assert all(n <= 30 * SR for n in lengths)
    assert out.strip() == " ".join(f"{n} samples" for n in lengths)
    assert "1 done, 0 failed, 0 skipped" in err and "mean accepted tokens/round 2.50" in err


def test_compile_flag_reaches_medusa_generate_and_warns_on_a_cpu(tmp_path, capsys):
    """--compile reaches generate; on a CPU, where compiled draft rounds run slower, the command says so (and
    still compiles: the user asked)."""
    audio = write_wav(tmp_path / "a.wav", seconds=40.0)
    code, model, _, err = run([audio, "--compile", "--device", "cpu"], capsys=capsys)
    assert code == 0 and model.compiled_calls == len(model.batches) == 2
    assert "warning: --compile on a CPU" in err
    code, model, _, err = run([audio], capsys=capsys)
    assert code == 0 and model.compiled_calls == 0 and "--compile" not in err


def test_temperature_fallback_reaches_whisper_generate_and_is_refused_for_other_families(tmp_path, capsys):
    class Recording(FakeModel):
        def generate(self, *args, temperature=None, compression_ratio_threshold=None, **kwargs):
            self.fallback = (temperature, compression_ratio_threshold)
            return super().generate(*args, **kwargs)

    audio = write_wav(tmp_path / "a.wav", seconds=2.0)
    for flags in ([], ["--temperature-fallback"]):  # on by default for Whisper
        code, model, _, _ = run([audio, *flags], model=Recording(), capsys=capsys)
        assert code == 0 and model.fallback == ((0.0, 0.2, 0.4, 0.6, 0.8, 1.0), 1.35)
    code, model, _, _ = run([audio, "--no-temperature-fallback"], model=Recording(), capsys=capsys)
    assert code == 0 and model.fallback == (None, None)
    other, refused = Recording(), Recording()
    other.family = refused.family = "meralion2"
    other.temperature_fallback = refused.temperature_fallback = False
    code, model, _, _ = run([audio], model=other, capsys=capsys)
    assert code == 0 and model.fallback == (None, None)  # off by default elsewhere
    code, model, out, err = run([audio, "--temperature-fallback"], model=refused, capsys=capsys)
    assert code == transcribe.EXIT_USER_ERROR and model.batches == [] and out == ""
    assert "--temperature-fallback is Whisper's long-form option" in err


def test_word_timestamps_are_refused_outside_whisper_timed_formats(tmp_path, capsys):
    """Word times go into the JSON output or time the subtitle cues, and come from Whisper's alignment: plain text
    stops before the model loads, another family before any audio is decoded, each with one error line."""
    audio = write_wav(tmp_path / "a.wav", seconds=2.0)
    loads = []
    code = transcribe.main([str(audio), "--word-timestamps", "--format", "txt", "--quiet"],
                                  model_loader=lambda *args, **kwargs: loads.append(args))
    out, err = capsys.readouterr()
    assert code == transcribe.EXIT_USER_ERROR and loads == [] and out == ""
    assert err.splitlines() == ["error: --word-timestamps times words for --format json, srt, vtt; --format txt "
                                "has no place for times"]
    other = FakeModel()
    other.family, other.word_timestamps = "meralion2", False
    code, model, out, err = run([audio, "--word-timestamps", "--format", "json"], model=other, capsys=capsys)
    assert code == transcribe.EXIT_USER_ERROR and model.batches == [] and out == ""
    assert err.splitlines() == ["error: --word-timestamps times words by Whisper's cross-attention alignment; this "
                                "is a meralion2 model: leave it out"]


def test_language_and_task_reach_the_model_and_bad_ones_stop_early(tmp_path, capsys):
    audio = write_wav(tmp_path / "a.wav", seconds=2.0)
    code, model, _, _ = run([audio, "--language", "fr", "--task", "translate"], capsys=capsys)
    assert code == 0 and model.prompt_options == {"language": "fr", "task": "translate"}
    code, model, _, _ = run([audio], capsys=capsys)
    assert code == 0 and model.prompt_options == {}
    code, model, out, err = run([audio, "--language", "xx"], capsys=capsys)
    assert code == transcribe.EXIT_USER_ERROR and model.batches == [] and out == ""
    assert "Unknown Whisper language 'xx'" in err


def test_windows_of_several_files_are_batched(tmp_path, capsys):
    long_file = write_wav(tmp_path / "long.wav", seconds=45.0)
    short_files = [write_wav(tmp_path / f"s{i}.wav", seconds=1.0 + i, seed=i) for i in range(3)]
    code, model, out, _ = run([long_file, *short_files, "--batch-size", "3"], capsys=capsys)

    assert code == 0
    assert [len(b) for b in model.batches] == [3, 2]  # 2 windows + 1 file, then 2 files
    assert out.count("==> ") == 4


class FakeTimedModel(FakeModel):
    """A model that times its own segments (as Whisper does): one segment per input, over all its samples."""

    timestamped = True

    def generate(self, input_features, lengths, return_timestamps=False, return_segments=False, **options):
        assert return_timestamps and return_segments
        sequences, stats = super().generate(input_features, lengths, **options)
        return {"sequences": sequences, "segments": [[{"samples": int(n)}] for n in lengths]}, stats

    def segments(self, output):
        return [[(0.0, s["samples"] / SR, f"{s['samples']} samples") for s in row] for row in output["segments"]]


def test_vad_windows_are_cut_at_the_speech_pauses_decoded_together_and_timed_in_the_file(tmp_path, capsys,
                                                                                        monkeypatch):
    """--vad on a model that times its own segments: the speech regions (asked to fit a window) packed into
    windows of at most 30 s, each decoded on its own, batched, and its segments moved to the file's times."""
    asked = []

    def regions(samples, max_seconds=None):
        asked.append(max_seconds)
        return [(1 * SR, 20 * SR), (25 * SR, 50 * SR), (52 * SR, 70 * SR)]

    monkeypatch.setattr(transcribe.audio_io, "speech_regions", regions)
    audio = write_wav(tmp_path / "talk.wav", seconds=80.0)
    code, model, out, err = run([audio, "--vad", "--format", "json", "--batch-size", "4"], FakeTimedModel(), capsys)
    assert code == 0 and asked == [30.0], err
    assert model.batches == [[19 * SR, 25 * SR, 18 * SR]]  # (1-20 s and 25-50 s would make a 49 s window)
    record = json.loads(out)
    assert [(s["start"], s["end"], s["text"]) for s in record["segments"]] == [
        (1.0, 20.0, f"{19 * SR} samples"), (25.0, 50.0, f"{25 * SR} samples"), (52.0, 70.0, f"{18 * SR} samples")]
    monkeypatch.setattr(transcribe.audio_io, "speech_regions", lambda samples, max_seconds=None: [])
    code, model, out, err = run([audio, "--vad", "--format", "json"], FakeTimedModel(), capsys)
    assert code == 1 and model.batches == [] and out == ""  # no speech: nothing to say, which is not success
    assert f"error: {audio}: voice-activity detection found no speech; no output written" in err


def assert_subtitle_limits(srt_text: str, vtt_path: Path, duration: float) -> list:
    """Parsed with the srt and webvtt-py packages: numbered cues in order, inside the audio, at most 7 s,
    2 lines and 42 characters a line; SRT and VTT the same cues."""
    import srt
    import webvtt

    cues = list(srt.parse(srt_text))
    assert [c.index for c in cues] == list(range(1, len(cues) + 1)) and cues
    vtt = webvtt.read(str(vtt_path))
    stamp = lambda delta: srt.timedelta_to_srt_timestamp(delta).replace(",", ".")  # noqa: E731
    assert [(c.start, c.end, c.text) for c in vtt] == [(stamp(c.start), stamp(c.end), c.content) for c in cues]
    for cue, previous in zip(cues, [None, *cues]):
        start, end = cue.start.total_seconds(), cue.end.total_seconds()
        assert 0 <= start < end <= duration + 1e-3 and end - start <= 7.0 + 1e-3
        assert previous is None or previous.end <= cue.start
        lines = cue.content.split("\n")
        assert 1 <= len(lines) <= 2 and all(0 < len(line) <= 42 for line in lines)
    return cues


def test_srt_and_vtt_cues_follow_subtitle_limits(tmp_path, capsys):
    audio = write_wav(tmp_path / "talk.wav", seconds=70.0)
    for fmt in ("srt", "vtt"):
        code, model, _, _ = run([audio, "--format", fmt, "--output", tmp_path / "out"], capsys=capsys)
        assert code == 0
    cues = assert_subtitle_limits((tmp_path / "out" / "talk.srt").read_text(), tmp_path / "out" / "talk.vtt", 70.0)
    windows = model.windows_seen  # each window's text stays in its window
    assert [c.content for c in cues] == [f"{n}" if i % 2 == 0 else "samples" for n in windows for i in range(2)]


def test_json_output(tmp_path, capsys):
    audio = write_wav(tmp_path / "a.wav", seconds=2.0)
    code, _, _, _ = run([audio, "--format", "json", "--output", tmp_path / "out", "--no-medusa"], capsys=capsys)
    record = json.loads((tmp_path / "out" / "a.json").read_text())
    assert code == 0 and record["text"] == "32000 samples" and record["medusa"] is False
    assert record["duration_seconds"] == 2.0 and record["segments"] == [{"start": 0.0, "end": 2.0, "text": "32000 samples"}]


def test_json_to_stdout_is_one_object_per_line(tmp_path, capsys):
    files = [write_wav(tmp_path / f"{n}.wav") for n in ("a", "b")]
    _, _, out, _ = run([*files, "--format", "json"], capsys=capsys)
    assert [json.loads(line)["file"] for line in out.splitlines()] == [str(f) for f in files]


def test_folders_globs_and_duplicate_stems(tmp_path, capsys):
    write_wav(tmp_path / "in" / "a" / "x.wav")
    write_wav(tmp_path / "in" / "b" / "x.wav")
    write_wav(tmp_path / "in" / "b" / "y.wav")
    code, model, _, _ = run([tmp_path / "in" / "a", str(tmp_path / "in" / "b" / "*.wav"), "--output", tmp_path / "out"], capsys=capsys)
    assert code == 0 and len(model.windows_seen) == 3
    assert outputs(tmp_path / "out") == ["a__x.txt", "b__x.txt", "y.txt"]


# --------------------------------------------------------------------------- bad input


def test_corrupt_file_among_good_ones(tmp_path, capsys):
    good = [write_wav(tmp_path / f"good{i}.wav", seed=i) for i in range(2)]
    corrupt = tmp_path / "corrupt.flac"
    corrupt.write_bytes(b"fLaC" + bytes(range(256)) * 8)
    code, model, _, err = run([good[0], corrupt, good[1], "--output", tmp_path / "out"], capsys=capsys)

    assert code == 1
    assert outputs(tmp_path / "out") == ["good0.txt", "good1.txt"]
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and str(corrupt) in error_lines[0] and "cannot decode" in error_lines[0]
    assert "2 done, 1 failed" in err


def test_empty_zero_length_unsupported_and_missing_inputs(tmp_path, capsys):
    empty = tmp_path / "empty.wav"
    empty.touch()
    zero = tmp_path / "zero.wav"
    sf.write(str(zero), np.zeros(0, dtype=np.float32), SR)
    text = tmp_path / "notes.txt"
    text.write_text("not audio")
    good = write_wav(tmp_path / "good.wav")
    code, model, out, err = run([empty, zero, text, tmp_path / "missing.wav", good], capsys=capsys)

    assert code == 1 and len(model.windows_seen) == 1
    assert f"{empty}: empty file" in err
    assert f"{zero}: zero-length audio" in err
    assert f"{text}: unsupported format '.txt'" in err
    assert f"{tmp_path / 'missing.wav'}: no such file" in err
    assert "1 done, 4 failed" in err
    assert out.strip().endswith("16000 samples")


def test_silent_file_fails_without_running_the_model(tmp_path, capsys):
    """A file that gives no transcript is a failure the exit status reports, not a skip: nothing was made."""
    silent = tmp_path / "silent.wav"
    sf.write(str(silent), np.zeros(SR, dtype=np.float32), SR)
    code, model, out, err = run([silent, "--output", tmp_path / "out"], capsys=capsys)
    assert code == 1 and model.batches == [] and outputs(tmp_path / "out") == []
    assert f"error: {silent}: silent audio" in err and "0 done, 1 failed, 0 skipped" in err


def test_file_whose_windows_give_no_text_fails_and_is_retried(tmp_path, capsys):
    class Mute(FakeModel):
        def decode_text(self, sequences, inputs):
            return ["" if int(row[1]) == SR else f" {int(row[1])} samples " for row in sequences]

    mute, talks = write_wav(tmp_path / "in" / "mute.wav"), write_wav(tmp_path / "in" / "talks.wav", seconds=2.0)
    out_dir = tmp_path / "out"
    code, _, _, err = run([mute, talks, "--output", out_dir], model=Mute(), capsys=capsys)
    assert code == 1 and outputs(out_dir) == ["talks.txt"]
    assert f"error: {mute}: the model produced no text; no output written" in err and "1 done, 1 failed" in err
    code, model, _, err = run([mute, talks, "--output", out_dir], model=Mute(), capsys=capsys)
    assert code == 1 and model.windows_seen == [SR] and "0 done, 1 failed, 1 skipped" in err  # tried again


def test_silent_window_of_long_file_is_not_sent_to_the_model(tmp_path, capsys):
    samples = np.concatenate([speech_like(30.0), np.zeros(35 * SR, dtype=np.float32)])
    sf.write(str(tmp_path / "tail.wav"), samples, SR)
    code, model, out, _ = run([tmp_path / "tail.wav"], capsys=capsys)
    assert code == 0 and len(model.windows_seen) < 3
    assert sum(model.windows_seen) < len(samples)


def test_model_failure_on_one_batch_fails_only_those_files(tmp_path, capsys):
    ok = write_wav(tmp_path / "ok.wav", seconds=1.0)
    bad = write_wav(tmp_path / "bad.wav", seconds=2.0)
    code, _, out, err = run([ok, bad], model=FakeModel(fail_on_samples=2 * SR), capsys=capsys)
    assert code == 1 and "16000 samples" in out
    assert f"{bad}: model failed on this audio (RuntimeError: CUDA out of memory)" in err


@pytest.mark.parametrize("output", ["a file", "/proc/x"])
def test_unwritable_output_is_refused_before_the_model_loads(tmp_path, capsys, output):
    audio = write_wav(tmp_path / "a.wav")
    if output == "a file":
        output = tmp_path / "taken.txt"
        output.write_text("not a folder")

    def loader(*args, **kwargs):
        raise AssertionError("the model was loaded although the output cannot be written")

    code = transcribe.main([str(audio), "--output", str(output), "--quiet"], model_loader=loader)
    err = capsys.readouterr().err
    assert code == transcribe.EXIT_USER_ERROR and err.count("\n") == 1 and str(output) in err


def test_max_new_tokens_beyond_the_model_limit_is_refused_once_up_front(tmp_path, capsys):
    class Limited(FakeModel):
        def max_new_tokens_limit(self, language=None, task=None):
            return 100

    files = [write_wav(tmp_path / f"{n}.wav") for n in "ab"]
    code, model, _, err = run([*files, "--max-new-tokens", "101"], model=Limited(), capsys=capsys)
    assert code == transcribe.EXIT_USER_ERROR and model.batches == []
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: --max-new-tokens 101 is beyond this model's 100 new tokens per window (its decoder positions minus "
        "the prompt); pass --max-new-tokens 100 or less"]
    code, model, _, _ = run([*files, "--max-new-tokens", "100"], model=Limited(), capsys=capsys)
    assert code == 0 and len(model.batches) == 2


def test_ctrl_c_while_loading_the_model_is_one_line(tmp_path, capsys):
    def loader(*args, **kwargs):
        raise KeyboardInterrupt

    code = transcribe.main([str(write_wav(tmp_path / "a.wav")), "--output", str(tmp_path / "out")],
                                  model_loader=loader)
    err = capsys.readouterr().err
    assert code == transcribe.EXIT_INTERRUPTED and err.startswith("interrupted") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_model_without_heads_exits_2(tmp_path, capsys):
    def loader(path, device, dtype, **options):
        raise FileNotFoundError(f"{path} has no medusa_heads.safetensors")

    code = transcribe.main([str(write_wav(tmp_path / "a.wav")), "--model", str(tmp_path)], model_loader=loader)
    err = capsys.readouterr().err
    assert code == 2 and "cannot load model" in err and "no medusa_heads.safetensors" in err


# --------------------------------------------------------------------------- resume


def outputs(folder: Path) -> list[str]:
    """The transcripts in an --output folder (not its hidden record of what they came from)."""
    return sorted(p.name for p in folder.iterdir() if p.name != transcribe.RECORDS_FILE)


def test_rerun_skips_files_already_transcribed(tmp_path, capsys):
    files = [write_wav(tmp_path / "in" / f"{n}.wav", seed=i) for i, n in enumerate("abc")]
    out_dir = tmp_path / "out"
    (out_dir).mkdir()
    (out_dir / "b.txt").write_text("no record of what this came from\n")  # e.g. written by an older version
    code, first, _, err = run([tmp_path / "in", "--output", out_dir], capsys=capsys)
    assert code == 0 and len(first.windows_seen) == 3 and "3 done, 0 failed, 0 skipped" in err
    assert (out_dir / "b.txt").read_text() == "16000 samples\n"

    code, second, _, err = run([tmp_path / "in", "--output", out_dir], capsys=capsys)
    assert code == 0 and second.batches == []
    assert "0 done, 0 failed, 3 skipped (output up to date)" in err

    code, third, _, _ = run([*files, "--output", out_dir, "--overwrite"], capsys=capsys)
    assert len(third.windows_seen) == 3
    assert sorted(p.name for p in out_dir.iterdir()) == [transcribe.RECORDS_FILE, "a.txt", "b.txt", "c.txt"]


def test_same_name_from_another_folder_gets_its_own_output(tmp_path, capsys):
    """d1/x.wav and d2/x.wav (different audio) into one --output in two runs: two outputs, each its own."""
    first, second = write_wav(tmp_path / "d1" / "x.wav", seconds=1.0), write_wav(tmp_path / "d2" / "x.wav", seconds=2.0)
    out_dir = tmp_path / "out"
    assert run([first, "--output", out_dir], capsys=capsys)[0] == 0
    code, model, _, err = run([second, "--output", out_dir], capsys=capsys)
    assert code == 0 and model.windows_seen == [2 * SR] and "1 done" in err
    assert outputs(out_dir) == ["x-1.txt", "x.txt"]
    assert (out_dir / "x.txt").read_text() == "16000 samples\n"
    assert (out_dir / "x-1.txt").read_text() == "32000 samples\n"
    for audio in (first, second):  # each rerun finds its own output
        code, model, _, err = run([audio, "--output", out_dir], capsys=capsys)
        assert code == 0 and model.batches == [] and "1 skipped (output up to date)" in err


def test_changed_audio_or_settings_are_transcribed_again(tmp_path, capsys):
    audio = write_wav(tmp_path / "in" / "a.wav", seconds=1.0)
    out_dir = tmp_path / "out"
    assert run([audio, "--output", out_dir], capsys=capsys)[0] == 0
    write_wav(audio, seconds=2.0, seed=5)  # the same file name, other audio
    code, model, _, _ = run([audio, "--output", out_dir], capsys=capsys)
    assert model.windows_seen == [2 * SR] and (out_dir / "a.txt").read_text() == "32000 samples\n"
    code, model, _, _ = run([audio, "--output", out_dir, "--max-new-tokens", "50"], capsys=capsys)
    assert model.windows_seen == [2 * SR]  # another option that shapes the transcript
    code, model, _, _ = run([audio, "--output", out_dir, "--max-new-tokens", "50", "--no-medusa"], capsys=capsys)
    assert model.batches == []  # Medusa on or off gives the same transcript
    (tmp_path / "in" / "a.wav").unlink()
    replaced = write_wav(tmp_path / "in" / "a.flac", seconds=3.0)  # a new file where the old one was
    code, model, _, _ = run([tmp_path / "in", "--output", out_dir], capsys=capsys)
    assert model.windows_seen == [3 * SR] and outputs(out_dir) == ["a-1.txt", "a.txt"]
    assert (out_dir / "a-1.txt").read_text() == "48000 samples\n" and replaced.exists()


def test_interrupted_run_keeps_finished_outputs_and_resumes(tmp_path, capsys):
    files = [write_wav(tmp_path / "in" / f"{n}.wav", seconds=1.0 + i, seed=i) for i, n in enumerate("abc")]
    out_dir = tmp_path / "out"
    code, _, _, err = run([*files, "--output", out_dir], model=FakeModel(interrupt_on_samples=2 * SR), capsys=capsys)
    assert code == 130 and "interrupted" in err and "rerun the same command" in err
    assert outputs(out_dir) == ["a.txt"]

    code, resumed, _, err = run([*files, "--output", out_dir], capsys=capsys)
    assert code == 0 and resumed.windows_seen == [2 * SR, 3 * SR]  # only b and c
    assert "2 done, 0 failed, 1 skipped (output up to date)" in err


def test_output_write_is_atomic(tmp_path, capsys, monkeypatch):
    audio = write_wav(tmp_path / "a.wav")
    out_dir = tmp_path / "out"

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(transcribe.files.os, "replace", broken_replace)
    code, _, _, err = run([audio, "--output", out_dir], capsys=capsys)
    assert code == 1 and "cannot write output" in err
    assert [p.name for p in out_dir.iterdir()] == [transcribe.RECORDS_FILE]  # no partial output, no temp file
    monkeypatch.undo()
    code, model, _, _ = run([audio, "--output", out_dir], capsys=capsys)
    assert code == 0 and model.windows_seen == [SR] and outputs(out_dir) == ["a.txt"]  # a rerun redoes it


def child(mode: str, folder: Path, *argv) -> subprocess.Popen:
    """The command in a process of its own on the fake model (tests/transcribe_child.py), with Ctrl-C's SIGINT
    handled as in a terminal even where the suite itself runs in the background (where SIGINT is ignored)."""
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "transcribe_child.py"), mode, str(folder),
                             *map(str, argv)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_concurrent_runs_into_one_output_each_keep_their_transcript(tmp_path):
    """a/x.wav and b/x.wav transcribed into one --output by two processes at once, both having chosen their
    output names before either writes: each transcript gets its own file."""
    first, second = write_wav(tmp_path / "a" / "x.wav", seconds=1.0), write_wav(tmp_path / "b" / "x.wav", seconds=2.0)
    out_dir = tmp_path / "out"
    runs = [child("meet", tmp_path, audio, "--output", out_dir) for audio in (first, second)]
    for run_ in runs:
        _, err = run_.communicate(timeout=120)
        assert run_.returncode == 0, err
    assert sorted((out_dir / name).read_text() for name in outputs(out_dir)) == ["16000 samples\n",
                                                                                 "32000 samples\n"]
    for audio in (first, second):  # and each rerun finds its own
        code, model, _, err = run([audio, "--output", out_dir])
        assert code == 0 and model.batches == []


def test_input_replaced_under_its_old_size_and_time_is_transcribed_again(tmp_path, capsys):
    audio = write_wav(tmp_path / "in" / "a.wav", seconds=1.0, seed=0)
    out_dir = tmp_path / "out"
    assert run([audio, "--output", out_dir], capsys=capsys)[0] == 0
    before = audio.stat()
    write_wav(audio, seconds=1.0, seed=1)  # other audio, same size
    os.utime(audio, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert audio.stat().st_size == before.st_size and audio.stat().st_mtime_ns == before.st_mtime_ns
    code, model, _, _ = run([audio, "--output", out_dir], capsys=capsys)
    assert code == 0 and model.windows_seen == [SR]


@pytest.mark.parametrize("options", [["--max-new-tokens", "50"], ["--language", "fr"], ["--task", "translate"],
                                     ["--no-temperature-fallback"], ["--window-seconds", "20"],
                                     ["--dtype", "bfloat16"], ["--base", "other/base"], ["--model", "other/heads"]])
def test_each_option_that_shapes_a_transcript_redoes_it_once(tmp_path, capsys, options):
    audio = write_wav(tmp_path / "a.wav")
    out_dir = tmp_path / "out"
    assert run([audio, "--output", out_dir], capsys=capsys)[0] == 0
    for expected in ([SR], []):  # changed: transcribed again; the same again: up to date
        code, model, _, err = run([audio, "--output", out_dir, *options], capsys=capsys)
        assert code == 0 and model.windows_seen == expected, err
    code, model, _, _ = run([audio, "--output", out_dir, *options, "--no-medusa", "--batch-size", "4"], capsys=capsys)
    assert model.batches == []  # these do not change a transcript


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_write_leaves_complete_recorded_outputs_and_resumes(tmp_path, signal_number):
    files = [write_wav(tmp_path / "in" / f"{n}.wav", seconds=1.0 + i, seed=i) for i, n in enumerate("abc")]
    out_dir = tmp_path / "out"
    stopped = child("stall", tmp_path, *files, "--output", out_dir)
    deadline = time.monotonic() + 60
    while not (tmp_path / "stalled").exists() and stopped.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    stopped.send_signal(signal_number)
    _, err = stopped.communicate(timeout=60)
    assert stopped.returncode == 128 + signal_number
    assert err.splitlines() == [f"interrupted by {signal.Signals(signal_number).name}: 1 done, 0 failed, 0 skipped "
                                "(output up to date); outputs of finished files are kept; rerun the same command to "
                                "resume"]
    assert sorted(p.name for p in out_dir.iterdir()) == [transcribe.RECORDS_FILE, "a.txt"]  # no temporary file
    code, resumed, _, err = run([*files, "--output", out_dir])
    assert code == 0 and resumed.windows_seen == [2 * SR, 3 * SR]
    assert [(out_dir / f"{n}.txt").read_text() for n in "abc"] == [f"{n * SR} samples\n" for n in (1, 2, 3)]


# --------------------------------------------------------------------------- demo and CLI


def test_demo_reports_speed_up(tmp_path, capsys, monkeypatch):
    clip = write_wav(tmp_path / "clip.wav", seconds=3.0)
    monkeypatch.setattr(transcribe, "default_clip_path", lambda: clip)
    code, model, out, _ = run([], capsys=capsys)
    assert code == 0
    assert "Transcript: 48000 samples" in out
    assert re.search(r"Speed-up: \d+\.\d\dx \(medians\)", out)
    assert re.search(r"Time \(Medusa\): \d+\.\d{3} s, median of 3 runs \(\d+\.\d{3}-\d+\.\d{3} s\)", out)
    assert "Mean accepted tokens per round: 2.50" in out
    assert "Token ids identical to plain greedy: yes" in out
    assert len(model.batches) == 2 * transcribe.DEMO_RUNS  # plain and Medusa timed in turn; warm-ups use few tokens


def test_demo_times_in_turn_and_says_when_the_spread_makes_the_speed_up_rough(monkeypatch):
    """One timed run said 2.63x on a quiet machine and 0.94x under load: the demo times each method three times,
    interleaved, and says so when one method's runs differ by over a fifth of their median."""
    calls, clock = [], iter([0.0, 1.0, 1.0, 1.5, 1.5, 2.5, 2.5, 3.0, 3.0, 4.0, 4.0, 4.5]).__next__
    monkeypatch.setattr(transcribe.time, "perf_counter", clock)
    times, results = transcribe._timed_in_turn([lambda: calls.append("plain"), lambda: calls.append("medusa")])
    assert calls == ["plain", "medusa"] * 3 and times == [[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]]
    assert transcribe._spread(times[0]) == 0.0 and transcribe._spread([1.0, 1.0, 1.5]) > transcribe.NOISY_SPREAD


def test_transformers_generate_notices_are_kept_only_with_verbose(tmp_path, capsys):
    """The base's generate logs the same deprecation notices on every call (the demo printed five), and loading a
    model imports libraries that log notices about nothing the command uses (torchao's extensions built for
    another torch): the command keeps their errors only, unless --verbose."""
    import logging

    import transformers

    from tools.runtime import IMPORT_NOTICE_LOGGERS

    before = transformers.logging.get_verbosity()
    loggers = [logging.getLogger(name) for name in IMPORT_NOTICE_LOGGERS]
    levels_before = [logger.level for logger in loggers]
    clip = write_wav(tmp_path / "clip.wav", seconds=2.0)
    try:
        for argv, verbosity, level in (([clip], transformers.logging.ERROR, logging.ERROR),
                                       ([clip, "--verbose"], transformers.logging.WARNING, logging.NOTSET)):
            transformers.logging.set_verbosity_warning()
            for logger in loggers:
                logger.setLevel(logging.NOTSET)
            code, _, _, _ = run(argv, capsys=capsys)
            assert code == 0 and transformers.logging.get_verbosity() == verbosity
            assert [logger.level for logger in loggers] == [level] * len(loggers)
    finally:
        transformers.logging.set_verbosity(before)
        for logger, level in zip(loggers, levels_before):
            logger.setLevel(level)


@pytest.mark.skipif(shutil.which("flite") is None, reason="flite is not installed")
def test_default_clip_is_synthesised_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDUSA_ASR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(transcribe, "BUNDLED_CLIP", "does/not/exist.wav")
    clip = transcribe.default_clip_path()
    assert clip == tmp_path / "cache" / "default_clip.wav"
    assert sf.info(str(clip)).duration > 3.0
    assert transcribe.default_clip_path() == clip


def test_default_model_path_is_the_repositorys_tiny_en_heads():
    assert transcribe.default_model_path() == str(ROOT / "heads" / "whisper-tiny.en")


def test_help_runs_without_model_code():
    result = subprocess.run([sys.executable, "-m", "tools.transcribe", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and "--batch-size" in result.stdout and "--format" in result.stdout


def test_same_token_ids_ignores_trailing_padding():
    a = torch.tensor([[1, 2, 3, 0, 0], [1, 4, 0, 0, 0]])
    b = torch.tensor([[1, 2, 3], [1, 4, 0]])
    assert transcribe.same_token_ids(a, b, {0})
    assert not transcribe.same_token_ids(a, torch.tensor([[1, 2, 3], [1, 5, 0]]), {0})
    assert not transcribe.same_token_ids(a, b)  # no padding ids known: exact comparison
    assert transcribe.padding_token_ids(FakeModel()) == {0}
