"""Medusa heads for speech recognition models, as a Hugging Face remote-code model.

``MedusaForASR.from_pretrained(repo)`` loads the base model named in the config (MERaLiON-2 or
Whisper), grafts K residual heads that share the base's output projection, and ``generate``
drafts with the heads and verifies with the base: the output is the base's own greedy output.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time
import uuid
import warnings
from pathlib import Path

import torch
from transformers import PreTrainedModel

# Every code file the artifact runs is imported here, not only through other files: transformers < 4.52 copies
# into its module cache just the files that modeling_medusa.py itself imports from a local folder.
try:
    from .backbone import Backbone
    from .backbone_meralion2 import MERaLiON2Backbone
    from .backbone_whisper import WhisperBackbone
    from .configuration_medusa import MedusaConfig
    from .draft_policy import CREDITED_CHAIN_STOP, DraftPolicy, TimingKey, TimingStore, cache_dir, processor_name
    from .draft_timing import PhaseTimer, loop_round_timer, time_drafts, verify_pass_timer
    from .draft_trees import DraftTree
    from .kv_cache import DecodeState
    from .logits_rules import LogitsRules
    from .medusa_options import MedusaOptions
    from .medusa_decoding import EagerRounds, MedusaStats, WindowPlan, run_rounds
    from .medusa_fast import CapturedRounds, RoundCache
    from .medusa_heads import (DraftProjection, MedusaDrafter, MedusaHeads, PathDrafter,  # noqa: F401
                               FusedPathDrafter, FusedPathWeights, build_heads, int8_drafting_copy,
                               int8_drafting_supported)
except ImportError:
    from backbone import Backbone
    from backbone_meralion2 import MERaLiON2Backbone
    from backbone_whisper import WhisperBackbone
    from configuration_medusa import MedusaConfig
    from draft_policy import CREDITED_CHAIN_STOP, DraftPolicy, TimingKey, TimingStore, cache_dir, processor_name
    from draft_timing import PhaseTimer, loop_round_timer, time_drafts, verify_pass_timer
    from draft_trees import DraftTree
    from kv_cache import DecodeState
    from logits_rules import LogitsRules
    from medusa_options import MedusaOptions
    from medusa_decoding import EagerRounds, MedusaStats, WindowPlan, run_rounds
    from medusa_fast import CapturedRounds, RoundCache
    from medusa_heads import (DraftProjection, MedusaDrafter, MedusaHeads, PathDrafter,  # noqa: F401
                              FusedPathDrafter, FusedPathWeights, build_heads, int8_drafting_copy,
                              int8_drafting_supported)

HEADS_FILE = "medusa_heads.safetensors"
DRAFT_VOCAB_KEY = "draft_vocab"  # int64 [V_draft]: the token ids the heads project onto (optional)
CODE_FILES = ("configuration_medusa.py", "modeling_medusa.py", "medusa_options.py", "medusa_decoding.py",
              "medusa_fast.py", "medusa_heads.py", "draft_policy.py", "draft_timing.py", "draft_trees.py", "kv_cache.py",
              "logits_rules.py", "backbone.py", "backbone_whisper.py", "backbone_meralion2.py", "asr_pipeline.py")
# The code a decode runs, whose digest keys the kept draft timings: what transformers copies for trust_remote_code
# (the ASR pipeline's file is loaded apart), so a model loaded through the API and one the command line imports
# find the same entry.
DECODING_CODE = tuple(name for name in CODE_FILES if name != "asr_pipeline.py")
# transformers.pipeline("automatic-speech-recognition", model=<artifact>, trust_remote_code=True) builds this class
# (for a family it does not run, it says so in one line)
ASR_PIPELINE = {"impl": "asr_pipeline.MedusaSpeechRecognitionPipeline", "pt": ["AutoModel"], "tf": [], "type": "audio"}
BACKBONES: dict[str, type[Backbone]] = {backbone.family: backbone for backbone in (WhisperBackbone, MERaLiON2Backbone)}
BASE_LOAD_KWARGS = ("torch_dtype", "dtype", "device_map", "attn_implementation", "quantization_config",
                    "revision", "token", "cache_dir", "local_files_only", "low_cpu_mem_usage")
CONVERSION_MARKER = "conversion.json"  # written last into a base folder converted by pipeline.real_whisper
TRAIN_HINT = ("Train heads for this base with: python -m pipeline.collect --base BASE --audio AUDIO && "
              "python -m pipeline.train ... && python -m pipeline.export ... (see README.md).")


def _declared(name: str, doc: str) -> property:
    """A model property its family's backbone class declares (known before any base is loaded)."""
    return property(lambda self: getattr(BACKBONES[self.family], name), doc=doc)


