"""Audio input/output for the transcription command (``tools/transcribe.py``).

Everything here is model-agnostic:

* finding audio files from command-line specs (files, folders, globs);
* decoding WAV/FLAC/MP3/OGG/Opus/AIFF with soundfile (libsndfile) and M4A/AAC/MP4/WebM/MKV/MOV/AVI with PyAV,
  down-mixing to mono and resampling to 16 kHz with soxr;
* splitting long audio into windows, cut at a quiet point near each boundary;
* rendering transcripts as txt/json/srt/vtt (``tools.files`` writes them atomically).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

TARGET_SAMPLE_RATE = 16_000

# Decoded by libsndfile first (PyAV is the fallback), or by PyAV only.
SOUNDFILE_EXTENSIONS = frozenset({".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".aiff", ".aif"})
PYAV_EXTENSIONS = frozenset({".m4a", ".aac", ".mp4", ".webm", ".mkv", ".mov", ".avi"})  # audio tracks of videos too
SUPPORTED_EXTENSIONS = SOUNDFILE_EXTENSIONS | PYAV_EXTENSIONS

SILENCE_PEAK = 1e-4  # about -80 dBFS: below a 16-bit LSB of dither, i.e. "all samples ~0"
OUTPUT_FORMATS = ("txt", "json", "srt", "vtt")
_GLOB_CHARS = frozenset("*?[")


class AudioError(Exception):
    """A problem with one input file; ``str()`` is a one-line ``"<path>: <problem>"``."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


# --------------------------------------------------------------------------- finding inputs


@dataclass(frozen=True)
class AudioSource:
    """One input file. ``key`` is its path relative to the common folder of all inputs."""

    path: Path
    key: str


def find_audio_files(specs: list[str]) -> tuple[list[AudioSource], list[AudioError]]:
    """Expand files, folders (recursively) and glob patterns into audio sources.

    Explicitly named files are kept whatever their extension (an unsupported one is
    reported when loaded); folders and globs contribute only supported extensions.
    Specs that match nothing come back as errors. Duplicates are dropped, order is kept.
    """
    found: list[Path] = []
    errors: list[AudioError] = []
    for spec in specs:
        paths, error = _expand_spec(spec)
        found.extend(paths)
        if error is not None:
            errors.append(error)
    unique = list(dict.fromkeys(p.resolve() for p in found))
    return _with_relative_keys(unique), errors


def _expand_spec(spec: str) -> tuple[list[Path], AudioError | None]:
    path = Path(spec).expanduser()
    if path.is_file():
        return [path], None
    if path.is_dir():
        files = _audio_files_under(path)
        return files, None if files else AudioError(spec, "folder contains no supported audio files")
    if _GLOB_CHARS & set(spec):
        files = _expand_glob(str(path))
        return files, None if files else AudioError(spec, "pattern matches no supported audio files")
    return [], AudioError(spec, "no such file or folder")


def _expand_glob(pattern: str) -> list[Path]:
    files: list[Path] = []
    for match in sorted(glob.glob(pattern, recursive=True)):
        match_path = Path(match)
        if match_path.is_dir():
            files.extend(_audio_files_under(match_path))
        elif _is_supported(match_path):
            files.append(match_path)
    return files


def _audio_files_under(folder: Path) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files.extend(Path(root, n) for n in names if not n.startswith(".") and _is_supported(Path(n)))
    return sorted(files)


def _is_supported(path: Path) -> bool:
    return path.suffix.lower() in SUPPORTED_EXTENSIONS


def _with_relative_keys(paths: list[Path]) -> list[AudioSource]:
    if not paths:
        return []
    common = Path(os.path.commonpath([str(p.parent) for p in paths]))
    return [AudioSource(path=p, key=p.relative_to(common).as_posix()) for p in paths]


