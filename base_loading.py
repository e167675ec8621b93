"""The base model under the heads: found (a folder, a copy converted offline, the Hub or its cache), loaded with
its processor, a PEFT adapter merged, and its family told; its own code runs only with consent (see
``load_base_model``)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

try:
    from .backbone import Backbone
    from .backbone_meralion2 import MERaLiON2Backbone
    from .backbone_whisper import WhisperBackbone
    from .medusa_options import cache_dir
except ImportError:
    from backbone import Backbone
    from backbone_meralion2 import MERaLiON2Backbone
    from backbone_whisper import WhisperBackbone
    from medusa_options import cache_dir

BACKBONES: dict[str, type[Backbone]] = {backbone.family: backbone for backbone in (WhisperBackbone, MERaLiON2Backbone)}
BASE_LOAD_KWARGS = ("torch_dtype", "dtype", "device_map", "attn_implementation", "quantization_config",
                    "revision", "token", "cache_dir", "local_files_only", "low_cpu_mem_usage")
CONVERSION_MARKER = "conversion.json"  # written last into a base folder converted by tools.real_whisper


def detect_family(base) -> str:
    for family, backbone in BACKBONES.items():
        if backbone.is_model(base):
            return family
    raise ValueError(f"Cannot tell the family of {type(base).__name__}; pass family= one of {sorted(BACKBONES)}.")


class BaseModelNotFound(OSError):
    """The base model could not be loaded from a folder, a converted copy or the Hub (or its cache)."""

    def __init__(self, name: str, reason: str, unreachable: bool = False):
        self.name, self.reason, self.unreachable = name, reason, unreachable
        super().__init__(self.message("pass base_model_name_or_path=<local folder>"))

    def message(self, how_to_point: str) -> str:
        unreachable = self.unreachable or "connect" in self.reason.lower()
        offline = (" Without a network, HF_HUB_OFFLINE=1 skips the Hub (and its retries) and loads from its cache."
                   if unreachable and not os.environ.get("HF_HUB_OFFLINE") else "")
        if self.reason == "no such folder":
            return f"Could not load the base model: there is no folder {self.name}; {how_to_point}."
        return (f"Could not load the base model {self.name!r} ({self.reason}). It is not a local folder, "
                f"{converted_base_folder(self.name)} holds no converted copy, and the Hub or its cache does not "
                f"have it: download it (hf download {self.name}), convert it in the heads' repository (Whisper "
                f"tiny.en/base: python -m tools.real_whisper {self.name}), or {how_to_point}.{offline}")


class BaseCodeNotTrusted(ValueError):
    """A base whose family runs its own code (MERaLiON-2) that the caller did not agree to run."""

    def __init__(self, name: str, family: str):
        super().__init__(
            f"{name} is a {family} base, which runs its own Python code from its folder or repository; it is not the "
            "base the heads name, so its code runs only if you trust it: pass trust_base_remote_code=True "
            "(commands: --trust-base-code).")


def load_base_model(name_or_path: str, family: str | None = None, trust_base_code: bool = False, **kwargs):
    """Load a base model (+ its processor) by Hub id or folder; a PEFT adapter folder is merged (onto the base its
    adapter_config.json names). The base's config.json is read as data: its own code runs only where its family
    needs it (MERaLiON-2; Whisper never) and ``trust_base_code`` says the caller agreed to it."""
    load_kwargs = {k: v for k, v in kwargs.items() if k in BASE_LOAD_KWARGS and v is not None}
    name_or_path = resolve_base(name_or_path)
    if _looks_like_path(name_or_path) and not Path(name_or_path).expanduser().is_dir():
        raise BaseModelNotFound(name_or_path, "no such folder")
    _from_cache_if_hub_silent(name_or_path, load_kwargs)
    adapter = _peft_adapter_base(name_or_path, load_kwargs)
    source = resolve_base(adapter) if adapter else name_or_path
    config = _base_config(source, load_kwargs)
    detected = _family_of(config, source)
    if BACKBONES[detected].remote_code and not trust_base_code:
        raise BaseCodeNotTrusted(str(source), detected)
    if family and family != detected:
        raise ValueError(f"{source} is a {detected} base, but these heads were trained for a {family} base; give a "
                         f"{family} base (or the heads for this one).")
    family = detected
    _decompress_compressed_tensors(config, source, load_kwargs)
    try:
        base = BACKBONES[family].load_base(source, load_kwargs)
    except OSError as err:
        raise BaseModelNotFound(str(source), f"{type(err).__name__}: {first_line(err)}") from err
    if adapter:
        base = _merge_adapter(base, name_or_path)
    _undo_compressed_tensors_offloading(base)
    base.eval()
    return base, _load_processor(source, family, load_kwargs)


def resolve_base(name_or_path: str) -> str:
    """A folder as it is; a Hub id converted offline into ``cache_dir()`` (``tools.real_whisper``) as that
    copy, found before any Hub request; any other Hub id as it is (the Hub, or its cache when offline)."""
    path = Path(str(name_or_path)).expanduser()
    if path.is_dir():
        return str(path)
    converted = converted_base_folder(str(name_or_path))
    try:
        marker = json.loads((converted / CONVERSION_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return str(name_or_path)
    return str(converted) if marker.get("hub_id") == str(name_or_path) else str(name_or_path)


def converted_base_folder(hub_id: str) -> Path:
    """Where ``tools.real_whisper`` converts ``hub_id`` (``cache_dir()/<last part of the id>``)."""
    return cache_dir() / str(hub_id).rstrip("/").split("/")[-1]


def _merge_adapter(base, adapter_path):
    """A PEFT/LoRA adapter merged into its base. peft is optional: imported here, in a try block, so that
    transformers' import check of this remote-code file does not demand it from everyone."""
    try:
        from peft import PeftModel
    except ImportError as err:
        raise ImportError(f"{adapter_path} is a PEFT adapter; loading it needs the peft package "
                          "(pip install peft).") from err
    return PeftModel.from_pretrained(base, adapter_path).merge_and_unload()