class MedusaForASR(PreTrainedModel):
    config_class = MedusaConfig
    base_model_prefix = "medusa"
    _no_split_modules = []

    def __init__(self, config: MedusaConfig, base=None, processor=None, options: MedusaOptions | None = None):
        super().__init__(config)
        self.base = base
        self.processor = processor
        self.backbone = BACKBONES[config.base_family](base) if base is not None else None
        speech_heads = self.backbone.speech_heads if config.speech_attention and self.backbone else None
        if config.speech_attention and self.backbone is not None and not speech_heads:
            raise ValueError(f"speech_attention heads need a base whose decoder cross-attends to the speech "
                             f"(Whisper); {config.base_family} has none.")
        self.medusa_heads = build_heads(config.head_kind, config.medusa_num_heads, config.medusa_num_layers,
                                        config.hidden_size, speech_heads)
        self.register_buffer("draft_vocab", None, persistent=False)  # token ids the heads project onto
        # Optional replacement for the trained heads when drafting: hidden [..., H] -> logits [..., K, V]
        # (an oracle in tests, a replayed acceptance profile in benchmarks). None = the heads.
        self.drafter = None
        self.options = options or MedusaOptions()
        self.draft_policy = DraftPolicy(config, TimingStore.at(self.options.draft_timings))
        self.round_cache = RoundCache()
        self._drafters: dict = {}
        self._fused_path_weights = None
        self._timing_context = (None, None)
        if base is not None:
            self.generation_config = base.generation_config  # what callers such as the ASR pipeline read
            self.main_input_name = self.backbone.required_inputs[0]
            _check_fits(config, self.backbone)
            _check_on_one_device(base)
            base.requires_grad_(False)
            param = next(base.parameters())
            self.medusa_heads.to(device=param.device, dtype=param.dtype)

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, base_model=None,
                        base_model_name_or_path=None, processor=None, trust_base_remote_code: bool = False,
                        options: MedusaOptions | None = None, **kwargs):
        """Load the artifact: its config, the base model it names, and the trained heads. A base of a family that
        runs its own code (MERaLiON-2) runs it when it is the base the artifact names, or with
        ``trust_base_remote_code=True`` (a ``base_model_name_or_path`` the caller chose). ``options``: how the model
        decodes (``MedusaOptions``)."""
        folder = _resolve_artifact(pretrained_model_name_or_path, kwargs)
        if getattr(config, "model_type", None) == MedusaConfig.model_type:  # e.g. from AutoConfig, kwargs applied
            config = config if isinstance(config, MedusaConfig) else MedusaConfig.from_dict(config.to_dict())
        else:
            _check_is_artifact(folder)
            config = MedusaConfig.from_pretrained(folder)
        heads_path = Path(folder) / HEADS_FILE
        if not heads_path.is_file():
            raise FileNotFoundError(
                f"No {HEADS_FILE} in {folder}: this artifact has no trained heads for "
                f"{config.base_model_name_or_path}. {TRAIN_HINT}"
            )
        if base_model_name_or_path:
            config.base_model_name_or_path = base_model_name_or_path
        trusted = trust_base_remote_code or str(config.base_model_name_or_path) == _named_base(folder)
        if base_model is None:
            base_model, processor = load_base_model(config.base_model_name_or_path, config.base_family,
                                                    trust_base_code=trusted, **kwargs)
        model = cls(config, base=base_model, processor=processor, options=options)
        model.load_heads(heads_path)
        model.eval()
        return model

    @classmethod
    def from_base(cls, base_model_name_or_path: str, family: str | None = None, medusa_num_heads: int = 4,
                  medusa_num_layers: int = 1, base_model=None, processor=None, head_kind: str = "medusa",
                  speech_attention: bool = False, trust_base_remote_code: bool = False, **kwargs):
        """Fresh (zero-initialised) heads on a frozen base: the starting point for training. A base of a family that
        runs its own code (MERaLiON-2) needs ``trust_base_remote_code=True``."""
        if base_model is None:
            base_model, processor = load_base_model(base_model_name_or_path, family,
                                                    trust_base_code=trust_base_remote_code, **kwargs)
        family = family or detect_family(base_model)
        backbone = BACKBONES[family](base_model)
        config = MedusaConfig(
            base_model_name_or_path=str(base_model_name_or_path), base_family=family,
            medusa_num_heads=medusa_num_heads, medusa_num_layers=medusa_num_layers,
            hidden_size=backbone.hidden_size, vocab_size=backbone.vocab_size, head_kind=head_kind,
            speech_attention=speech_attention,
        )
        return cls(config, base=base_model, processor=processor).eval()

    def load_heads(self, path):
        state = _read_heads(path)
        self.set_draft_vocab(state.pop(DRAFT_VOCAB_KEY, None))
        expected = self.medusa_heads.state_dict()
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(
                f"{path} does not match config ({self.config.medusa_num_heads} heads x "
                f"{self.config.medusa_num_layers} blocks): missing {missing[:4]}, unexpected {unexpected[:4]}."
            )
        for name, tensor in state.items():
            if tensor.shape != expected[name].shape:
                raise ValueError(
                    f"{path}: {name} has shape {tuple(tensor.shape)} but the base needs "
                    f"{tuple(expected[name].shape)} (hidden size {self.config.hidden_size}); "
                    "these heads were trained for another base."
                )
            if not tensor.is_floating_point():
                raise ValueError(f"{path}: {name} has dtype {tensor.dtype}; heads must be floating point.")
        self.medusa_heads.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)

    def save_pretrained(self, save_directory, **kwargs):
        """Write config.json, the heads and the code files (never the base weights), atomically."""
        from safetensors.torch import save

        target = Path(save_directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex}"
        tmp.mkdir()  # not mkdtemp: its 0700 would make the artifact unreadable to others; mkdir keeps the umask
        try:
            if target.is_dir():
                shutil.copytree(target, tmp, dirs_exist_ok=True)
            for name, value in loading_fields(self.family).items():
                setattr(self.config, name, value)
            self.config.save_pretrained(tmp)
            if self.processor is not None and BACKBONES[self.family].asr_pipeline:
                self.processor.save_pretrained(tmp)  # the tokenizer and feature extractor the ASR pipeline loads
            heads = {k: v.detach().contiguous().cpu() for k, v in self.medusa_heads.state_dict().items()}
            if self.draft_vocab is not None:
                heads[DRAFT_VOCAB_KEY] = self.draft_vocab.detach().to("cpu", torch.long).contiguous()
            (tmp / HEADS_FILE).write_bytes(save(heads, metadata={"format": "pt"}))  # save_file would make it 0600
            here = Path(__file__).parent
            for name in CODE_FILES:
                shutil.copy2(here / name, tmp / name)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def can_generate(cls) -> bool:
        """``generate`` is ours (it calls the base's where the base decodes). Said outright: the library's guess
        depends on how the class was loaded (an auto class adds GenerationMixin, a direct import does not), and
        the ASR pipeline sets up its generation arguments only for models that can generate."""
        return True

    # ------------------------------------------------------------------ heads
    @property
    def family(self) -> str:
        return self.config.base_family

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

    def set_draft_vocab(self, token_ids) -> None:
        """Restrict the heads' projection to these token ids (None: the whole vocabulary)."""
        if token_ids is None:
            self.draft_vocab = None
        else:
            ids = torch.as_tensor(token_ids, dtype=torch.long)
            if ids.ndim != 1 or not len(ids) or int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
                raise ValueError(f"draft vocabulary must be 1-D token ids in [0, {self.config.vocab_size}); "
                                 f"got shape {tuple(ids.shape)}")
            self.draft_vocab = ids.to(next(self.medusa_heads.parameters()).device)
        self.config.draft_vocab_size = None if token_ids is None else len(self.draft_vocab)
        self._drafters.clear()

    def draft_projection(self, int8: bool = False) -> DraftProjection:
        return DraftProjection(self.backbone, self.draft_vocab, int8=int8)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Medusa heads: [..., H] -> [..., K, V'] over the draft vocabulary (all of it without one)."""
        if self.config.head_kind != "medusa":
            raise ValueError("head_logits is for Medusa heads; path heads draft along a tree path (make_drafter).")
        return self.draft_projection().logits(self.medusa_heads(hidden))

    def set_options(self, **changes) -> MedusaOptions:
        """Change this model's options (``MedusaOptions``' fields) for every later call; returns them."""
        self.options = dataclasses.replace(self.options, **changes)
        if "draft_timings" in changes:
            self.draft_policy.store = TimingStore.at(self.options.draft_timings)
        return self.options

    def make_drafter(self, tree: DraftTree, device, options: MedusaOptions | None = None):
        """``drafter(state) -> chunk [B, N]`` for ``tree`` (None for plain greedy); kept per tree."""
        if tree.num_nodes == 1:
            return None
        options = options or self.options
        int8 = options.int8_cpu_drafting and int8_drafting_supported(device)
        fused = (torch.device(device).type in options.fused_path_drafting and self.drafter is None
                 and FusedPathWeights.supports(self.medusa_heads, self.draft_vocab))
        # an int8 or fused drafter holds derived copies of the heads: a new one once they change (training, a reload)
        heads_version = tuple((p.data_ptr(), p._version) for p in parameter_tensors(self.medusa_heads)) \
            if int8 or fused else None
        key = (tree, str(device), id(self.drafter), heads_version, fused)
        if key not in self._drafters:
            self._drafters = {k: d for k, d in self._drafters.items() if k[3] in (None, heads_version)}
            self._drafters[key] = self._build_drafter(tree, device, int8, heads_version if fused else None)
        return self._drafters[key]

    def _fused_weights(self, projection: DraftProjection, heads_version) -> FusedPathWeights:
        """The heads rearranged for fused drafting, shared by every tree's drafter; made again when the heads or
        the draft rows change (a new base's weights give new rows)."""
        rows = projection.weight()
        version = (heads_version, rows.data_ptr())
        if self._fused_path_weights is None or self._fused_path_weights[0] != version:
            with torch.no_grad():
                weights = FusedPathWeights(self.medusa_heads, rows, self.draft_vocab, self.backbone.embed)
            self._fused_path_weights = (version, weights)
        return self._fused_path_weights[1]

    def _build_drafter(self, tree: DraftTree, device, int8: bool = False, fused_heads_version=None):
        """The drafter for ``tree``; with ``fused_heads_version`` (the heads' version), the fused path drafter."""
        if self.drafter is not None:  # a stand-in for the heads: full-vocabulary logits per head
            return MedusaDrafter(tree, device, self.drafter)
        if tree.depth > self.config.medusa_num_heads:
            raise ValueError(f"draft tree of depth {tree.depth} needs {tree.depth} heads; "
                             f"this artifact has {self.config.medusa_num_heads}.")
        projection = self.draft_projection(int8)
        heads = int8_drafting_copy(self.medusa_heads) if int8 else self.medusa_heads
        if self.config.head_kind == "medusa":
            return MedusaDrafter(tree, device, lambda hidden: projection.logits(heads(hidden)), projection.token_ids)
        speech = self.backbone.speech_memory if self.config.speech_attention else None
        if fused_heads_version is not None:
            return FusedPathDrafter(tree, device, heads, projection, self.backbone.embed, speech,
                                    self._fused_weights(projection, fused_heads_version))
        return PathDrafter(tree, device, heads, projection, self.backbone.embed, speech)

    def timing_context(self, options: MedusaOptions | None = None) -> str | None:
        """What one verify pass's time depends on besides the draft and its ``TimingKey``, for the draft timings kept
        between processes (``TimingStore``): the machine (the CPU's or GPU's name, torch's threads), torch's version,
        this artifact's decoding code, the base's configuration (its shapes, a quantisation) and the heads' and drafting
        settings. None (nothing kept) with a stand-in drafter (tests, replayed benchmarks)."""
        if self.drafter is not None or self.backbone is None:
            return None
        options = options or self.options
        device = self.backbone.device
        signature = (id(self.base), device, torch.get_num_threads(), self.config.draft_vocab_size,
                     options.int8_cpu_drafting, options.fused_path_drafting)
        if self._timing_context[0] != signature:  # (kept: every auto call asks, a GPU call's host time counts)
            machine = torch.cuda.get_device_name(device) if device.type == "cuda" else processor_name()
            base = {k: v for k, v in self.backbone.base.config.to_dict().items()
                    if not k.startswith("_") and k != "transformers_version"}
            heads = {k: getattr(self.config, k) for k in ("head_kind", "medusa_num_heads", "medusa_num_layers",
                                                           "hidden_size", "speech_attention", "draft_vocab_size")}
            model = _digest([base, heads, options.int8_cpu_drafting, list(options.fused_path_drafting)])
            self._timing_context = (signature, f"{machine} | {torch.get_num_threads()} threads | torch "
                                               f"{torch.__version__} | code {_code_digest()} | model {model}")
        return self._timing_context[1]

    def draft_tree(self, draft="auto") -> DraftTree:
        """``"chain"``, ``"tree"``/``"auto"`` (the artifact's tree), ``"none"`` or explicit paths."""
        return self.draft_policy.resolve(draft)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, *args, use_medusa: bool = True, draft=None, return_stats: bool = False,
                 max_new_tokens: int | None = None, min_new_tokens: int | None = None,
                 cuda_graph: bool | None = None, compile: bool | None = None, options: MedusaOptions | None = None,
                 **kwargs):
        """The base's greedy ``generate``, accelerated: same inputs, same token ids.

        ``use_medusa=False`` runs the base's own generate. Sampling, beam search and options the
        Medusa loop does not implement fall back to it with a warning. ``options`` (default: the model's,
        ``model.options``) say how to decode; ``draft``, ``cuda_graph`` and ``compile``, where given, replace theirs.
        ``draft``: ``"auto"`` (time the candidates, pick the fastest), ``"chain"``, ``"tree"``, ``"none"`` or
        explicit paths. ``return_stats=True`` returns ``(sequences, stats)``: the draft that ran, rounds,
        drafted/accepted and emitted tokens, mean tokens emitted per round, and the seconds spent in prefill and in
        the rounds. ``cuda_graph`` (default: on for CUDA devices) runs each round as one captured CUDA graph
        over a fixed-shape cache; ``compile=True`` also compiles that round with ``torch.compile`` (fused
        kernels: faster rounds, but the first call of each batch size and draft compiles for a while; with
        ``draft="auto"`` it compiles its best few candidates and times them as the loop runs them;
        a backbone may compile its prefill too: MERaLiON-2's speech encoder and prompt pass, per batch size and
        prompt length). Captured rounds are kept for later calls; ``release_caches()`` frees them.
        """
        if args:
            kwargs.setdefault(self.backbone.required_inputs[0], args[0])
        _check_max_new_tokens(max_new_tokens)
        options = (options or self.options).but(draft=draft, cuda_graph=cuda_graph, compile=compile)
        reason = None if use_medusa else "disabled"
        parameters = parameter_tensors(self)  # (one walk a call: every check below reads it)
        reason = (reason or _activation_quantization(self.base, parameters)
                  or _generation_fallback_reason(kwargs, self.base.generation_config, self.backbone)
                  or self.backbone.unsupported_reason(kwargs))
        if reason is not None:
            if reason != "disabled":
                warnings.warn(f"Medusa decoding does not support {reason}; using the base model's generate.")
            out = self._base_generate(**_base_kwargs(kwargs, max_new_tokens, min_new_tokens))
            return (out, MedusaStats().as_dict()) if return_stats else out
        stats = MedusaStats()
        timer = PhaseTimer(self.backbone.device, enabled=return_stats)
        self._captured_calls(fuse=True, parameters=parameters)

        def decode(plan: WindowPlan):
            return self._decode(plan, options, stats, timer)

        sequences = self._each_window(kwargs, max_new_tokens, min_new_tokens, decode,
                                      self._replays_graphs(options.cuda_graph))
        return (sequences, {**stats.as_dict(), **timer.laps}) if return_stats else sequences

    def _each_window(self, kwargs: dict, max_new_tokens, min_new_tokens, decode, captured: bool = False):
        """The call's output, with ``decode(plan)`` decoding its batch directly, or each window inside the
        base's own generate where the backbone says the call takes it (timestamps, long-form, prompts); there,
        ``captured``, what the backbone runs of the base's replays as CUDA graphs."""
        if self.backbone.windowed(kwargs):
            capture = self.round_cache.calls if captured else None
            with self.backbone.around_base_generate(capture):
                return self._through_base_generate(kwargs, max_new_tokens, min_new_tokens, decode)
        _check_inputs(kwargs, self.backbone.required_inputs)
        plan = WindowPlan(kwargs, self.backbone.make_logits_processor(min_new_tokens), max_new_tokens,
                          self.backbone.eos_token_ids)
        return self.backbone.format_output(*decode(plan))

    def _decode(self, plan: WindowPlan, options: MedusaOptions, stats: MedusaStats, timer: PhaseTimer):
        """Prefill and Medusa rounds for one batch (a direct call, or one window of the base's generate);
        returns (tokens generated per row, the prompt)."""
        on_cuda, graphs = self.backbone.device.type == "cuda", self._replays_graphs(options.cuda_graph)
        captured = on_cuda if options.cuda_graph is None else options.cuda_graph  # off CUDA: fixed shapes, no capture
        fixed_shape = captured or options.compile
        candidates = self.draft_policy.candidates(options.draft)
        slack = self.draft_policy.cache_slack(candidates)
        pool = self.round_cache.pool if fixed_shape else None
        capture = self.round_cache.calls if graphs else None
        state, max_new, prompt = self.backbone.prefill(plan.inputs, plan.max_new_tokens, slack, plan.rules,
                                                       cache_pool=pool, capture=capture, compile=options.compile)
        timer.lap("prefill_seconds")
        key = TimingKey(state.lengths.device.type, str(self.dtype), state.next_token.shape[0], graphs,
                        compiled=graphs and options.compile)
        tree = self._choose_draft(candidates, state, plan.rules, key, options)
        chain_stop = 0.0 if fixed_shape else self._cpu_chain_stop(tree, state, plan.rules, options)
        window = MedusaStats(draft=tree.name)
        rounds = self._rounds(state, tree, plan.rules, options.compile, captured, fixed_shape, chain_stop, options)
        timer.lap("setup_seconds")  # choosing the draft (timed once per shape) and loading the rounds
        start = time.perf_counter()
        generated = run_rounds(rounds, state.next_token.tolist(), max_new, plan.eos_token_ids, window)
        timer.lap("rounds_seconds")
        if len(candidates) > 1:
            self.draft_policy.update(tree, window, key, time.perf_counter() - start)
        stats.add(window)
        return generated, prompt

    def _choose_draft(self, candidates, state, rules: LogitsRules, key: TimingKey, options) -> DraftTree:
        """The draft this call runs: ``auto``'s candidates timed where the policy asks for it, then its choice."""
        policy, contenders = self.draft_policy, self.draft_policy.contenders(candidates)
        if len(candidates) == 1 or len(contenders) == 1:
            return candidates[0] if len(candidates) == 1 else contenders[0]
        stand_in, device = key._replace(compiled=False), state.lengths.device
        self._time_drafts(contenders, stand_in, options, lambda tree: verify_pass_timer(
            self.backbone, self.make_drafter(tree, device, options), rules, state, tree, key.captured))
        if key.compiled:
            self._time_drafts(policy.shortlist(contenders, stand_in), key, options, lambda tree: loop_round_timer(
                self._rounds(state, tree, rules, True, True, True, options=options), state))
        credited = {tree for tree in contenders if not (key.captured or options.compile)
                    and self._cpu_chain_stop(tree, state, rules, options) >= CREDITED_CHAIN_STOP}
        return policy.choose(contenders, key, credited)

    def _time_drafts(self, trees, key: TimingKey, options, timer, drop_slow: bool = True) -> None:
        time_drafts(self.draft_policy, trees, key, self.timing_context(options), timer, drop_slow)

    def _cpu_chain_stop(self, tree: DraftTree, state: DecodeState, rules: LogitsRules, options) -> float:
        """Where this call's eager CPU chain stops drafting (``cpu_chain_stop``); 0 for other drafts and devices."""
        device = state.lengths.device
        if (device.type != "cpu" or not tree.is_chain or tree.num_nodes == 1
                or not getattr(self.make_drafter(tree, device, options), "stops_early", False)):
            return 0.0
        if options.cpu_chain_stop != "auto":
            return float(options.cpu_chain_stop)
        key = TimingKey("cpu", str(self.dtype), state.next_token.shape[0], captured=False)
        self._time_drafts(DraftPolicy.chain_stop_drafts(tree), key, options, lambda t: verify_pass_timer(
            self.backbone, self.make_drafter(t, device, options), rules, state, t, False), drop_slow=False)
        return self.draft_policy.chain_stop(tree, key)

    def _replays_graphs(self, cuda_graph) -> bool:
        """Whether this call replays CUDA graphs: on a CUDA base, unless ``cuda_graph=False``."""
        return self.backbone.device.type == "cuda" and cuda_graph is not False

    def _captured_calls(self, fuse: bool, parameters: list | None = None):
        """The round cache's captured calls, after dropping every capture made with weights since replaced
        (``parameters``: ``parameter_tensors(self)``, walked here when not given); with ``fuse`` the backbone's
        projections are fused then (a GPU round of a small model is a chain of tiny kernels), and the fused weights
        recorded as the ones the captures use (fusing gives the layers new tensors: unrecorded, the next call would
        drop every capture as stale and fuse again)."""
        cache = self.round_cache
        if cache.check_weights(parameter_tensors(self) if parameters is None else parameters) and fuse \
                and self.backbone.fuse_projections():
            cache.check_weights(parameter_tensors(self))
        return cache.calls

    def _through_base_generate(self, kwargs: dict, max_new_tokens, min_new_tokens, decode):
        """The base's own generate (long-form windows, timestamps, prompts, segments: all its code), with our
        ``decode(plan)`` as its decoding loop for every window it can describe as a ``WindowPlan``."""
        from transformers.generation.utils import GenerationMixin

        def decode_window(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
            plan = self.backbone.window_plan(input_ids, logits_processor, stopping_criteria, generation_config,
                                             model_kwargs)
            if isinstance(plan, str):
                if generation_config.do_sample:
                    warnings.warn(f"Temperature fallback: a window its thresholds rejected is retried at temperature "
                                  f"{generation_config.temperature:g} by the base's own sampling (Medusa decodes the "
                                  f"greedy attempts only).", stacklevel=2)
                else:
                    warnings.warn(f"Medusa decoding does not support {plan}; this window uses the base's own decoding.")
                return GenerationMixin._sample(model, input_ids, logits_processor, stopping_criteria,
                                               generation_config, **model_kwargs)
            generated, _ = decode(plan)
            sequences = torch.cat([input_ids, self.backbone.padded(generated, input_ids)], dim=1)
            return self.backbone.window_output(sequences, input_ids.shape[1], generation_config, model_kwargs)

        return self._base_generate(**_base_kwargs(kwargs, max_new_tokens, min_new_tokens), custom_generate=decode_window)

    def _base_generate(self, **kwargs):
        """The base's own generate, which leaves the model with the attention implementation it was loaded
        with: for return_token_timestamps Whisper's switches the whole model to eager attention (it reads
        the weights) and would leave it so for every later call."""
        implementation = self.base.config._attn_implementation
        try:
            return self.base.generate(**kwargs)
        finally:
            self.base.config._attn_implementation = implementation

    generate_medusa = generate

    def _rounds(self, state: DecodeState, tree: DraftTree, process: LogitsRules, compile: bool, captured: bool,
                fixed_shape: bool, chain_stop: float = 0.0, options: MedusaOptions | None = None):
        drafter = self.make_drafter(tree, state.lengths.device, options)
        if not fixed_shape:
            return EagerRounds(self.backbone, drafter, process, state, tree, int(state.lengths.max()), chain_stop)
        key = (id(state.cache), tree, process.key, id(self.drafter), compile, captured)
        return self.round_cache.runner(key, state, lambda: CapturedRounds(
            self.backbone, drafter, process, state, tree, use_graph=captured, compile=compile))

    def release_caches(self):
        """Free the captured rounds and their preallocated KV caches (GPU memory); later calls
        capture again."""
        self.round_cache.release()
        self.round_cache.signature = None

    @torch.no_grad()
    def collect_hidden_states(self, max_new_tokens: int | None = None, with_speech: bool = False, **inputs):
        """Greedy decode (one token a round); per row ``(tokens[T], hiddens[T, H])`` where
        ``hiddens[i]`` is the last-layer hidden state whose argmax produced ``tokens[i]``; with
        ``with_speech`` also the row's encoder output [L, H] (what speech-attending heads read). Calls that
        take the base's generate (Whisper timestamps, long-form) give one entry per row of every window."""
        _check_max_new_tokens(max_new_tokens)
        rows = []

        def decode(plan: WindowPlan):
            speech = None
            if with_speech:
                speech = self.backbone.encode(plan.inputs) if plan.inputs.get("encoder_outputs") is None else \
                    getattr(plan.inputs["encoder_outputs"], "last_hidden_state", plan.inputs["encoder_outputs"])
                plan.inputs["encoder_outputs"] = speech
            state, max_new, prompt = self.backbone.prefill(plan.inputs, plan.max_new_tokens, 1, plan.rules)
            hiddens = [[h] for h in state.hidden]
            rounds = EagerRounds(self.backbone, None, plan.rules, state, DraftTree(()), int(state.lengths.max()))
            tokens = run_rounds(rounds, state.next_token.tolist(), max_new, plan.eos_token_ids, hidden_log=hiddens)
            for i, (row, hidden) in enumerate(zip(tokens, hiddens)):
                rows.append((torch.tensor(row), torch.stack(hidden)) + ((speech[i],) if with_speech else ()))
            return tokens, prompt

        if not self.backbone.windowed(inputs):
            _check_inputs(inputs, self.backbone.required_inputs)
            reason = self.backbone.unsupported_reason(inputs)
            if reason is not None:  # e.g. right padding: the rows' last prompt positions would be padding
                raise ValueError(f"collect_hidden_states records the base's plain greedy decoding and cannot take "
                                 f"{reason}; build the inputs with prepare_audio_inputs.")
        self._each_window(inputs, max_new_tokens, None, decode)
        return rows

    # ------------------------------------------------------------------ audio convenience
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


MERaLiON2MedusaForASR = MedusaForASR  # the name the seed's snippet uses


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@functools.cache
def _code_digest() -> str:
    """A digest of the artifact's code files as they are here (a changed file: its timings anew)."""
    folder = Path(__file__).parent
    return _digest([(name, (folder / name).read_text()) for name in DECODING_CODE if (folder / name).is_file()])


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
        return (f"Could not load the base model {self.name!r} ({self.reason}). It is not a local folder, "
                f"{converted_base_folder(self.name)} holds no converted copy, and the Hub or its cache does not "
                f"have it: download it, convert it (Whisper tiny.en/base: python -m pipeline.real_whisper "
                f"{self.name}), or {how_to_point}.{offline}")


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
        raise BaseModelNotFound(str(source), f"{type(err).__name__}: {_first_line(err)}") from err
    if adapter:
        base = _merge_adapter(base, name_or_path)
    _undo_compressed_tensors_offloading(base)
    base.eval()
    return base, _load_processor(source, family, load_kwargs)


def resolve_base(name_or_path: str) -> str:
    """A folder as it is; a Hub id converted offline into ``cache_dir()`` (``pipeline.real_whisper``) as that
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
    """Where ``pipeline.real_whisper`` converts ``hub_id`` (``cache_dir()/<last part of the id>``)."""
    return cache_dir() / str(hub_id).rstrip("/").split("/")[-1]


def loading_fields(family: str) -> dict:
    """config.json's fields that tell transformers how to load an artifact of ``family``: its classes (for
    Whisper also as ``AutoModelForSpeechSeq2Seq``, the class the ASR pipeline and Whisper users reach for) and
    the ASR pipeline's class."""
    auto_map = {"AutoConfig": "configuration_medusa.MedusaConfig", "AutoModel": "modeling_medusa.MedusaForASR"}
    if BACKBONES[family].asr_pipeline:
        auto_map["AutoModelForSpeechSeq2Seq"] = "modeling_medusa.MedusaForASR"
    return {"auto_map": auto_map, "architectures": ["MedusaForASR"],
            "custom_pipelines": {"automatic-speech-recognition": ASR_PIPELINE}}


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
        warnings.warn(f"Loaded {source} without a processor ({type(err).__name__}: {_first_line(err)}); "
                      "prepare_audio_inputs and decode_text need one: pass processor= to from_pretrained.")
        return None


