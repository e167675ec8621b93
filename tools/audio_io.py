"""Audio input/output for the transcription command (``tools/transcribe.py``).

Everything here is model-agnostic:

* finding audio files from command-line specs (files, folders, globs);
* decoding WAV/FLAC/MP3/OGG/Opus/AIFF with soundfile (libsndfile) and M4A/AAC/MP4/WebM/MKV/MOV/AVI with PyAV,
  block by block, down-mixing to mono and resampling to 16 kHz with soxr as it goes; a header of no recording's
  rate or over the duration limit is refused before decoding, samples that no audio holds (NaN, beyond 2^31)
  while decoding;
* splitting long audio into windows, cut at a quiet point near each boundary;
* rendering transcripts as txt/json/srt/vtt (``tools.files`` writes them atomically).
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shlex
import stat
import warnings
from collections.abc import Callable, Iterator
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

# A header can claim any rate and length, and the decoded 16 kHz samples are held whole (a 32 KB file whose header
# says 1 Hz is 4.4 hours once resampled): the reader refuses, from the header and before decoding, what no recording
# is, and holds a file to a duration limit while decoding too (a header may understate it).
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1_000, 768_000  # (768 kHz: the highest rate audio interfaces record at)
MAX_AUDIO_SECONDS = 4 * 3600.0  # 0.9 GB of 16 kHz float32 samples
TRUNCATED_SHARE = 0.9  # decoding less than this share of a header's duration: a note that the file is cut short
BLOCK_SAMPLES = 1 << 18  # decoded at a time, all channels together (1 MiB of float32)
# Float samples may run a little past full scale (1.0); far past it they are integer PCM values written as floats,
# which are scaled back by the integer full scale that holds them. Past the widest (32-bit) the file is corrupt.
FLOAT_HEADROOM = 4.0
INTEGER_FULL_SCALES = (2.0**7, 2.0**15, 2.0**23, 2.0**31)
# The channels' mean keeps every voice of a recording made one speaker a channel (a phone call), so it is the
# down-mix; but channels in opposite phase (right = -left: a mis-wired or phase-flipped pair) cancel in it. Where the
# mean holds less than this share of the channels' own energy (uncorrelated channels: all of it, right = -left:
# none), the loudest channel alone is transcribed instead.
CANCELLING_MIX = 0.5


class AudioNote(UserWarning):
    """A change the reader made to a file's audio (``load_audio``'s ``note`` gets its one line)."""


@dataclass(frozen=True)
class StreamInfo:
    """What a file's header says: sample rate, channels and, where it says, duration."""

    rate: int
    channels: int
    seconds: float | None


@dataclass(frozen=True)
class _Reader:
    info: StreamInfo
    blocks: Callable[[], Iterator[np.ndarray]]  # each call decodes from the start: float32 [frames, channels]
    empty_is_audio: bool  # no frames: a zero-length recording (libsndfile), or nothing it could read (FFmpeg)


class _Undecodable(Exception):
    """This decoder cannot read the file (another may); ``reason`` is the library's word, if useful."""

    def __init__(self, reason: str = ""):
        super().__init__(reason)
        self.reason = " ".join(reason.split())


def load_audio(path: str | os.PathLike, sample_rate: int = TARGET_SAMPLE_RATE,
               max_seconds: float = MAX_AUDIO_SECONDS, note: Callable[[str], None] | None = None) -> np.ndarray:
    """Decode a file to mono float32 at ``sample_rate``, block by block (memory: about twice the result); raise
    :class:`AudioError`, one line naming the problem and its fix, for a file that cannot be used or is longer than
    ``max_seconds``. ``note`` gets one line for each change made to the audio beyond decoding (a channel used alone,
    samples scaled back to full scale); by default it is issued as an :class:`AudioNote` warning."""
    path = Path(path)
    extension = _supported_extension(path)
    head = _first_bytes(path)
    failures = []
    for open_reader in (_pyav_reader,) if extension in PYAV_EXTENSIONS else (_soundfile_reader, _pyav_reader):
        try:
            reader = open_reader(path)
            check_stream(path, reader.info, max_seconds)
            return _decode_mono(path, reader, sample_rate, max_seconds, note or _warn)
        except _Undecodable as failure:
            failures.append(failure)
    raise AudioError(path, _undecodable(extension, head, failures))


