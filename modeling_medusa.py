"""Medusa heads for speech recognition models, as a Hugging Face remote-code model.

``MedusaForASR.from_pretrained(repo)`` loads the base model named in the config (MERaLiON-2 or
Whisper), grafts K residual heads that share the base's output projection, and ``generate``
drafts with the heads and verifies with the base: the output is the base's own greedy output.
"""

from __future__ import annotations

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
    from .backbone import Backbone  # noqa: F401
    from .backbone_meralion2 import MERaLiON2Backbone  # noqa: F401
    from .backbone_whisper import WhisperBackbone  # noqa: F401
    from .base_loading import (BACKBONES, BaseCodeNotTrusted, BaseModelNotFound,  # noqa: F401
                               converted_base_folder, detect_family, first_line, hub_silence, load_base_model,
                               resolve_base, _undo_compressed_tensors_offloading)
    from .configuration_medusa import MedusaConfig
    from .cpu_kernels import Projection, keep_new_forms, recall_forms  # noqa: F401
    from .draft_policy import CREDITED_CHAIN_STOP, DraftPolicy, TimingKey, TimingStore, processor_name
    from .draft_timing import PhaseTimer, loop_round_timer, time_drafts, verify_pass_timer
    from .draft_trees import DraftTree
    from .generation_checks import (activation_quantization, base_kwargs, check_fits, check_inputs,
                                    check_max_new_tokens, check_on_one_device, generation_fallback_reason,
                                    parameter_tensors)
    from .kv_cache import DecodeState
    from .logits_rules import LogitsRules
    from .medusa_decoding import EagerRounds, MedusaStats, WindowPlan, run_rounds
    from .medusa_fast import CapturedRounds, RoundCache
    from .medusa_heads import (DraftProjection, MedusaDrafter, MedusaHeads, PathDrafter,  # noqa: F401
                               FusedPathDrafter, FusedPathWeights, build_heads, int8_drafting_copy,
                               int8_drafting_supported)
    from .medusa_options import MedusaOptions
    from .speech_io import SpeechIO
except ImportError:
    from backbone import Backbone  # noqa: F401
    from backbone_meralion2 import MERaLiON2Backbone  # noqa: F401
    from backbone_whisper import WhisperBackbone  # noqa: F401
    from base_loading import (BACKBONES, BaseCodeNotTrusted, BaseModelNotFound,  # noqa: F401
                              converted_base_folder, detect_family, first_line, hub_silence, load_base_model,
                              resolve_base, _undo_compressed_tensors_offloading)
    from configuration_medusa import MedusaConfig
    from cpu_kernels import Projection, keep_new_forms, recall_forms  # noqa: F401
    from draft_policy import CREDITED_CHAIN_STOP, DraftPolicy, TimingKey, TimingStore, processor_name
    from draft_timing import PhaseTimer, loop_round_timer, time_drafts, verify_pass_timer
    from draft_trees import DraftTree
    from generation_checks import (activation_quantization, base_kwargs, check_fits, check_inputs,
                                   check_max_new_tokens, check_on_one_device, generation_fallback_reason,
                                   parameter_tensors)
    from kv_cache import DecodeState
    from logits_rules import LogitsRules
    from medusa_decoding import EagerRounds, MedusaStats, WindowPlan, run_rounds
    from medusa_fast import CapturedRounds, RoundCache
    from medusa_heads import (DraftProjection, MedusaDrafter, MedusaHeads, PathDrafter,  # noqa: F401
                              FusedPathDrafter, FusedPathWeights, build_heads, int8_drafting_copy,
                              int8_drafting_supported)
    from medusa_options import MedusaOptions
    from speech_io import SpeechIO

HEADS_FILE = "medusa_heads.safetensors"
DRAFT_VOCAB_KEY = "draft_vocab"  # int64 [V_draft]: the token ids the heads project onto (optional)
CODE_FILES = ("configuration_medusa.py", "modeling_medusa.py", "medusa_options.py", "base_loading.py",
              "generation_checks.py", "speech_io.py", "medusa_decoding.py", "medusa_fast.py", "medusa_heads.py",
              "draft_policy.py", "draft_timing.py", "draft_trees.py", "kv_cache.py", "logits_rules.py", "backbone.py",
              "cpu_kernels.py", "backbone_whisper.py", "backbone_meralion2.py", "asr_pipeline.py")
