"""One loaded model transcribing batches of decoded audio: what a Ray Data actor (``tools.bulk``) and a Ray Serve
replica (``tools.serve``) each hold once. It drives ``tools.transcribe``'s ``Transcriber`` the way the
single-process command does (whole files through the model's own long-form windows where it times its segments,
windows cut at pauses otherwise; the same decode options), so a transcript here is the command's transcript.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from tools import audio_io, runtime, transcribe
from tools.audio_io import Segment


@dataclass(frozen=True)
class ModelOptions:
    """What is loaded once per actor or replica."""

    model: str = field(default_factory=transcribe.default_model_path)
    base: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    medusa: bool = True


@dataclass(frozen=True)
class DecodeOptions:
    """What shapes a transcript besides the audio; one batched ``generate`` takes one set of these."""

    language: str | None = None
    task: str | None = None
    prompt: str | None = None
    word_timestamps: bool = False
    temperature: float | None = None  # None or 0: greedy (Whisper: with its fallback); > 0: the base samples
    temperature_fallback: bool | None = None  # None: the model's default (on for Whisper)
    max_new_tokens: int | None = None

    def prompt_options(self) -> dict:
        return {k: v for k, v in (("language", self.language), ("task", self.task)) if v}


@dataclass
class Result:
    """One recording's transcript (or why there is none)."""

    text: str = ""
    segments: list[Segment] = field(default_factory=list)
    language: str | None = None
    draft: str | None = None  # the draft tree Medusa ran; None where the base decoded alone
    decode_seconds: float = 0.0
    error: str | None = None

    def segment_rows(self, words: bool) -> list[dict]:
        """Segments as JSON-ready rows, rounded as the command's JSON output rounds them."""
        rows = []
        for s in self.segments:
            row = {"start": round(s.start, 3), "end": round(s.end, 3), "text": s.text}
            if words:
                row["words"] = [{"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)} for w in s.words]
            rows.append(row)
        return rows


class _RecordingTranscriber(transcribe.Transcriber):
    """The command's ``Transcriber``, keeping the last call's output and stats (language, draft)."""

    last_output = None
    last_stats: dict = {}

    def generate(self, inputs, use_medusa=None, max_new_tokens=None, **options):
        sequences, stats = super().generate(inputs, use_medusa, max_new_tokens, **options)
        self.last_output, self.last_stats = sequences, stats
        return sequences, stats


class SpeechBatcher:
    """Loads the artifact once; ``transcribe(audios, options)`` decodes a batch of 16 kHz mono arrays."""

    def __init__(self, options: ModelOptions, batch_size: int = 8):
        import torch

        if options.threads:
            torch.set_num_threads(options.threads)
        runtime.quiet_generate_notices(False)
        self.options = options
        self.batch_size = batch_size
        device = runtime.resolve_device(options.device)
        self.model = transcribe.load_model(options.model, device, runtime.resolve_dtype(options.dtype, device),
                                           base=options.base)
        self.model_name = options.model
        self.whole_files = bool(getattr(self.model, "timestamped", False))  # Whisper windows and times them itself
        self.max_seconds = float(getattr(self.model, "default_window_seconds", None) or self.model.max_audio_seconds)

    # -- options

    def check(self, options: DecodeOptions) -> DecodeOptions:
        """``options`` with the model's defaults filled in; ValueError with one line naming a problem."""
        model = self.model
        if options.word_timestamps:
            if not model.word_timestamps:
                raise ValueError(f"word timestamps need Whisper's alignment heads; this is a {model.family} model")
            model.check_word_timestamps()
        if options.temperature is not None and not 0 <= options.temperature <= 1:
            raise ValueError(f"temperature {options.temperature:g} is outside 0-1")
        if options.prompt and model.family != "whisper":
            raise ValueError(f"a prompt is Whisper's; this is a {model.family} model")
        prompt_options = options.prompt_options()
        if prompt_options:
            model.check_prompt_options(**prompt_options)
        fallback = options.temperature_fallback
        if fallback is None:
            fallback = bool(model.temperature_fallback)
        elif fallback and not model.temperature_fallback:
            raise ValueError(f"temperature fallback is Whisper's long-form option; this is a {model.family} model")
        budget = transcribe.window_token_budget(model, options.max_new_tokens, prompt_options)
        return DecodeOptions(**{**asdict(options), "temperature_fallback": fallback, "max_new_tokens": budget})

    def settings(self, options: DecodeOptions) -> dict:
        """What shapes a transcript, as the command records it (``transcribe.transcript_settings``)."""
        from argparse import Namespace

        args = Namespace(base=self.options.base, dtype=self.options.dtype, format="json", vad=False,
                         temperature_fallback=options.temperature_fallback, word_timestamps=options.word_timestamps,
                         window_seconds=None)
        settings = transcribe.transcript_settings(args, self.model_name, self._transcriber(options))
        settings.pop("format")
        extra = {"prompt": options.prompt, "temperature": options.temperature or None}
        return {**settings, **{k: v for k, v in extra.items() if v is not None}}

    def _transcriber(self, options: DecodeOptions) -> _RecordingTranscriber:
        decode_options = dict(transcribe.WHISPER_FALLBACK) if options.temperature_fallback else {}
        if options.temperature:
            decode_options = {"temperature": options.temperature, "do_sample": True}
        if options.prompt:
            tokenizer = getattr(self.model.processor, "tokenizer", self.model.processor)
            decode_options["prompt_ids"] = runtime.to_model({"ids": tokenizer.get_prompt_ids(
                options.prompt, return_tensors="pt")}, self.model)["ids"]
        return _RecordingTranscriber(self.model, options.max_new_tokens, self.options.medusa,
                                     prompt_options=options.prompt_options(), decode_options=decode_options,
                                     word_timestamps=options.word_timestamps)

    # -- transcribing

    def transcribe(self, audios: list[np.ndarray], options: DecodeOptions) -> list[Result]:
        """One result per array (already checked ``options``); a silent array gets an empty transcript, a batch the
        model fails on an error in each of its results."""
        results = [Result() for _ in audios]
        transcriber = self._transcriber(options)
        if self.whole_files:  # a batch holds one kind, as in the command: a long recording decodes otherwise
            for long_form in (False, True):
                rows = [i for i, a in enumerate(audios) if not audio_io.is_silent(a)
                        and (len(a) > self.max_seconds * audio_io.TARGET_SAMPLE_RATE) == long_form]
                for start in range(0, len(rows), self.batch_size):
                    self._whole_files(transcriber, audios, results, rows[start:start + self.batch_size])
        else:
            self._windows(transcriber, audios, results)
        return results

    def _whole_files(self, transcriber, audios, results, rows: list[int]) -> None:
        started = time.perf_counter()
        try:
            found = transcriber.transcribe_segments([audios[i] for i in rows])
            languages = self._languages(transcriber.last_output, len(rows))
        except Exception as error:  # noqa: BLE001 - one batch's failure is its files' error, not the run's end
            return self._fail(results, rows, error)
        seconds = (time.perf_counter() - started) / len(rows)
        for i, segments, language in zip(rows, found, languages):
            results[i] = Result(" ".join(s.text for s in segments if s.text), segments, language,
                                transcriber.last_stats.get("draft"), seconds)

    def _windows(self, transcriber, audios, results) -> None:
        """Windows cut at pauses (``audio_io.pause_windows``), batched across files; a file's text joins them."""
        windows = [audio_io.pause_windows(a, self.max_seconds) for a in audios]
        tasks = [(i, w) for i, file_windows in enumerate(windows) for w in file_windows]
        texts: dict[tuple[int, int], str] = {}
        for start in range(0, len(tasks), self.batch_size):
            chunk = tasks[start:start + self.batch_size]
            pieces = [audios[i][w.start:w.end] for i, w in chunk]
            loud = [p for p in pieces if not audio_io.is_silent(p)]  # a silent window says nothing
            started = time.perf_counter()
            try:
                decoded = iter(transcriber.transcribe(loud) if loud else [])
            except Exception as error:  # noqa: BLE001 - one batch's failure is its files' error, not the run's end
                self._fail(results, sorted({i for i, _ in chunk}), error)
                continue
            seconds = time.perf_counter() - started
            for (i, w), piece in zip(chunk, pieces):
                texts[i, w.start] = "" if audio_io.is_silent(piece) else next(decoded)
                results[i].decode_seconds += seconds / len(chunk)
                results[i].draft = transcriber.last_stats.get("draft")
        for i, file_windows in enumerate(windows):
            if results[i].error is None:
                results[i].segments = [Segment(w.start_seconds, w.end_seconds, texts[i, w.start])
                                       for w in file_windows]
                results[i].text = " ".join(s.text for s in results[i].segments if s.text)

    def _languages(self, output, rows: int) -> list[str | None]:
        """Per row, the language (its name, as OpenAI's verbose_json gives it) its first window was decoded in;
        English for an English-only Whisper."""
        language_of = getattr(self.model.backbone, "_window_language", None)
        if language_of is None or not isinstance(output, dict):
            return [None] * rows
        if not getattr(self.model.backbone.gen, "lang_to_id", None):
            return ["english"] * rows
        return [language_of(row[0]) if row else None for row in output["segments"]]

    @staticmethod
    def _fail(results, rows, error) -> None:
        message = f"model failed on this audio ({' '.join(f'{type(error).__name__}: {error}'.split())})"
        for i in rows:
            results[i] = Result(error=message)