def _supported_extension(path: Path) -> str:
    extension = path.suffix.lower()
    if extension not in SUPPORTED_EXTENSIONS:
        supported = ", ".join(sorted(SUPPORTED_EXTENSIONS))
        raise AudioError(path, f"unsupported format {extension or '(no extension)'!r} (supported: {supported})")
    return extension


def _first_bytes(path: Path, count: int = 16) -> bytes:
    """The file's first bytes (to tell a damaged file of its format from another format); AudioError where the file
    is empty, not a regular file or not readable by this user."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise AudioError(path, "not a regular file (a folder, pipe or device); pass the audio file itself")
        with open(path, "rb") as handle:
            head = handle.read(count)
    except PermissionError as error:
        raise AudioError(path, "permission denied: this user may not read the file; make it readable "
                               f"(chmod a+r {shlex.quote(str(path))}) or run as a user who may") from error
    except OSError as error:
        raise AudioError(path, f"cannot read file ({error.strerror or error})") from error
    if not head:
        raise AudioError(path, "empty file (0 bytes)")
    return head


def check_stream(path: str | os.PathLike, info: StreamInfo, max_seconds: float = MAX_AUDIO_SECONDS) -> None:
    """AudioError where a header's rate or channels are no recording's, or its duration is over ``max_seconds``."""
    if not MIN_SAMPLE_RATE <= info.rate <= MAX_SAMPLE_RATE:
        raise AudioError(path, f"implausible sample rate {info.rate} Hz in its header (recordings are "
                               f"{MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz): the file is damaged or mislabelled; "
                               "re-export it at its real rate")
    if info.channels < 1:
        raise AudioError(path, f"its header declares {info.channels} channels: the file is damaged; re-export it")
    if info.seconds is not None and info.seconds > max_seconds:
        raise AudioError(path, _too_long(f"{info.seconds / 3600:.2f} hours of audio", max_seconds))


def _too_long(what: str, max_seconds: float) -> str:
    return (f"{what}, over the {max_seconds / 3600:g} h limit: split it (ffmpeg -i IN -f segment -segment_time 3600 "
            "-c copy OUT%03d.EXT) or raise the limit (the command's --max-audio-hours)")


def _decode_mono(path: Path, reader: _Reader, sample_rate: int, max_seconds: float, note) -> np.ndarray:
    """The reader's blocks checked, down-mixed, resampled and joined; scaled back to full scale where the samples
    are integer values written as floats."""
    info = reader.info
    channel = _channel_to_keep(path, reader, note) if info.channels > 1 else None
    resampler = (soxr.ResampleStream(info.rate, sample_rate, 1, dtype="float32", quality="HQ")
                 if info.rate != sample_rate else None)
    pieces, frames, peak = [], 0, 0.0
    for block in reader.blocks():
        peak = max(peak, _checked_peak(path, block))
        frames += len(block)
        if frames > max_seconds * info.rate:
            raise AudioError(path, _too_long("more audio than its header says", max_seconds))
        mono = _downmix(block, channel)
        pieces.append(resampler.resample_chunk(mono) if resampler else mono)
    if frames == 0:
        if reader.empty_is_audio:
            raise AudioError(path, "zero-length audio (no samples)")
        raise _Undecodable("no audio frames")  # (FFmpeg may probe garbage into an empty stream)
    if resampler:
        pieces.append(resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
    samples = np.concatenate(pieces)
    del pieces
    _note_if_cut_short(path, info, frames / info.rate, note)
    return _full_scale(path, samples, peak, note)


def _note_if_cut_short(path: Path, info: StreamInfo, decoded_seconds: float, note) -> None:
    """A note where far less decoded than the header announced (a download cut short: decoders read what is
    there); a little less is usual, where a header's length is an estimate (a variable-bitrate MP3)."""
    if info.seconds is not None and decoded_seconds < TRUNCATED_SHARE * info.seconds - 1.0:
        note(f"{path}: truncated? its header says {info.seconds:.1f} s, {decoded_seconds:.1f} s could be decoded: "
             "transcribing that; re-download or re-encode the file for the rest")