def output_names(sources: list[AudioSource], extension: str) -> dict[AudioSource, str]:
    """One output file name per source: ``<stem>.<ext>``, disambiguated when stems clash.

    Clashing stems fall back to the relative path with ``/`` turned into ``__``
    (``a/x.wav`` -> ``a__x.txt``), then to that path with its audio suffix kept
    (``x.wav`` / ``x.mp3`` -> ``x.wav.txt`` / ``x.mp3.txt``).
    """
    candidates = [
        lambda s: Path(s.key).stem,
        lambda s: Path(s.key).with_suffix("").as_posix().replace("/", "__"),
        lambda s: s.key.replace("/", "__"),
    ]
    names: dict[AudioSource, str] = {}
    pending = list(sources)
    for make_name in candidates:
        counts: dict[str, int] = {}
        for source in pending:
            counts[make_name(source)] = counts.get(make_name(source), 0) + 1
        clashing = []
        for source in pending:
            if counts[make_name(source)] == 1 or make_name is candidates[-1]:
                names[source] = make_name(source)
            else:
                clashing.append(source)
        pending = clashing
    return _make_unique({s: f"{n}.{extension}" for s, n in names.items()})


def _make_unique(names: dict[AudioSource, str]) -> dict[AudioSource, str]:
    """Guard against the last rare clashes (e.g. a file literally named ``a__x.wav``)."""
    taken: set[str] = set()
    unique = {}
    for source, name in names.items():
        unique[source] = unused_name(name, lambda candidate: candidate.lower() in taken)
        taken.add(unique[source].lower())
    return unique


def unused_name(name: str, is_used) -> str:
    """``name``, else ``stem-1.ext``, ``stem-2.ext``, ... : the first that ``is_used`` does not claim."""
    candidate, n = name, 1
    while is_used(candidate):
        stem, dot, ext = name.rpartition(".")
        candidate, n = f"{stem}-{n}{dot}{ext}", n + 1
    return candidate


# --------------------------------------------------------------------------- decoding


def load_audio(path: str | os.PathLike, sample_rate: int = TARGET_SAMPLE_RATE) -> np.ndarray:
    """Decode a file to mono float32 at ``sample_rate``; raise :class:`AudioError` if unusable."""
    path = Path(path)
    extension = path.suffix.lower()
    if extension not in SUPPORTED_EXTENSIONS:
        supported = ", ".join(sorted(SUPPORTED_EXTENSIONS))
        raise AudioError(path, f"unsupported format {extension or '(no extension)'!r} (supported: {supported})")
    try:
        size = path.stat().st_size
    except OSError as error:
        raise AudioError(path, f"cannot read file ({error.strerror or error})") from error
    if size == 0:
        raise AudioError(path, "empty file (0 bytes)")
    samples, source_rate = _decode(path, extension)
    if samples.shape[0] == 0:
        raise AudioError(path, "zero-length audio (no samples)")
    if not np.all(np.isfinite(samples)):
        raise AudioError(path, "corrupt audio (contains NaN or infinite samples)")
    return resample_mono(samples, source_rate, sample_rate)


def _decode(path: Path, extension: str) -> tuple[np.ndarray, int]:
    """Return ``(samples[frames, channels], rate)`` using the decoder suited to the extension."""
    if extension in PYAV_EXTENSIONS:
        return _decode_with_pyav(path)
    try:
        return _decode_with_soundfile(path)
    except AudioError as soundfile_error:
        try:
            samples, rate = _decode_with_pyav(path)
        except AudioError:
            raise soundfile_error from None
        if samples.shape[0] == 0:  # FFmpeg "probed" garbage into an empty stream
            raise soundfile_error from None
        return samples, rate


def _decode_with_soundfile(path: Path) -> tuple[np.ndarray, int]:
    try:
        samples, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, ValueError) as error:
        reason = str(error).split(": ", 1)[-1].strip() or type(error).__name__
        raise AudioError(path, f"cannot decode audio, file is corrupt or not {path.suffix} ({reason})") from error
    return samples, int(rate)