def _hub_silence(repo_id: str, load_kwargs: dict) -> str | None:
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

    silence = _hub_silence(repo_id, load_kwargs)
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
        raise BaseModelNotFound(str(source), _first_line(err)) from err
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


def _resolve_artifact(name_or_path, kwargs) -> str:
    if Path(str(name_or_path)).is_dir():
        return str(name_or_path)
    from huggingface_hub import snapshot_download

    hub = {"revision": kwargs.get("revision"), "token": kwargs.get("token")}
    silence = _hub_silence(str(name_or_path), hub)  # then the cache alone, not minutes of retries
    try:
        return snapshot_download(str(name_or_path), local_files_only=silence is not None, **hub)
    except Exception as err:
        cause = f"{silence}, and the Hugging Face cache has no copy" if silence else f"{type(err).__name__}: {err}"
        raise OSError(f"Could not find the Medusa artifact {name_or_path!r}: there is no such folder here "
                      f"({Path.cwd()}), and as a Hub repository id: {cause}") from err


def _named_base(folder) -> str:
    """The base the artifact's own config.json names (a ``config`` given to from_pretrained, e.g. AutoModel's with
    keyword arguments applied, may name another)."""
    try:
        return str(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))["base_model_name_or_path"])
    except (OSError, ValueError, KeyError):
        return ""