def _checked_peak(path: Path, block: np.ndarray) -> float:
    """The block's largest magnitude; AudioError where a sample is not a number or beyond any audio scale."""
    peak = max(float(block.max()), -float(block.min())) if block.size else 0.0  # (NaN carries through both)
    if not np.isfinite(peak):
        raise AudioError(path, "corrupt audio: it holds NaN or infinite samples; re-export it from its source")
    if peak > INTEGER_FULL_SCALES[-1]:
        raise AudioError(path, f"samples reach {peak:.3g}, beyond any audio scale (floats span [-1, 1], 32-bit "
                               "integers 2^31): the file is damaged or wrongly scaled; re-export it as 16-bit PCM")
    return peak


def _downmix(block: np.ndarray, channel: int | None) -> np.ndarray:
    if channel is not None:
        return np.ascontiguousarray(block[:, channel])
    channels = block.shape[1]
    return block[:, 0] if channels == 1 else block @ np.full(channels, 1 / channels, dtype=np.float32)


def _channel_to_keep(path: Path, reader: _Reader, note) -> int | None:
    """None (the channels' mean), or where the channels cancel in it (``CANCELLING_MIX``) the loudest channel; a
    first pass over the file, which also refuses unusable samples before any is kept."""
    energy, mixed = np.zeros(reader.info.channels), 0.0  # each channel's energy, and the channels' sum's
    for block in reader.blocks():
        _checked_peak(path, block)
        energy += np.square(block, dtype=np.float64).sum(axis=0)
        mixed += float(np.square(block.sum(axis=1, dtype=np.float64)).sum())
    total = float(np.sum(energy))
    if total == 0.0 or mixed >= CANCELLING_MIX * total:
        return None
    loudest = int(np.argmax(energy))
    note(f"{path}: its channels cancel when mixed (one is another's inverse, {mixed / total:.0%} of their energy "
         f"left): transcribing channel {loudest + 1} of {len(energy)} alone")
    return loudest


def _full_scale(path: Path, samples: np.ndarray, peak: float, note) -> np.ndarray:
    if peak <= FLOAT_HEADROOM:
        return samples
    scale = next(scale for scale in INTEGER_FULL_SCALES if peak <= scale)
    note(f"{path}: samples peak at {peak:.6g}, far outside [-1, 1] (integer values stored as floats): "
         f"scaled by 1/{scale:.0f}")
    samples *= np.float32(1 / scale)
    return samples


def _warn(message: str) -> None:
    warnings.warn(message, AudioNote, stacklevel=4)


