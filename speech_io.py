"""What a speech model offers around ``generate``: audio in (``prepare_audio_inputs``), text and segments out, and
what its family can do (timestamps, word times, window lengths). ``MedusaForASR`` takes these from ``SpeechIO``;
each asks the model's backbone."""

from __future__ import annotations

import torch

try:
    from .base_loading import BACKBONES
except ImportError:
    from base_loading import BACKBONES


def _declared(name: str, doc: str) -> property:
    """A model property its family's backbone class declares (known before any base is loaded)."""
    return property(lambda self: getattr(BACKBONES[self.family], name), doc=doc)


class SpeechIO:
    """Audio in, text out, and the family's declared abilities, for a model with ``family``, ``backbone`` and
    ``processor``."""

    default_max_new_tokens = _declared(
        "default_max_new_tokens", "New tokens per window by default in the transcription command, the benchmark and "
        "the model card (``generate`` itself defaults to the base's generation config, as the base's generate does).")

    @property
    def max_audio_seconds(self) -> float:
        return self.backbone.max_audio_seconds

    default_window_seconds = _declared("window_seconds", "Seconds of audio per window in the transcription command.")
    timestamped = _declared("timestamped", "Whether generate(return_timestamps=True, return_segments=True) gives "
                                           "the base's own segments.")
    word_timestamps = _declared("word_timestamps", "Whether generate(return_token_timestamps=True) times the tokens "
                                                   "(the transcription command's word times).")
    temperature_fallback = _declared("temperature_fallback", "Whether the base's generate can retry a window at "
                                                             "higher temperatures (long-form Whisper).")

    def segments(self, output: dict) -> list[list[tuple[float, float, str]]]:
        """Per row, (start seconds, end seconds, text) of each segment of a ``return_segments=True`` output."""
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        return [[(float(s["start"]), float(s["end"]), tokenizer.decode(s["tokens"], skip_special_tokens=True).strip())
                 for s in row] for row in output["segments"]]

    def segment_words(self, output: dict) -> list[list[list[tuple[str, float, float]]]]:
        """Per row and segment (as ``segments``), (word, start seconds, end seconds) of each word of a
        ``return_segments=True, return_token_timestamps=True`` output (Whisper)."""
        if any("token_timestamps" not in s for row in output["segments"] for s in row):
            raise ValueError("segment_words needs the output of generate(..., return_segments=True, "
                             "return_token_timestamps=True)")
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        return [[self.backbone.segment_words(tokenizer, s) for s in row] for row in output["segments"]]

    def check_word_timestamps(self) -> None:
        """ValueError naming the problem when this model cannot time words (Whisper: its alignment heads)."""
        self.backbone.check_word_timestamps()

    @property
    def pad_token_id(self) -> int:
        return self.backbone.pad_token_id

    def check_prompt_options(self, language: str | None = None, task: str | None = None) -> None:
        """ValueError naming the problem when this base cannot take the language or task."""
        self.backbone.check_prompt_options(*self.backbone.effective_prompt_options(language, task))

    def max_new_tokens_limit(self, language: str | None = None, task: str | None = None) -> int | None:
        """The most new tokens one call can ask for with this language/task, or None where this base sets no
        limit here (Whisper: its decoder positions minus the prompt)."""
        return self.backbone.max_new_tokens_limit(*self.backbone.effective_prompt_options(language, task))

    def prepare_audio_inputs(self, audios, sampling_rate: int = 16000, instruction: str | None = None,
                             language: str | None = None, task: str | None = None,
                             return_attention_mask: bool = False):
        """A batch of 16 kHz mono float arrays -> the base's generate inputs. ``language`` and ``task``
        (multilingual Whisper only; default: the model's own, i.e. detect the language and transcribe)
        are carried in the inputs; ``instruction`` is MERaLiON-2's prompt. Whisper audio over 30 s is kept
        whole: generate then transcribes it the way the base's long-form generate does.
        ``return_attention_mask``: Whisper's mask of each row's audio frames also for short audio (what
        ``return_token_timestamps`` needs to align tokens with the speech rather than the padding)."""
        if self.processor is None:
            raise ValueError("This model was loaded without a processor; pass processor= to from_pretrained.")
        if sampling_rate != 16000:
            raise ValueError(f"Audio must be 16 kHz (got {sampling_rate} Hz); resample it first.")
        self.check_prompt_options(language, task)
        language, task = self.backbone.effective_prompt_options(language, task)
        return self.backbone.audio_inputs(self.processor, list(audios), instruction, language, task,
                                          return_attention_mask)

    def decode_text(self, sequences: torch.Tensor, inputs: dict | None = None) -> list[str]:
        return self.backbone.decode_text(getattr(self.processor, "tokenizer", self.processor), sequences, inputs)