def _read_heads(path) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise ValueError(f"{path} is truncated or corrupt ({_first_line(err)}); download or export the heads "
                         "again.") from err


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _check_is_artifact(folder) -> None:
    """A folder that is not a Medusa artifact (e.g. a plain Whisper model) named as what it is, not read as an
    artifact with default settings (which would report missing heads for MERaLiON-2-3B)."""
    try:
        model_type = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError) as err:
        raise FileNotFoundError(f"{folder} is not a Medusa artifact: no readable config.json ({_first_line(err)}); "
                                f"give the folder that holds config.json and {HEADS_FILE}.") from err
    if model_type != MedusaConfig.model_type:
        heads = "" if (Path(folder) / HEADS_FILE).is_file() else f" and there is no {HEADS_FILE}"
        raise ValueError(f"{folder} is a {model_type!r} model, not a Medusa artifact: its config.json has model_type "
                         f"{model_type!r}, not {MedusaConfig.model_type!r}{heads}. Give the folder of trained heads "
                         "(e.g. heads/whisper-tiny.en); this folder can be their base.")


def _check_on_one_device(base) -> None:
    """The decode loop runs the base's layers itself, past accelerate's dispatch hooks, so a base split over
    several devices or offloaded (device_map) would compute with weights that are not where it runs."""
    placed = {str(device) for device in (getattr(base, "hf_device_map", None) or {}).values()}
    if len(placed) > 1 or placed & {"disk", "meta"}:
        raise ValueError(f"The base model is spread over {sorted(placed)} by its device_map; Medusa runs the base's "
                         "layers itself (without accelerate's hooks), so the whole base must sit on one device: "
                         "load it with one device, e.g. device_map='cuda:0' or 'cpu'.")