def _soundfile_reader(path: Path) -> _Reader:
    try:
        info = sf.info(str(path))
    except (sf.SoundFileError, RuntimeError, ValueError, TypeError) as error:
        raise _Undecodable(_libsndfile_reason(error)) from error
    frames = info.frames if 0 <= info.frames < 2**62 else None  # (libsndfile's "unknown" is the largest count)
    seconds = frames / info.samplerate if frames is not None and info.samplerate > 0 else None
    return _Reader(StreamInfo(int(info.samplerate), int(info.channels), seconds),
                   functools.partial(_soundfile_blocks, path, max(1, BLOCK_SAMPLES // max(info.channels, 1))), True)


def _soundfile_blocks(path: Path, frames: int) -> Iterator[np.ndarray]:
    try:
        with sf.SoundFile(str(path)) as audio:
            while len(block := audio.read(frames, dtype="float32", always_2d=True)):
                yield block
    except (sf.SoundFileError, RuntimeError, ValueError, TypeError) as error:
        raise _Undecodable(_libsndfile_reason(error)) from error


def _libsndfile_reason(error: Exception) -> str:
    reason = str(error).split(": ", 1)[-1].strip() or type(error).__name__
    # (libsndfile says this of a file it cannot parse at all; the file was just read, so it would mislead)
    return "" if reason.startswith(("File does not exist", "System error")) else reason


def _pyav_reader(path: Path) -> _Reader:
    av = _pyav(path)
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise _Undecodable("no audio stream")
            stream = container.streams.audio[0]
            info = StreamInfo(int(stream.codec_context.sample_rate or stream.rate or 0),
                              int(stream.codec_context.channels or 0), _stream_seconds(container, stream))
            if not (info.rate and info.channels):  # (FFmpeg may probe garbage into a stream of no rate)
                raise _Undecodable("no audio stream with a sample rate")
    except _Undecodable:
        raise
    except Exception as error:  # PyAV raises many FFmpeg error types; all mean "cannot decode"
        raise _Undecodable(_ffmpeg_reason(error)) from error
    return _Reader(info, functools.partial(_pyav_blocks, path, info.rate), False)


def _pyav(path: Path):
    try:
        import av
    except ImportError as error:
        if path.suffix.lower() in PYAV_EXTENSIONS:
            raise AudioError(path, "decoding this format needs PyAV: pip install av") from error
        raise _Undecodable() from error
    return av


def _stream_seconds(container, stream) -> float | None:
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    return container.duration / 1_000_000 if container.duration else None  # (FFmpeg's AV_TIME_BASE)


def _pyav_blocks(path: Path, rate: int) -> Iterator[np.ndarray]:
    av = _pyav(path)
    try:
        with av.open(str(path)) as container:
            stream = container.streams.audio[0]
            # Planar float keeps each channel a row; a frame of another rate or layout mid-stream is brought to the
            # header's.
            to_planar_float = av.AudioResampler(format="fltp", layout=stream.codec_context.layout, rate=rate)
            for frame in container.decode(stream):
                for converted in to_planar_float.resample(frame):
                    yield converted.to_ndarray().T
            for converted in to_planar_float.resample(None):
                yield converted.to_ndarray().T
    except Exception as error:  # PyAV raises many FFmpeg error types; all mean "cannot decode"
        raise _Undecodable(_ffmpeg_reason(error)) from error


def _ffmpeg_reason(error: Exception) -> str:
    return getattr(error, "strerror", None) or str(error).strip() or type(error).__name__


def _undecodable(extension: str, head: bytes, failures: list[_Undecodable]) -> str:
    """One line for a file no decoder could read: damaged (its format's header is there) or another format."""
    reasons = "; ".join(dict.fromkeys(failure.reason for failure in failures if failure.reason))
    detail = f" ({reasons})" if reasons else ""
    if _starts_like(extension, head):
        return (f"cannot decode audio, file is truncated or damaged: its {extension} header is there but no audio "
                f"could be decoded{detail}; re-download or re-encode it")
    return (f"cannot decode audio, file is corrupt or not {extension}{detail}; check the file, or rename it to its "
            "real format")


def _starts_like(extension: str, head: bytes) -> bool:
    """Whether ``head`` opens a file of ``extension``'s format (its container's magic bytes)."""
    mpeg_frame = len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0  # (MP3 and ADTS AAC frames)
    starts = {".wav": (b"RIFF", b"RIFX", b"RF64"), ".avi": (b"RIFF",), ".flac": (b"fLaC",),
              ".ogg": (b"OggS",), ".oga": (b"OggS",), ".opus": (b"OggS",), ".aiff": (b"FORM",), ".aif": (b"FORM",),
              ".mp3": (b"ID3",), ".aac": (b"ID3", b"ADIF"), ".webm": (b"\x1a\x45\xdf\xa3",),
              ".mkv": (b"\x1a\x45\xdf\xa3",)}
    if extension in (".mp3", ".aac") and mpeg_frame:
        return True
    if extension in (".m4a", ".mp4", ".mov"):
        return head[4:8] in (b"ftyp", b"moov", b"mdat", b"wide", b"free")
    return head.startswith(starts.get(extension, ()))


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