# The code a decode runs, whose digest keys the kept draft timings: what transformers copies for trust_remote_code
# (the ASR pipeline's file is loaded apart), so a model loaded through the API and one the command line imports
# find the same entry.
DECODING_CODE = tuple(name for name in CODE_FILES if name != "asr_pipeline.py")
# transformers.pipeline("automatic-speech-recognition", model=<artifact>, trust_remote_code=True) builds this class
# (for a family it does not run, it says so in one line)
ASR_PIPELINE = {"impl": "asr_pipeline.MedusaSpeechRecognitionPipeline", "pt": ["AutoModel"], "tf": [], "type": "audio"}
TRAIN_HINT = ("Train heads for this base with: python -m pipeline.collect --base BASE --audio AUDIO && "
              "python -m pipeline.train ... && python -m pipeline.export ... (see README.md).")


class MedusaForASR(SpeechIO, PreTrainedModel):
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
        self.drafter = None  # a stand-in for the heads (hidden [..., H] -> logits [..., K, V]): tests, replays
        self.options = options or MedusaOptions()
        self.draft_policy = DraftPolicy(config, TimingStore.at(self.options.draft_timings))
        self.round_cache = RoundCache()
        self._drafters: dict = {}
        self._fused_path_weights = None
        self._timing_context = (None, None)
        self._languages = (None, frozenset())
        if base is not None:
            self.generation_config = base.generation_config  # what callers such as the ASR pipeline read
            self.main_input_name = self.backbone.required_inputs[0]
            self.backbone.kernels = self.options.kernels
            check_fits(config, self.backbone)
            check_on_one_device(base)
            base.requires_grad_(False)
            self.medusa_heads.to(next(base.parameters()))  # the base's device and dtype

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, base_model=None,
                        base_model_name_or_path=None, processor=None, trust_base_remote_code: bool = False,
                        options: MedusaOptions | None = None, **kwargs):
        """Load the artifact: its config, the base it names and the trained heads. A base's own code (MERaLiON-2)
        runs for the base the artifact names, else only with ``trust_base_remote_code=True``."""
        folder = _resolve_artifact(pretrained_model_name_or_path, kwargs)
        config, heads_path = _artifact_config(folder, config)
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
        """Fresh (zero-initialised) heads on a frozen base, for training (MERaLiON-2: ``trust_base_remote_code``)."""
        if base_model is None:
            base_model, processor = load_base_model(base_model_name_or_path, family,
                                                    trust_base_code=trust_base_remote_code, **kwargs)
        family = family or detect_family(base_model)
        backbone = BACKBONES[family](base_model)
        config = MedusaConfig(base_model_name_or_path=str(base_model_name_or_path), base_family=family,
                              medusa_num_heads=medusa_num_heads, medusa_num_layers=medusa_num_layers,
                              hidden_size=backbone.hidden_size, vocab_size=backbone.vocab_size, head_kind=head_kind,
                              speech_attention=speech_attention)
        return cls(config, base=base_model, processor=processor).eval()

    def load_heads(self, path):
        state = _read_heads(path)
        self.set_draft_vocab(state.pop(DRAFT_VOCAB_KEY, None))
        expected = self.medusa_heads.state_dict()
        _check_heads(path, state, expected, self.config)
        self.medusa_heads.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)

    def save_pretrained(self, save_directory, **kwargs):
        """Write config.json, the heads and the code files (never the base weights), atomically."""
        _save_artifact(self, Path(save_directory))

    @classmethod
    def can_generate(cls) -> bool:
        """Said outright: the library's guess depends on how the class was loaded, and the ASR pipeline sets up its
        generation arguments only for models that can generate."""
        return True

    @property
    def family(self) -> str:
        return self.config.base_family

    def set_draft_vocab(self, token_ids) -> None:
        """Restrict the heads' projection to these token ids (None: the whole vocabulary)."""
        ids = None if token_ids is None else _checked_draft_vocab(token_ids, self.config.vocab_size)
        self.draft_vocab = None if ids is None else ids.to(next(self.medusa_heads.parameters()).device)
        self.config.draft_vocab_size = None if ids is None else len(ids)
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
        if self.backbone is not None:
            self.backbone.kernels = self.options.kernels
        return self.options

    def make_drafter(self, tree: DraftTree, device, options: MedusaOptions | None = None):
        """``drafter(state) -> chunk [B, N]`` for ``tree`` (None for plain greedy); kept per tree."""
        return None if tree.num_nodes == 1 else _kept_drafter(self, tree, device, options or self.options)

    def timing_context(self, options: MedusaOptions | None = None) -> str | None:
        """What the draft timings kept between processes are found by besides their ``TimingKey`` (``_timing_context``);
        None (nothing kept) with a stand-in drafter (tests, replayed benchmarks)."""
        if self.drafter is not None or self.backbone is None:
            return None
        options = options or self.options
        signature = (id(self.base), self.backbone.device, torch.get_num_threads(), self.config.draft_vocab_size,
                     options.int8_cpu_drafting, options.fused_path_drafting)
        if self._timing_context[0] != signature:  # (kept: every auto call asks, a GPU call's host time counts)
            self._timing_context = (signature, _timing_context(self.backbone, self.config, options))
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

        ``use_medusa=False`` runs the base's own generate; so do sampling, beam search and options the Medusa loop
        does not implement (with a warning). ``options`` (default: ``model.options``) say how to decode
        (``MedusaOptions``); ``draft``, ``cuda_graph`` and ``compile``, where given, replace theirs. Captured rounds
        are kept for later calls (``release_caches()`` frees them). ``return_stats=True`` returns ``(sequences,
        stats)``: the draft that ran, rounds, drafted/accepted and emitted tokens, mean tokens emitted per round,
        and the seconds spent in prefill, in setting up (choosing the draft) and in the rounds.
        """
        if args:
            kwargs.setdefault(self.backbone.required_inputs[0], args[0])
        check_max_new_tokens(max_new_tokens)
        options = (options or self.options).but(draft=draft, cuda_graph=cuda_graph, compile=compile)
        reason = None if use_medusa else "disabled"
        parameters = parameter_tensors(self)  # (one walk a call: every check below reads it)
        reason = (reason or activation_quantization(self.base, parameters)
                  or generation_fallback_reason(kwargs, self.base.generation_config, self.backbone)
                  or self.backbone.unsupported_reason(kwargs))
        if reason is not None:
            if reason != "disabled":
                warnings.warn(f"Medusa decoding does not support {reason}; using the base model's generate.")
            out = self._base_generate(**base_kwargs(kwargs, max_new_tokens, min_new_tokens))
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
                return _through_base_generate(self, kwargs, max_new_tokens, min_new_tokens, decode)
        check_inputs(kwargs, self.backbone.required_inputs)
        plan = WindowPlan(kwargs, self.backbone.make_logits_processor(min_new_tokens), max_new_tokens,
                          self.backbone.eos_token_ids)
        return self.backbone.format_output(*decode(plan))

    def _decode(self, plan: WindowPlan, options: MedusaOptions, stats: MedusaStats, timer: PhaseTimer):
        """Prefill and Medusa rounds for one batch (a direct call, or one window of the base's generate);
        returns (tokens generated per row, the prompt)."""
        on_cuda, graphs = self.backbone.device.type == "cuda", self._replays_graphs(options.cuda_graph)
        _suggest_bfloat16(on_cuda, self.dtype)
        captured = on_cuda if options.cuda_graph is None else options.cuda_graph  # off CUDA: fixed shapes, no capture
        fixed_shape = captured or options.compile
        store = self.draft_policy.store
        forms_context = None if on_cuda or store is None else self.timing_context(options)
        if forms_context is not None:
            recall_forms(store, forms_context)  # (the CPU product forms earlier processes timed)
        candidates = self.draft_policy.candidates(options.draft)
        slack = self.draft_policy.cache_slack(candidates)
        pool = self.round_cache.pool if fixed_shape else None
        capture = self.round_cache.calls if graphs else None
        state, max_new, prompt = self.backbone.prefill(plan.inputs, plan.max_new_tokens, slack, plan.rules,
                                                       cache_pool=pool, capture=capture, compile=options.compile)
        timer.lap("prefill_seconds")
        key = TimingKey(state.lengths.device.type, str(self.dtype), state.next_token.shape[0], graphs,
                        compiled=graphs and options.compile)
        if options.draft == "auto" and not self._heads_know(prompt):
            candidates = [DraftTree(())]
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
        if forms_context is not None:
            keep_new_forms(store, forms_context)
        stats.add(window)
        return generated, prompt

    def _heads_know(self, prompt: torch.Tensor) -> bool:
        """False where every language the call's prompt names is one the heads were not trained on: ``auto``
        then decodes without drafts (English-trained heads accept ~1.1-1.4 tokens a pass on other languages,
        which makes a round cost more than it emits). True where either side names no language."""
        data = self.config.training_data
        if self._languages[0] is not data:  # (kept: every auto call asks)
            self._languages = (data, frozenset((data or {}).get("languages") or ()))
        trained = self._languages[1]
        spoken = self.backbone.prompt_languages(prompt) if trained else set()
        return not spoken or bool(spoken & trained)

    def _choose_draft(self, candidates, state, rules: LogitsRules, key: TimingKey, options) -> DraftTree:
        """The draft this call runs: ``auto``'s candidates timed where the policy asks for it, then its choice."""
        policy = self.draft_policy
        if len(candidates) == 1:
            return candidates[0]
        if (settled := policy.settled(candidates, key)) is not None:
            return settled
        contenders = policy.contenders(candidates)
        if len(contenders) == 1:
            return contenders[0]
        stand_in, device = key._replace(compiled=False), state.lengths.device
        self._time_drafts(contenders, stand_in, options, lambda tree: verify_pass_timer(
            self.backbone, self.make_drafter(tree, device, options), rules, state, tree, key.captured))
        if key.compiled:
            self._time_drafts(policy.shortlist(contenders, stand_in), key, options, lambda tree: loop_round_timer(
                self._rounds(state, tree, rules, True, True, True, options=options), state))
        credited = {tree for tree in contenders if not (key.captured or options.compile)
                    and self._cpu_chain_stop(tree, state, rules, options) >= CREDITED_CHAIN_STOP}
        return policy.choose(candidates, key, credited)

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
        (``parameters``: ``parameter_tensors(self)``); with ``fuse`` the backbone's projections are fused then, and
        the fused weights recorded as the ones the captures use (else the next call would drop them as stale)."""
        cache = self.round_cache
        if cache.check_weights(parameter_tensors(self) if parameters is None else parameters) and fuse \
                and self.backbone.fuse_projections():
            cache.check_weights(parameter_tensors(self))
        return cache.calls

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
        device = state.lengths.device
        if not fixed_shape:
            return EagerRounds(self.backbone, self.make_drafter(tree, device, options), process, state, tree,
                               int(state.lengths.max()), chain_stop)
        # a kept runner needs no drafter: new heads change the weights every call checks, which drops the runners
        key = (id(state.cache), tree, process.key, id(self.drafter), compile, captured)
        return self.round_cache.runner(key, state, lambda: CapturedRounds(
            self.backbone, self.make_drafter(tree, device, options), process, state, tree, use_graph=captured,
            compile=compile))

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
        return _collect_hidden_states(self, max_new_tokens, with_speech, inputs)


MERaLiON2MedusaForASR = MedusaForASR  # the name the seed's snippet uses


class Float32OnGPU(UserWarning):
    """A model decoding in float32 on a GPU, where bfloat16 would be faster."""


def _suggest_bfloat16(on_cuda: bool, dtype: torch.dtype) -> None:
    """One line (Python shows a warning from one place once) for a float32 model on a GPU: transformers loads
    Whisper in float32 unless told otherwise, and there every product runs at float32's rate."""
    if on_cuda and dtype == torch.float32:
        warnings.warn("Decoding in float32 on a GPU: load with dtype=torch.bfloat16 for faster rounds (ids then equal "
                      "the bfloat16 base's; they part from float32's only at near-ties of its top two scores).",
                      Float32OnGPU, stacklevel=2)


def _artifact_config(folder: str, config) -> tuple[MedusaConfig, Path]:
    """The artifact's config (``config`` where it is one, e.g. AutoConfig's with keyword arguments applied) and its
    heads file, which must exist."""
    if getattr(config, "model_type", None) == MedusaConfig.model_type:
        config = config if isinstance(config, MedusaConfig) else MedusaConfig.from_dict(config.to_dict())
    else:
        _check_is_artifact(folder)
        config = MedusaConfig.from_pretrained(folder)
    heads_path = Path(folder) / HEADS_FILE
    if not heads_path.is_file():
        raise FileNotFoundError(f"No {HEADS_FILE} in {folder}: this artifact has no trained heads for "
                                f"{config.base_model_name_or_path}. {TRAIN_HINT}")
    return config, heads_path


def _kept_drafter(model: MedusaForASR, tree: DraftTree, device, options: MedusaOptions):
    """The model's drafter for ``tree`` on ``device``, built once (again when the heads change)."""
    int8 = options.int8_cpu_drafting and int8_drafting_supported(device)
    fused = (torch.device(device).type in options.fused_path_drafting and model.drafter is None
             and FusedPathWeights.supports(model.medusa_heads, model.draft_vocab))
    # an int8 or fused drafter holds derived copies of the heads: a new one once they change (training, a reload)
    heads_version = tuple((p.data_ptr(), p._version) for p in parameter_tensors(model.medusa_heads)) \
        if int8 or fused else None
    key = (tree, str(device), id(model.drafter), heads_version, fused)
    if key not in model._drafters:
        model._drafters = {k: d for k, d in model._drafters.items() if k[3] in (None, heads_version)}
        model._drafters[key] = _build_drafter(model, tree, device, int8, heads_version if fused else None)
    return model._drafters[key]


def _through_base_generate(model: MedusaForASR, kwargs: dict, max_new_tokens, min_new_tokens, decode):
    """The base's own generate (long-form windows, timestamps, prompts, segments: all its code), with our
    ``decode(plan)`` as its decoding loop for every window it can describe as a ``WindowPlan``."""
    from transformers.generation.utils import GenerationMixin

    def decode_window(base, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        plan = model.backbone.window_plan(input_ids, logits_processor, stopping_criteria, generation_config,
                                         model_kwargs)
        if isinstance(plan, str):
            if generation_config.do_sample:
                warnings.warn(f"Temperature fallback: a window its thresholds rejected is retried at temperature "
                              f"{generation_config.temperature:g} by the base's own sampling (Medusa decodes the "
                              f"greedy attempts only).", stacklevel=2)
            else:
                warnings.warn(f"Medusa decoding does not support {plan}; this window uses the base's own decoding.")
            return GenerationMixin._sample(base, input_ids, logits_processor, stopping_criteria,
                                           generation_config, **model_kwargs)
        generated, _ = decode(plan)
        sequences = torch.cat([input_ids, model.backbone.padded(generated, input_ids)], dim=1)
        return model.backbone.window_output(sequences, input_ids.shape[1], generation_config, model_kwargs)

    return model._base_generate(**base_kwargs(kwargs, max_new_tokens, min_new_tokens), custom_generate=decode_window)


def _collect_hidden_states(model: MedusaForASR, max_new_tokens, with_speech: bool, inputs: dict) -> list:
    check_max_new_tokens(max_new_tokens)
    rows = []

    def decode(plan: WindowPlan):
        speech = None
        if with_speech:
            speech = model.backbone.encode(plan.inputs) if plan.inputs.get("encoder_outputs") is None else \
                getattr(plan.inputs["encoder_outputs"], "last_hidden_state", plan.inputs["encoder_outputs"])
            plan.inputs["encoder_outputs"] = speech
        state, max_new, prompt = model.backbone.prefill(plan.inputs, plan.max_new_tokens, 1, plan.rules)
        hiddens = [[h] for h in state.hidden]
        rounds = EagerRounds(model.backbone, None, plan.rules, state, DraftTree(()), int(state.lengths.max()))
        tokens = run_rounds(rounds, state.next_token.tolist(), max_new, plan.eos_token_ids, hidden_log=hiddens)
        for i, (row, hidden) in enumerate(zip(tokens, hiddens)):
            rows.append((torch.tensor(row), torch.stack(hidden)) + ((speech[i],) if with_speech else ()))
        return tokens, prompt

    if not model.backbone.windowed(inputs):
        check_inputs(inputs, model.backbone.required_inputs)
        reason = model.backbone.unsupported_reason(inputs)
        if reason is not None:  # e.g. right padding: the rows' last prompt positions would be padding
            raise ValueError(f"collect_hidden_states records the base's plain greedy decoding and cannot take "
                             f"{reason}; build the inputs with prepare_audio_inputs.")
    model._each_window(inputs, max_new_tokens, None, decode)
    return rows


def _checked_draft_vocab(token_ids, vocab_size: int) -> torch.Tensor:
    """``token_ids`` as a draft vocabulary, or ValueError naming what is wrong with them."""
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    if ids.ndim != 1 or not len(ids):
        raise ValueError(f"draft vocabulary must be 1-D token ids; got shape {tuple(ids.shape)}")
    outside = ids[(ids < 0) | (ids >= vocab_size)]
    if len(outside):
        raise ValueError(f"draft vocabulary holds token id {int(outside[0])}, outside the base's vocabulary "
                         f"[0, {vocab_size}): these heads are for another base, or their {DRAFT_VOCAB_KEY} is "
                         "corrupt; export them again (pipeline.export).")
    return ids


def _check_heads(path, state: dict, expected: dict, config: MedusaConfig) -> None:
    """ValueError naming the problem where the heads file ``path`` does not fit the heads ``config`` describes."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path} does not match config ({config.medusa_num_heads} heads x {config.medusa_num_layers} "
                         f"blocks): missing {missing[:4]}, unexpected {unexpected[:4]}.")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{path}: {name} has shape {tuple(tensor.shape)} but the base needs "
                             f"{tuple(expected[name].shape)} (hidden size {config.hidden_size}); these heads were "
                             "trained for another base.")
        if not tensor.is_floating_point():
            raise ValueError(f"{path}: {name} has dtype {tensor.dtype}; heads must be floating point.")


def _save_artifact(model: MedusaForASR, target: Path) -> None:
    from safetensors.torch import save

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex}"
    tmp.mkdir()  # not mkdtemp: its 0700 would make the artifact unreadable to others; mkdir keeps the umask
    try:
        if target.is_dir():
            shutil.copytree(target, tmp, dirs_exist_ok=True)
        for name, value in loading_fields(model.family).items():
            setattr(model.config, name, value)
        model.config.save_pretrained(tmp)
        if model.processor is not None and BACKBONES[model.family].asr_pipeline:
            model.processor.save_pretrained(tmp)  # the tokenizer and feature extractor the ASR pipeline loads
        heads = {k: v.detach().contiguous().cpu() for k, v in model.medusa_heads.state_dict().items()}
        if model.draft_vocab is not None:
            heads[DRAFT_VOCAB_KEY] = model.draft_vocab.detach().to("cpu", torch.long).contiguous()
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


def _fused_weights(model: MedusaForASR, projection: DraftProjection, heads_version) -> FusedPathWeights:
    """The heads rearranged for fused drafting, shared by every tree's drafter; made again when the heads or
    the draft rows change (a new base's weights give new rows)."""
    rows = projection.weight()
    version = (heads_version, rows.data_ptr())
    if model._fused_path_weights is None or model._fused_path_weights[0] != version:
        with torch.no_grad():
            weights = FusedPathWeights(model.medusa_heads, rows, model.draft_vocab, model.backbone.embed)
        model._fused_path_weights = (version, weights)
    return model._fused_path_weights[1]

def _build_drafter(model: MedusaForASR, tree: DraftTree, device, int8: bool = False, fused_heads_version=None):
    """The drafter for ``tree``; with ``fused_heads_version`` (the heads' version), the fused path drafter."""
    if model.drafter is not None:  # a stand-in for the heads: full-vocabulary logits per head
        return MedusaDrafter(tree, device, model.drafter)
    if tree.depth > model.config.medusa_num_heads:
        raise ValueError(f"draft tree of depth {tree.depth} needs {tree.depth} heads; "
                         f"this artifact has {model.config.medusa_num_heads}.")
    projection = model.draft_projection(int8)
    heads = int8_drafting_copy(model.medusa_heads) if int8 else model.medusa_heads
    if model.config.head_kind == "medusa":
        return MedusaDrafter(tree, device, lambda hidden: projection.logits(heads(hidden)), projection.token_ids)
    speech = model.backbone.speech_memory if model.config.speech_attention else None
    if fused_heads_version is not None:
        return FusedPathDrafter(tree, device, heads, projection, model.backbone.embed, speech,
                                _fused_weights(model, projection, fused_heads_version))
    return PathDrafter(tree, device, heads, projection, model.backbone.embed, speech)


def _timing_context(backbone, config: MedusaConfig, options: MedusaOptions) -> str:
    """What one verify pass's time depends on besides the draft and its ``TimingKey``: the machine (the CPU's or GPU's
    name, torch's threads), torch's version, this artifact's decoding code, the base's configuration (its shapes, a
    quantisation) and the heads' and drafting settings."""
    device = backbone.device
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else processor_name()
    base = {k: v for k, v in backbone.base.config.to_dict().items() if not k.startswith("_")
            and k != "transformers_version"}
    heads = {k: getattr(config, k) for k in ("head_kind", "medusa_num_heads", "medusa_num_layers", "hidden_size",
                                             "speech_attention", "draft_vocab_size")}
    model = _digest([base, heads, options.int8_cpu_drafting, list(options.fused_path_drafting)])
    return f"{machine} | {torch.get_num_threads()} threads | torch {torch.__version__} | code {_code_digest()} | " \
           f"model {model}"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@functools.cache
def _code_digest() -> str:
    """A digest of the artifact's code files as they are here (a changed file: its timings anew)."""
    folder = Path(__file__).parent
    return _digest([(name, (folder / name).read_text()) for name in DECODING_CODE if (folder / name).is_file()])


def loading_fields(family: str) -> dict:
    """config.json's fields that tell transformers how to load an artifact of ``family``: its classes (for
    Whisper also as ``AutoModelForSpeechSeq2Seq``, the class the ASR pipeline and Whisper users reach for) and
    the ASR pipeline's class."""
    auto_map = {"AutoConfig": "configuration_medusa.MedusaConfig", "AutoModel": "modeling_medusa.MedusaForASR"}
    if BACKBONES[family].asr_pipeline:
        auto_map["AutoModelForSpeechSeq2Seq"] = "modeling_medusa.MedusaForASR"
    return {"auto_map": auto_map, "architectures": ["MedusaForASR"],
            "custom_pipelines": {"automatic-speech-recognition": ASR_PIPELINE}}


def _resolve_artifact(name_or_path, kwargs) -> str:
    if Path(str(name_or_path)).is_dir():
        return str(name_or_path)
    from huggingface_hub import snapshot_download

    hub = {"revision": kwargs.get("revision"), "token": kwargs.get("token")}
    silence = hub_silence(str(name_or_path), hub)  # then the cache alone, not minutes of retries
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
        raise ValueError(f"{path} is truncated or corrupt ({first_line(err)}); download or export the heads "
                         "again.") from err


def _check_is_artifact(folder) -> None:
    """A folder that is not a Medusa artifact (e.g. a plain Whisper model) named as what it is, not read as an
    artifact with default settings (which would report missing heads for MERaLiON-2-3B)."""
    try:
        model_type = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError) as err:
        raise FileNotFoundError(f"{folder} is not a Medusa artifact: no readable config.json ({first_line(err)}); "
                                f"give the folder that holds config.json and {HEADS_FILE}.") from err
    if model_type != MedusaConfig.model_type:
        heads = "" if (Path(folder) / HEADS_FILE).is_file() else f" and there is no {HEADS_FILE}"
        raise ValueError(f"{folder} is a {model_type!r} model, not a Medusa artifact: its config.json has model_type "
                         f"{model_type!r}, not {MedusaConfig.model_type!r}{heads}. Give the folder of trained heads "
                         "(e.g. heads/whisper-tiny.en); this folder can be their base.")
