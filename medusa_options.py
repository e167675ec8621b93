"""How a model decodes, in one place: ``MedusaOptions``, set once on a model (``from_pretrained(..., options=)``,
``model.set_options(...)``) or passed to one ``generate`` call, and the environment variables the artifact reads."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

TIMINGS_ENV = "MEDUSA_ASR_DRAFT_TIMINGS"  # a file for the kept draft timings, or "off"
CACHE_ENV = "MEDUSA_ASR_CACHE"
COMPILE_CACHE_ENV = "MEDUSA_ASR_COMPILE_CACHE"  # "off": torch.compile keeps its caches where torch puts them


def timings_from_environment() -> str | None:
    return os.environ.get(TIMINGS_ENV)


def cache_dir() -> Path:
    """This project's one cache folder: ``$MEDUSA_ASR_CACHE``, else ``$XDG_CACHE_HOME/medusa-asr``, else
    ``~/.cache/medusa-asr``. It holds the Whisper bases converted offline by ``tools.real_whisper``
    (loading looks there before the Hub), the wheels and packages they come from, the demo clip, the kept
    draft timings and torch.compile's caches (``compile_cache_dir``)."""
    if os.environ.get(CACHE_ENV):
        folder = Path(os.environ[CACHE_ENV])
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OSError(f"{CACHE_ENV}={folder} cannot be made a folder ({err.strerror}): set {CACHE_ENV} to a "
                          "writable folder, or unset it") from err
        return folder
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "medusa-asr"


def compile_cache_dir() -> Path | None:
    """The folder torch.compile's caches across processes (Inductor's FX graphs, AOT autograd's, Triton's kernels)
    are kept in: ``torch_compile`` in ``cache_dir()``, so that a later process compiles nothing it compiled before.
    None (torch's own choice) when ``$MEDUSA_ASR_COMPILE_CACHE`` is ``off``, when ``$TORCHINDUCTOR_CACHE_DIR`` names
    another folder than torch's default or when the folder cannot be written."""
    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # (torch writes its default into the variable once it looks the folder up, e.g. when torch._dynamo is imported)
    if os.environ.get(COMPILE_CACHE_ENV) == "off" or (named and os.path.abspath(named) != torch_default_cache_dir()):
        return None
    folder = cache_dir() / "torch_compile"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder if os.access(folder, os.W_OK | os.X_OK) else None


def torch_default_cache_dir() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return None
    return os.path.abspath(default_cache_dir())


@dataclass(frozen=True)
class KernelOptions:
    """The forms a round's kernels take, each the faster one where it was measured; the profiling scripts set the
    others for their A/B runs. ``cache_index_put``: compiled rounds write the KV cache with one ``index_put_`` into
    the whole tensor (False: the per-layer scatter, compiled too). ``gpu_argmax_block``: compiled GPU rounds find the
    argmax block by block of this many scores (0: one plain argmax). ``grouped_attention`` (MERaLiON-2, compiled
    rounds): the query heads of a key/value head as ``"rows"`` of one product, or the cache ``"broadcast"`` over
    them. ``rope_table_devices``: device types whose MERaLiON-2 passes gather cos/sin from a table made at prefill
    (elsewhere computed). ``layer_regions`` (MERaLiON-2, compiled passes): each decoder layer traced and compiled once
    and reused for every layer (``torch.compiler.nested_compile_region``; the projections then stay unfused); off: it
    shortens a cold compile, but on a GPU not a warm one, and it slows the rounds (``benchmarks/first_call/``)."""

    cache_index_put: bool = True
    gpu_argmax_block: int = 2048
    grouped_attention: str = "rows"
    rope_table_devices: tuple = ("cuda",)
    layer_regions: bool = False

    def __post_init__(self):
        if self.grouped_attention not in ("rows", "broadcast") or self.gpu_argmax_block < 0:
            raise ValueError(f"grouped_attention must be 'rows' or 'broadcast' and gpu_argmax_block >= 0; got "
                             f"{self.grouped_attention!r}, {self.gpu_argmax_block!r}")
        object.__setattr__(self, "rope_table_devices", tuple(self.rope_table_devices))


@dataclass(frozen=True)
class MedusaOptions:
    """``draft``: ``"auto"`` (time the candidates, pick the fastest), ``"chain"``, ``"tree"``, ``"tree-N"``, ``"none"``
    or explicit paths. ``cuda_graph``: run each round as one captured CUDA graph (None: on for CUDA devices).
    ``compile``: also compile the rounds (``torch.compile``). ``cpu_chain_stop``: on a CPU a chain of path heads stops
    drafting after the depth where the product of its drafts' probabilities falls below this ("auto": from this
    machine's measured cost of a depth against that of a token; 0: the full chain); rounds of fixed shape always draft
    the full chain. ``int8_cpu_drafting``: draft on a CPU with int8 weight-only copies of the heads and the draft
    projection (drafts only propose: verification stays in the base's precision). ``fused_path_drafting``: device
    types whose path heads draft through fewer, larger products per depth (a GPU's drafting is otherwise a chain of
    small kernels). ``draft_timings``: the file ``auto``'s timings (and a CPU's product forms) are kept in between
    processes, ``"off"``, or None for the cache folder's (default: ``$MEDUSA_ASR_DRAFT_TIMINGS``). ``kernels``: the
    rounds' kernel forms (``KernelOptions``; a model's own, set with ``set_options``)."""

    draft: str | list | tuple = "auto"
    cuda_graph: bool | None = None
    compile: bool = False
    cpu_chain_stop: float | str = "auto"
    int8_cpu_drafting: bool = True
    fused_path_drafting: tuple = ("cuda",)
    draft_timings: str | None = field(default_factory=timings_from_environment)
    kernels: KernelOptions = field(default_factory=KernelOptions)

    def __post_init__(self):
        if self.cuda_graph not in (None, True, False) or self.compile not in (True, False):
            raise ValueError(f"cuda_graph must be True, False or None and compile True or False; got "
                             f"cuda_graph={self.cuda_graph!r}, compile={self.compile!r}")
        stop = self.cpu_chain_stop
        if stop != "auto" and (isinstance(stop, (bool, str)) or not float(stop) >= 0.0):
            raise ValueError(f"cpu_chain_stop must be 'auto' or a number >= 0 (above 1: one draft a round); got "
                             f"{stop!r}")
        object.__setattr__(self, "fused_path_drafting", tuple(self.fused_path_drafting))

    def but(self, **changes) -> "MedusaOptions":
        """These options with ``changes``; a change given as None keeps the option as it is."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