def _decode_with_pyav(path: Path) -> tuple[np.ndarray, int]:
    try:
        import av
    except ImportError as error:
        raise AudioError(path, "decoding this format needs PyAV: pip install av") from error
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise AudioError(path, "file has no audio stream")
            return _decode_audio_stream(av, container)
    except AudioError:
        raise
    except Exception as error:  # PyAV raises many FFmpeg error types; all mean "cannot decode"
        reason = getattr(error, "strerror", None) or str(error).strip() or type(error).__name__
        raise AudioError(path, f"cannot decode audio, file is corrupt or not {path.suffix} ({reason})") from error


def _decode_audio_stream(av, container) -> tuple[np.ndarray, int]:
    stream = container.streams.audio[0]
    # Planar float keeps every channel as its own row; rate and layout are left unchanged.
    to_planar_float = av.AudioResampler(format="fltp")
    chunks = []
    rate = stream.codec_context.sample_rate or stream.rate
    for frame in container.decode(stream):
        rate = frame.sample_rate or rate
        chunks.extend(f.to_ndarray() for f in to_planar_float.resample(frame))
    chunks.extend(f.to_ndarray() for f in to_planar_float.resample(None))
    if not chunks:
        return np.zeros((0, 1), dtype=np.float32), int(rate or TARGET_SAMPLE_RATE)
    return np.concatenate(chunks, axis=1).T.astype(np.float32, copy=False), int(rate)


