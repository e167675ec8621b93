"""Long-audio probe for the transcription command (issue 53): long recordings of known sentences (flite's voices
taking turns, ``tools.long_recording``), clean, under pink noise at 10 dB SNR and under music-like chords, then
a check of the command's srt/json output against the sentences.

    python -m tools.long_audio_probe make OUT 1200          # OUT/{clean,pink,music}_20min.wav + sentences
    nice -n 10 /usr/bin/time -v python -m tools.transcribe OUT/clean_20min.wav --format srt --output OUT/srt
    python -m tools.long_audio_probe check OUT/sentences_20min.json OUT/srt/clean_20min.srt

The check reports sentences with under 60% of their words in the cues or segments within 3 s of them (dropped
speech), whether the last sentence's last words are there, cues over 42 characters x 2 lines x 7 s and times that
go backwards."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

from tools import cli_args

from tools import long_recording as material

SAMPLE_RATE, SNR_DB, NEAR_SECONDS, KEPT_SHARE = 16000, 10.0, 3.0, 0.6
LINE_CHARS, LINES, CUE_SECONDS = 42, 2, 7.0


def make(out: Path, seconds: float) -> None:
    (out / "pieces").mkdir(parents=True, exist_ok=True)
    audio, sentences = material.long_recording_with_sentences(out / "pieces", seconds)
    name = f"{int(seconds // 60)}min"
    t = np.arange(len(audio)) / SAMPLE_RATE
    chords = sum(0.02 * np.sin(2 * np.pi * f * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 0.25 * t + i))
                 for i, f in enumerate((220.0, 277.2, 329.6, 440.0)))
    sf.write(out / f"clean_{name}.wav", audio, SAMPLE_RATE)
    sf.write(out / f"pink_{name}.wav", material.with_noise(audio, SNR_DB), SAMPLE_RATE)
    sf.write(out / f"music_{name}.wav", (audio + chords).astype(np.float32), SAMPLE_RATE)
    (out / f"sentences_{name}.json").write_text(json.dumps([list(s) for s in sentences]))


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower().replace("’", "'"))


def seconds_of(stamp: str) -> float:
    hours, minutes, secs = stamp.strip().replace(",", ".").split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(secs)


def spans_and_problems(output: Path) -> tuple[list[tuple[float, float, str]], list[str]]:
    """(start, end, text) of each cue (srt) or segment (json), and what breaks the limits or the time order."""
    problems, spans = [], []
    if output.suffix == ".srt":
        for block in output.read_text().strip().split("\n\n"):
            lines = block.split("\n")
            start, end = (seconds_of(stamp) for stamp in lines[1].split("-->"))
            text_lines = lines[2:]
            if len(text_lines) > LINES or any(len(line) > LINE_CHARS for line in text_lines) \
                    or end - start > CUE_SECONDS + 1e-6:
                problems.append(f"cue {lines[0]} over the limits: {start:.2f}-{end:.2f} {text_lines}")
            spans.append((start, end, " ".join(text_lines)))
    else:
        spans = [(s["start"], s["end"], s["text"]) for s in json.loads(output.read_text())["segments"]]
    for before, after in zip(spans, spans[1:]):
        if after[0] < before[1] - 1e-6 or after[1] < after[0]:
            problems.append(f"times go backwards: {before[:2]} then {after[:2]}")
    return spans, problems


def check(sentences_file: Path, output: Path) -> int:
    sentences = json.loads(sentences_file.read_text())
    spans, problems = spans_and_problems(output)
    dropped = []
    for text, first, end in sentences:
        start_s, end_s = first / SAMPLE_RATE, end / SAMPLE_RATE
        near = {w for s, e, t in spans if e >= start_s - NEAR_SECONDS and s <= end_s + NEAR_SECONDS for w in words(t)}
        found = sum(word in near for word in words(text))
        if found < KEPT_SHARE * len(words(text)):
            dropped.append(f"{start_s:.1f}-{end_s:.1f} s: {found}/{len(words(text))} words: {text[:60]}")
    last = words(sentences[-1][0])[-3:]
    tail = {w for _, _, t in spans[-4:] for w in words(t)}
    last_there = all(word in tail for word in last)
    print(f"{output}: {len(spans)} cues/segments for {len(sentences)} sentences; {len(dropped)} sentences dropped; "
          f"last words {' '.join(last)!r} {'present' if last_there else 'MISSING'}; {len(problems)} cue/time "
          f"problems; last cue ends at {spans[-1][1]:.1f} s of {sentences[-1][2] / SAMPLE_RATE:.1f} s")
    for line in dropped + problems:
        print("  ", line)
    return 0 if last_there and not dropped and not problems else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.long_audio_probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)
    made = steps.add_parser("make", help="write the long recordings and their sentences")
    made.add_argument("out", type=Path)
    made.add_argument("seconds", type=cli_args.positive_float)
    checked = steps.add_parser("check", help="check a transcript (srt or json) against the sentences")
    checked.add_argument("sentences", type=Path)
    checked.add_argument("output", type=Path)
    args = parser.parse_args(argv)
    if args.step == "make":
        make(args.out, args.seconds)
        return 0
    return check(args.sentences, args.output)


if __name__ == "__main__":
    sys.exit(main())