def _check_fits(config: MedusaConfig, backbone):
    if config.hidden_size != backbone.hidden_size:
        raise ValueError(
            f"Heads expect hidden size {config.hidden_size} but base {config.base_model_name_or_path!r} has "
            f"{backbone.hidden_size}: these heads were trained for another base."
        )
    if config.vocab_size != backbone.vocab_size:
        raise ValueError(
            f"Heads expect vocab size {config.vocab_size} but the base's output projection has "
            f"{backbone.vocab_size}: these heads were trained for another base."
        )


def _check_max_new_tokens(max_new_tokens):
    """The base's generate refuses fewer than one new token; so do we (instead of emitting one anyway)."""
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r} (as in the base's "
                         "generate); leave it unset for the base's default length.")


def _check_inputs(inputs: dict, required):
    missing = [name for name in required if inputs.get(name) is None]
    if missing:
        raise ValueError(f"generate() is missing required input(s) {missing}; build them with the base's processor.")


# Settings of the base's generate that change what greedy decoding emits and that the Medusa loop does not
# implement, with the values that leave greedy decoding as it is. (Temperature, top-k/p and the like only act
# when sampling, length_penalty only with beams: the generation mode covers them.)
GREEDY_AS_IS = {
    "repetition_penalty": (1.0,), "encoder_repetition_penalty": (1.0,), "no_repeat_ngram_size": (0,),
    "encoder_no_repeat_ngram_size": (0,), "bad_words_ids": ([],), "sequence_bias": ({}, []),
    "forced_bos_token_id": (), "forced_eos_token_id": (), "exponential_decay_length_penalty": (),
    "min_length": (0,), "guidance_scale": (1.0,), "max_time": (), "stop_strings": ([], ""),
    "watermarking_config": (), "token_healing": (False,), "num_return_sequences": (1,),
    "return_dict_in_generate": (False,), "output_scores": (False,), "output_logits": (False,),
    "output_attentions": (False,), "output_hidden_states": (False,),
}
# generate() arguments that are objects or callbacks the Medusa loop cannot apply.
CALL_ONLY_OPTIONS = ("generation_config", "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn",
                     "assistant_model", "streamer", "negative_prompt_ids", "custom_generate")