def resample_mono(samples: np.ndarray, source_rate: int, target_rate: int = TARGET_SAMPLE_RATE) -> np.ndarray:
    """Average channels (``samples`` is ``[frames]`` or ``[frames, channels]``) and resample with soxr."""
    mono = samples.mean(axis=1) if samples.ndim == 2 else samples
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if source_rate != target_rate:
        mono = soxr.resample(mono, source_rate, target_rate, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


def is_silent(samples: np.ndarray, peak: float = SILENCE_PEAK) -> bool:
    """True when every sample is ~0 (absolute peak below ``peak``)."""
    return samples.size == 0 or float(np.max(np.abs(samples))) < peak


def duration_seconds(samples: np.ndarray, sample_rate: int = TARGET_SAMPLE_RATE) -> float:
    return samples.shape[0] / sample_rate


# --------------------------------------------------------------------------- windowing


@dataclass(frozen=True)
class Window:
    """Half-open sample range ``[start, end)`` of a file at ``sample_rate``."""

    start: int
    end: int
    sample_rate: int = TARGET_SAMPLE_RATE

    @property
    def start_seconds(self) -> float:
        return self.start / self.sample_rate

    @property
    def end_seconds(self) -> float:
        return self.end / self.sample_rate

    @property
    def num_samples(self) -> int:
        return self.end - self.start


def plan_windows(
    samples: np.ndarray,
    max_seconds: float,
    sample_rate: int = TARGET_SAMPLE_RATE,
    search_seconds: float = 2.0,
    frame_seconds: float = 0.02,
    quiet_ratio: float = 0.1,
) -> list[Window]:
    """Split audio into contiguous windows of at most ``max_seconds`` that cover every sample.

    Each cut is moved to the quietest short frame within the last ``search_seconds`` before
    the hard limit, provided that frame is "quiet" (RMS at most ``quiet_ratio`` times the RMS
    of the window so far); otherwise the window is cut at the limit.
    """
    total = int(samples.shape[0])
    max_len = int(max_seconds * sample_rate)
    if max_len <= 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")
    windows, start = [], 0
    while total - start > max_len:
        end = _quiet_cut(samples, start, start + max_len, sample_rate, search_seconds, frame_seconds, quiet_ratio)
        windows.append(Window(start, end, sample_rate))
        start = end
    windows.append(Window(start, total, sample_rate))
    return windows


def _quiet_cut(samples, start, limit, sample_rate, search_seconds, frame_seconds, quiet_ratio) -> int:
    frame = max(1, int(frame_seconds * sample_rate))
    search_start = max(start + frame, limit - int(search_seconds * sample_rate))
    n_frames = (limit - search_start) // frame
    if n_frames < 1:
        return limit
    region = samples[limit - n_frames * frame : limit].astype(np.float64).reshape(n_frames, frame)
    frame_rms = np.sqrt(np.mean(region**2, axis=1))
    window_rms = float(np.sqrt(np.mean(samples[start:limit].astype(np.float64) ** 2)))
    quietest = n_frames - 1 - int(np.argmin(frame_rms[::-1]))  # the latest of equally quiet frames
    if frame_rms[quietest] > quiet_ratio * window_rms:
        return limit
    return limit - (n_frames - quietest) * frame + frame // 2  # middle of the quiet frame


def windows_in_regions(samples: np.ndarray, regions: list[tuple[int, int]], max_seconds: float,
                       sample_rate: int = TARGET_SAMPLE_RATE) -> list[Window]:
    """Windows of at most ``max_seconds`` that cover the speech ``regions`` only: neighbouring regions share
    a window while they fit (cut in the pause between them), a longer region is split at quiet points."""
    max_len = int(max_seconds * sample_rate)
    windows: list[Window] = []
    for start, end in regions:
        if windows and end - windows[-1].start <= max_len:
            windows[-1] = Window(windows[-1].start, end, sample_rate)
        else:
            windows += [Window(start + w.start, start + w.end, sample_rate)
                        for w in plan_windows(samples[start:end], max_seconds, sample_rate)]
    return windows


# --------------------------------------------------------------------------- voice activity

# faster-whisper's vad_filter defaults: speech padded by 0.4 s, pauses under 2 s kept inside a region.
VAD_PAD_MS, VAD_MIN_SILENCE_MS = 400, 2000
VAD_SPLIT_MARGIN_SECONDS = 0.5  # a region split to fit a window stays this far under it
VAD_FRAME, VAD_PAUSE_FRAMES = 512, 5  # Silero's frame (32 ms at 16 kHz); a pause is judged over 160 ms
_VAD_MODEL = []


def speech_regions(samples: np.ndarray, sample_rate: int = TARGET_SAMPLE_RATE,
                   max_seconds: float | None = None) -> list[tuple[int, int]]:
    """Sample ranges ``[start, end)`` that hold speech, found by Silero VAD (the optional silero-vad package,
    whose model ships in its wheel). With ``max_seconds``, a longer region is split where Silero is least sure
    of speech (``split_at_pauses``), so that each part fits ``max_seconds``."""
    model, audio = _silero(), _as_tensor(samples)  # (first: says how to install silero-vad where it is missing)
    from silero_vad import get_speech_timestamps

    found = get_speech_timestamps(audio, model, sampling_rate=sample_rate, speech_pad_ms=VAD_PAD_MS,
                                  min_silence_duration_ms=VAD_MIN_SILENCE_MS)
    regions = [(int(r["start"]), int(r["end"])) for r in found]
    limit = None if max_seconds is None else int((max_seconds - VAD_SPLIT_MARGIN_SECONDS) * sample_rate)
    if limit is None or all(end - start <= limit for start, end in regions):
        return regions
    scores = pause_scores(samples, sample_rate)
    return [part for region in regions for part in split_at_pauses(region, scores, limit)]


def pause_windows(samples: np.ndarray, max_seconds: float, sample_rate: int = TARGET_SAMPLE_RATE) -> list[Window]:
    """Contiguous windows of at most ``max_seconds`` that cover every sample, each cut at a pause of the speech
    (``split_at_pauses`` over Silero's speech probability: a pause between sentences or words even under noise or
    music, where energy finds no quiet point); with silero-vad not installed, at energy's quiet points
    (``plan_windows``)."""
    total, max_len = int(samples.shape[0]), int(max_seconds * sample_rate)
    if total <= max_len:
        return [Window(0, total, sample_rate)]
    try:
        scores = pause_scores(samples, sample_rate)
    except ImportError:
        return plan_windows(samples, max_seconds, sample_rate)
    return [Window(start, end, sample_rate) for start, end in split_at_pauses((0, total), scores, max_len)]


def pause_scores(samples: np.ndarray, sample_rate: int = TARGET_SAMPLE_RATE) -> np.ndarray:
    """Silero's speech probability per ``VAD_FRAME`` samples, averaged over ``VAD_PAUSE_FRAMES`` frames."""
    import torch

    with torch.no_grad():
        probabilities = _silero().audio_forward(_as_tensor(samples), sample_rate)[0].numpy()
    return np.convolve(probabilities, np.ones(VAD_PAUSE_FRAMES) / VAD_PAUSE_FRAMES, mode="same")


def _silero():
    """Silero VAD's model (loaded once; its weights ship in the silero-vad wheel)."""
    try:
        from silero_vad import load_silero_vad
    except ImportError as error:
        raise ImportError("voice-activity detection needs silero-vad: pip install silero-vad") from error
    if not _VAD_MODEL:
        _VAD_MODEL.append(load_silero_vad())
    return _VAD_MODEL[0]


def _as_tensor(samples: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))