def _load_processor(source, family, load_kwargs):
    from transformers import AutoProcessor

    keep = {k: v for k, v in load_kwargs.items() if k in ("revision", "token", "cache_dir", "local_files_only")}
    try:
        return AutoProcessor.from_pretrained(source, trust_remote_code=BACKBONES[family].processor_remote_code, **keep)
    except (OSError, ValueError, TypeError, KeyError) as err:
        warnings.warn(f"Loaded {source} without a processor ({type(err).__name__}: {first_line(err)}); "
                      "prepare_audio_inputs and decode_text need one: pass processor= to from_pretrained.")
        return None


def _looks_like_path(name: str) -> bool:
    """A name meant as a folder (absolute, ./, ../, ~), never a Hub repository id."""
    return str(name).startswith(("/", "./", "../", "~", "\\")) or Path(str(name)).is_absolute()


def hub_silence(repo_id: str, load_kwargs: dict) -> str | None:
    """Why the Hub gave no answer to one request for ``repo_id``'s config.json within huggingface_hub's
    HF_HUB_ETAG_TIMEOUT (a timeout, a refused or reset connection), or None when it answered (any status) or is
    not to be asked (a folder, HF_HUB_OFFLINE=1, local_files_only)."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    if Path(repo_id).is_dir() or load_kwargs.get("local_files_only") or constants.HF_HUB_OFFLINE:
        return None
    url = hf_hub_url(repo_id, "config.json", revision=load_kwargs.get("revision"))
    try:
        get_session().head(url, headers=build_hf_headers(token=load_kwargs.get("token")),
                           timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception as err:  # noqa: BLE001 - no HTTP answer at all (httpx's or requests' errors, by version)
        return (f"no answer from {constants.ENDPOINT} to a request for {repo_id}/config.json ({type(err).__name__}; "
                f"timeout {constants.HF_HUB_ETAG_TIMEOUT} s, HF_HUB_ETAG_TIMEOUT)")
    return None


def _from_cache_if_hub_silent(repo_id: str, load_kwargs: dict) -> None:
    """Where the Hub does not answer one bounded request, load from its cache alone (local_files_only), so that
    no file, optional ones such as adapter_config.json included, waits through the library's retries (minutes
    each); without a cached copy, say so at once."""
    from huggingface_hub import try_to_load_from_cache

    silence = hub_silence(repo_id, load_kwargs)
    if silence is None:
        return
    cached = (try_to_load_from_cache(repo_id, name, cache_dir=load_kwargs.get("cache_dir"),
                                     revision=load_kwargs.get("revision"))
              for name in ("config.json", "adapter_config.json"))
    if not any(isinstance(path, str) for path in cached):
        raise BaseModelNotFound(repo_id, f"{silence}; the Hugging Face cache has no copy", unreachable=True)
    warnings.warn(f"{silence}; loading {repo_id} from the Hugging Face cache.", stacklevel=3)
    load_kwargs["local_files_only"] = True


def _peft_adapter_base(name_or_path, load_kwargs) -> str | None:
    """The base a PEFT adapter (folder or Hub id) was trained on; None for a model that is not an adapter."""
    from transformers.utils import find_adapter_config_file

    keep = {k: v for k, v in load_kwargs.items() if k in ("revision", "token", "cache_dir", "local_files_only")}
    try:
        path = find_adapter_config_file(str(name_or_path), **keep)
    except (OSError, ValueError):  # (offline, or a path that is neither a folder nor a repository id)
        return None
    return json.loads(Path(path).read_text(encoding="utf-8"))["base_model_name_or_path"] if path else None


def _base_config(source, load_kwargs) -> dict:
    """The base's config.json as a dict: read as data, so none of the base's code (its auto_map) runs."""
    from transformers import PretrainedConfig

    keep = {k: v for k, v in load_kwargs.items() if k in ("revision", "token", "cache_dir", "local_files_only")}
    try:
        config, _ = PretrainedConfig.get_config_dict(str(source), **keep)
    except (OSError, ValueError) as err:
        raise BaseModelNotFound(str(source), first_line(err)) from err
    return config


def _family_of(config: dict, source) -> str:
    model_type = config.get("model_type") or ""
    for family, backbone in BACKBONES.items():
        if backbone.is_model_type(model_type):
            return family
    raise ValueError(f"{source!r} is a {model_type or 'untyped'!r} model (config.json's model_type); supported "
                     "bases are MERaLiON-2 and Whisper.")


def _decompress_compressed_tensors(config, source, load_kwargs) -> None:
    """A compressed-tensors base (e.g. a W4A16 GPTQ checkpoint) loads with its weights decompressed, said
    once: the library's packed layers fail in transformers' own forward here (their forward looks for a
    dense ``weight``), so they would not run even in the base's generate. The values are the quantised
    model's, so its outputs are; the speed is that of dense weights, not of a 4-bit kernel (vLLM's Marlin)."""
    quantization = config.get("quantization_config")
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "compressed-tensors" \
            or "quantization_config" in load_kwargs:
        return
    from transformers import CompressedTensorsConfig

    load_kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    warnings.warn(f"{source}: compressed-tensors weights ({quantization.get('format', '?')}) decompressed to dense at "
                  "load: decoded ids are the quantised model's own, speed is that of dense weights. Pass "
                  "quantization_config=CompressedTensorsConfig() to try the packed layers.",
                  stacklevel=3)


def _undo_compressed_tensors_offloading(base) -> None:
    """Some compressed-tensors versions (0.19 under transformers 5.17) keep a decompressed base's layer tensors in
    their CPU offload cache, onloaded at each forward: ``.to(device)`` then leaves them on the CPU, and the decode
    loop (which reads the weights) meets CPU tensors on a GPU. Make them the module's own parameters again."""
    try:
        from compressed_tensors.offload import OffloadCache, remove_dispatch
    except ImportError:
        return
    if any(isinstance(module._parameters, OffloadCache) for module in base.modules()):
        remove_dispatch(base)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