MODE_NAMES = {"sample": "sampling", "beam_sample": "beam sampling"}


def _activation_quantization(base, parameters: list) -> str | None:
    """Why a base with quantised activations is decoded by its own generate: each activation is rounded to
    a few bits, so the last-bit differences of verifying several tokens in one pass can move it to the
    next level, and the output would not be the base's own (weight-only quantisation is exact).
    ``parameters``: ``parameter_tensors`` of the model holding ``base``."""
    # every call runs this: plain parameters (the type itself) are passed over first
    if not any(type(p) is not torch.nn.Parameter and hasattr(p, "act_quant_kwargs") for p in parameters):
        return None
    for name, module in base.named_modules():
        weight = getattr(module, "weight", None)
        if getattr(weight, "act_quant_kwargs", None) is not None:  # torchao dynamic activation quantisation
            return f"a base with quantised activations ({name}: {type(weight).__name__}, dynamic activation scales)"
    return None


def parameter_tensors(module: torch.nn.Module) -> list:
    """Every parameter of ``module`` and its submodules, in a fixed order, a tied one once per module holding it:
    what ``module.parameters()`` yields, without its generators and de-duplication, which cost more than the
    checks every call runs over them (whisper-tiny.en with its heads, 208 tensors: their signature 287 us through
    ``parameters()`` against 138 on the 2-core development CPU; ``benchmarks/round_cost/host_checks.py``)."""
    tensors, stack = [], [module]
    while stack:
        current = stack.pop()
        tensors += [p for p in current._parameters.values() if p is not None]
        stack += [m for m in reversed(current._modules.values()) if m is not None]
    return tensors