def split_at_pauses(region: tuple[int, int], pause_scores: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """``region`` cut into parts of at most ``limit`` samples, each cut in the second half of the allowed span
    at the frame of lowest ``pause_scores`` (Silero's speech probability per frame, averaged over
    ``VAD_PAUSE_FRAMES``): the pause between two sentences, or at least between two words, even under
    continuous noise or music, where no point is quiet by energy and Silero's own thresholds may see no
    silence at all."""
    start, end = region
    parts = []
    while end - start > limit:
        first, last = (start + limit // 2) // VAD_FRAME, (start + limit) // VAD_FRAME  # candidate frames
        cut = (first + int(np.argmin(pause_scores[first:last]))) * VAD_FRAME + VAD_FRAME // 2
        parts.append((start, cut))
        start = cut
    return parts + [(start, end)]


# --------------------------------------------------------------------------- rendering


@dataclass(frozen=True)
class Word:
    word: str
    start: float
    end: float


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()  # with word timestamps (Whisper)

    def shifted(self, seconds: float) -> "Segment":
        """The segment ``seconds`` later (a window's segment in the file's own times)."""
        words = tuple(Word(w.word, w.start + seconds, w.end + seconds) for w in self.words)
        return Segment(self.start + seconds, self.end + seconds, self.text, words)


def format_timestamp(seconds: float, decimal_marker: str = ",") -> str:
    """``HH:MM:SS,mmm`` (SRT) or, with ``decimal_marker="."``, ``HH:MM:SS.mmm`` (VTT)."""
    total_ms = max(0, int(round(seconds * 1000)))
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{millis:03d}"


def _cue_text(text: str) -> str:
    """One line, never a blank line or an arrow that would end the cue early."""
    return " ".join(text.split()).replace("-->", "->")


# Subtitle conventions (e.g. Netflix's and the BBC's guidelines): short lines, at most two on screen, a few
# seconds each.
CUE_LINE_CHARS, CUE_LINES, CUE_SECONDS = 42, 2, 7.0


def subtitle_cues(segments: list[Segment], line_chars: int = CUE_LINE_CHARS, lines: int = CUE_LINES,
                  max_seconds: float = CUE_SECONDS) -> list[Segment]:
    """Segments as subtitle cues: a segment's words shared out into as few cues as hold at most ``lines`` lines of
    ``line_chars`` characters and ``max_seconds`` each, the cues as even in length as the words allow, and so each
    cue's lines (no cue of one stray word after a full one). A cue runs from its first word's start to its last
    word's end: the words' own times where the segment has them (word timestamps) and they give every cue some
    time on screen, else the segment's time shared out by characters. A cue's text holds its lines separated by
    newlines."""
    cues = []
    for segment in segments:
        timed = _segment_cues(_aligned_words(segment, line_chars), line_chars, lines, max_seconds)
        if not timed or any(cue.end <= cue.start for cue in timed):
            timed = _segment_cues(_words_timed_by_characters(segment, line_chars), line_chars, lines, max_seconds)
        cues += timed
    return cues


def _segment_cues(words: list[Word], line_chars: int, lines: int, max_seconds: float) -> list[Segment]:
    cues = []
    for group in _cue_groups(words, line_chars, lines, max_seconds) if words else []:
        text = "\n".join(" ".join(w.word for w in line)
                         for line in _natural_parts(group, _lines(group, line_chars), line_chars))
        start = group[0].start
        cues.append(Segment(start, min(group[-1].end, start + max_seconds), text))
    return cues


def _aligned_words(segment: Segment, width: int) -> list[Word]:
    """Each word's own time (its pieces share it by characters), held inside the segment and in order; none where
    the words are not the text's own words between spaces (languages written without spaces: the words are
    characters, which a cue must not space out)."""
    if _cue_text(" ".join(word.word for word in segment.words)).split() != _cue_text(segment.text).split():
        return []
    words, latest = [], segment.start
    for word in segment.words:
        pieces = [piece for part in _cue_text(word.word).split() for piece in _pieces(part, width)]
        share = max(word.end - word.start, 0.0) / max(sum(len(piece) for piece in pieces), 1)
        done = 0
        for piece in pieces:
            start = min(max(word.start + done * share, latest), segment.end)
            done += len(piece)
            latest = min(max(word.start + done * share, start), segment.end)
            words.append(Word(piece, start, latest))
    return words


def _words_timed_by_characters(segment: Segment, width: int) -> list[Word]:
    """The segment's time shared out by characters, each word's trailing space its own."""
    pieces = [piece for word in _cue_text(segment.text).split() for piece in _pieces(word, width)]
    per_char = max(segment.end - segment.start, 0.0) / (len(" ".join(pieces)) + 1)  # (+1: the last space)
    words, done = [], 0
    for piece in pieces:
        words.append(Word(piece, segment.start + done * per_char, segment.start + (done + len(piece) + 1) * per_char))
        done += len(piece) + 1
    return words


def _pieces(word: str, width: int) -> list[str]:
    return [word[i:i + width] for i in range(0, len(word), width)]


def _wrap(words: list[str], width: int) -> list[str]:
    """Greedy line filling: the fewest lines of at most ``width`` characters (each word fits a line)."""
    lines = []
    for word in words:
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _lines(words: list[Word], width: int) -> int:
    """How many lines of at most ``width`` characters the words need."""
    return len(_wrap([w.word for w in words], width))


def _cue_groups(words: list[Word], line_chars: int, lines: int, max_seconds: float) -> list[list[Word]]:
    """The words in the fewest even groups that each wrap into at most ``lines`` lines and last at most
    ``max_seconds`` (one word a group where even that is too long: its cue is cut short)."""
    def fits(group):
        return _lines(group, line_chars) <= lines and group[-1].end - group[0].start <= max_seconds

    fewest = max(-(-_lines(words, line_chars) // lines),
                 int(-(-(words[-1].end - words[0].start) // max_seconds)), 1)
    for parts in range(min(fewest, len(words)), len(words) + 1):
        for groups in (_natural_parts(words, parts), _even_parts(words, parts)):
            if all(fits(group) for group in groups):
                return groups
    return [[word] for word in words]


PHRASE_SLACK = 1.25  # a group may run this much longer than the evenest split's longest to end at a phrase's end
PHRASE_ENDS = tuple(",.;:!?…，。；：！？、")
CLOSING = "\"'”’)]»」』"


def _ends_phrase(word: str) -> bool:
    return word.rstrip(CLOSING).endswith(PHRASE_ENDS)


def _natural_parts(words: list[Word], parts: int, limit: float = float("inf")) -> list[list[Word]]:
    """``words`` in ``parts`` groups of at most ``limit`` characters that end where phrases end (after a comma, a
    full stop...) wherever a group need not run more than ``PHRASE_SLACK`` x the evenest split's longest for it;
    the evenest split where no such groups exist."""
    even = _even_parts(words, parts)
    longest = max(_length(group) for group in even)
    return _best_parts(words, parts, min(limit, max(longest, PHRASE_SLACK * longest)), phrases=True) or even


def _even_parts(words: list[Word], parts: int) -> list[list[Word]]:
    """``words`` in ``parts`` groups whose longest text is as short as can be."""
    return _best_parts(words, parts)


def _length(words: list[Word]) -> int:
    return sum(len(w.word) for w in words) + len(words) - 1


def _best_parts(words: list[Word], parts: int, limit: float = float("inf"),
                phrases: bool = False) -> list[list[Word]] | None:
    """``words`` in ``parts`` consecutive non-empty groups of at most ``limit`` characters (joined by spaces) with,
    where ``phrases``, the fewest groups ending inside a phrase, then the shortest longest group (None: none fit)."""
    ends = [0]
    for word in words:
        ends.append(ends[-1] + len(word.word) + 1)  # words[i:j] is ends[j] - ends[i] - 1 characters
    n = len(words)
    best = [[None] * (n + 1) for _ in range(parts + 1)]  # [p][j]: (breaks inside phrases, longest) of words[:j]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = (0, 0)
    for p in range(1, parts + 1):
        for j in range(p, n - parts + p + 1):
            inside = int(phrases and j < n and not _ends_phrase(words[j - 1].word))
            for i in range(j - 1, p - 2, -1):  # the last group growing
                length = ends[j] - ends[i] - 1
                # (without phrases, once the last group alone is the longest no shorter split is left)
                if length > limit or (not phrases and best[p][j] is not None and length >= best[p][j][1]):
                    break
                if best[p - 1][i] is not None:
                    value = (best[p - 1][i][0] + inside, max(best[p - 1][i][1], length))
                    if best[p][j] is None or value <= best[p][j]:
                        best[p][j], cut[p][j] = value, i
    if best[parts][n] is None:
        return None
    groups, j = [], n
    for p in range(parts, 0, -1):
        groups.append(words[cut[p][j]:j])
        j = cut[p][j]
    return groups[::-1]


def render_txt(text: str) -> str:
    return text.strip() + "\n"


def render_srt(segments: list[Segment]) -> str:
    blocks = [
        f"{i}\n{format_timestamp(s.start)} --> {format_timestamp(s.end)}\n{s.text}\n"
        for i, s in enumerate(subtitle_cues(segments), start=1)
    ]
    return "\n".join(blocks)


def render_vtt(segments: list[Segment]) -> str:
    blocks = ["WEBVTT\n"]
    for s in subtitle_cues(segments):
        text = s.text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        blocks.append(f"{format_timestamp(s.start, '.')} --> {format_timestamp(s.end, '.')}\n{text}\n")
    return "\n".join(blocks)


def render_json(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, indent=2) + "\n"


def render_transcript(fmt: str, text: str, segments: list[Segment], record: dict) -> str:
    """Render one file's transcript; ``record`` is the JSON payload (used for ``json`` only)."""
    if fmt == "txt":
        return render_txt(text)
    if fmt == "json":
        return render_json(record)
    if fmt == "srt":
        return render_srt(segments)
    if fmt == "vtt":
        return render_vtt(segments)
    raise ValueError(f"unknown output format {fmt!r}; choose one of {OUTPUT_FORMATS}")