def _generation_fallback_reason(kwargs: dict, base_config, backbone) -> str | None:
    """The first setting that makes the base's generate decode other than by the plain greedy search the
    Medusa loop reproduces, named with where it came from; None when there is none. Settings are those of
    the base's generation config updated with this call's, as the base's generate merges them; the backbone
    says which options its family's decoding leaves out and which it reads from the base's config."""
    for name in CALL_ONLY_OPTIONS:
        if kwargs.get(name) is not None:
            return f"the {name} argument"
    merged = copy.copy(base_config)  # (attributes are only replaced below, never changed in place)
    for name, value in kwargs.items():
        if hasattr(merged, name):
            setattr(merged, name, value)

    def named(name: str) -> str:
        value = kwargs[name] if name in kwargs else getattr(merged, name, None)
        origin = "" if name in kwargs else ", set in the base's generation_config"
        return f"{name}={_short_repr(value)}{origin}"

    mode = str(getattr(merged.get_generation_mode(), "value", "greedy_search"))
    if mode != "greedy_search":
        differs = [n for n in ("do_sample", "num_beams", "num_beam_groups", "penalty_alpha", "constraints",
                               "force_words_ids", "dola_layers", "prompt_lookup_num_tokens", "assistant_early_exit")
                   if not _is_mode_default(getattr(merged, n, None))]
        return f"{MODE_NAMES.get(mode, mode.replace('_', ' '))} ({', '.join(named(n) for n in differs)})"
    if (sampling := backbone.sampling_option(kwargs)) is not None:
        option, why = sampling
        return f"sampling ({named(option)}: {why})"
    as_is = {**GREEDY_AS_IS, **backbone.greedy_as_is}
    for name, neutral in as_is.items():
        value = kwargs[name] if name in kwargs else getattr(merged, name, None)
        if not (value is None or (not torch.is_tensor(value) and value in neutral)):
            return named(name)
    for name in backbone.base_config_settings:
        if name in kwargs and kwargs[name] != getattr(base_config, name, None):
            return f"{named(name)} (the decoder applies the base's own {name})"
    return None


def _is_mode_default(value) -> bool:
    return value is None or value is False or (type(value) in (int, float) and value in (0, 1))


def _short_repr(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _base_kwargs(kwargs, max_new_tokens, min_new_tokens) -> dict:
    out = dict(kwargs)
    if max_new_tokens is not None:
        out["max_new_tokens"] = max_new_tokens
    if min_new_tokens is not None:
        out["min_new_tokens"] = min_new_tokens
    return out
