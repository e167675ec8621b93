"""Medusa heads for speech recognition models, as a Hugging Face remote-code model.

``MedusaForASR.from_pretrained(repo)`` loads the base model named in the config (MERaLiON-2 or
Whisper), grafts K residual heads that share the base's output projection, and ``generate``
drafts with the heads and verifies with the base: the output is the base's own greedy output.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
import uuid
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PreTrainedModel

try:
    from .backbone_meralion2 import MERaLiON2Backbone
    from .backbone_whisper import WhisperBackbone
    from .configuration_medusa import MedusaConfig
    from .medusa_decoding import (CachePool, DraftTree, MedusaStats, build_tree_from_accuracy,
                                  expected_tokens_per_round, medusa_decode, project_without_drafts)
    from .medusa_fast import StaticRoundRunner, capture_cuda_graph
except ImportError:
    from backbone_meralion2 import MERaLiON2Backbone
    from backbone_whisper import WhisperBackbone
    from configuration_medusa import MedusaConfig
    from medusa_decoding import (CachePool, DraftTree, MedusaStats, build_tree_from_accuracy,
                                 expected_tokens_per_round, medusa_decode, project_without_drafts)
    from medusa_fast import StaticRoundRunner, capture_cuda_graph

HEADS_FILE = "medusa_heads.safetensors"
CODE_FILES = ("configuration_medusa.py", "modeling_medusa.py", "medusa_decoding.py", "medusa_fast.py",
              "backbone_whisper.py", "backbone_meralion2.py")
BACKBONES = {"whisper": WhisperBackbone, "meralion2": MERaLiON2Backbone}
BASE_LOAD_KWARGS = ("torch_dtype", "dtype", "device_map", "attn_implementation", "quantization_config",
                    "revision", "token", "cache_dir", "local_files_only", "low_cpu_mem_usage")
AUTO_TREE_SIZES = (8, 32, 64)  # draft nodes of the extra trees draft="auto" times
# New tokens per window by default in the transcription command, the benchmark and the model card (generate()
# itself defaults to the base's generation config, as the base's generate does). Whisper: OpenAI's sample length,
# half its 448 decoder positions, room for a fast-spoken 30 s window; MERaLiON-2: its windows are 300 s long.
DEFAULT_MAX_NEW_TOKENS = {"whisper": 224, "meralion2": 1536}
CACHE_ENV = "MEDUSA_ASR_CACHE"
CONVERSION_MARKER = "conversion.json"  # written last into a base folder converted by pipeline.real_whisper
TRAIN_HINT = ("Train heads for this base with: python -m pipeline.collect --base BASE --audio AUDIO && "
              "python -m pipeline.train ... && python -m pipeline.export ... (see README.md).")


class MedusaHeads(nn.Module):
    """K heads, each ``num_layers`` residual blocks ``x + SiLU(W x + b)``, zero-initialised so every
    head starts as the identity (i.e. as the base's own next-token prediction).

    State-dict names follow vLLM's Medusa format: ``blocks.{i}.layers.{j}.weight`` / ``.bias``.
    """

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int):
        super().__init__()
        self.blocks = nn.ModuleList(_ResidualStack(num_layers, hidden_size) for _ in range(num_heads))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., K, H]"""
        return torch.stack([block(hidden) for block in self.blocks], dim=-2)


class _ResidualStack(nn.Module):
    def __init__(self, num_layers: int, hidden_size: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x):
        for layer in self.layers:
            x = x + F.silu(layer(x))
        return x


class MedusaForASR(PreTrainedModel):
    config_class = MedusaConfig
    base_model_prefix = "medusa"
    _no_split_modules = []

    def __init__(self, config: MedusaConfig, base=None, processor=None):
        super().__init__(config)
        self.medusa_heads = MedusaHeads(config.medusa_num_heads, config.medusa_num_layers, config.hidden_size)
        self.base = base
        self.processor = processor
        # Optional replacement for the trained heads when drafting: hidden [..., H] -> logits [..., K, V]
        # (an oracle in tests, a replayed acceptance profile in benchmarks). None = the heads.
        self.drafter = None
        self._verify_cost: dict = {}  # (device, dtype, batch, draft) -> seconds of one verify pass
        self._acceptance_scale = 1.0  # observed / predicted extra tokens per round, averaged over calls
        self._cache_pool = CachePool()  # fixed-shape caches reused by the CUDA-graph runners
        self._runners: dict = {}
        self._rounds_signature = None  # the weights the kept rounds were captured with
        self.backbone = BACKBONES[config.base_family](base) if base is not None else None
        if base is not None:
            _check_fits(config, self.backbone)
            _check_on_one_device(base)
            base.requires_grad_(False)
            param = next(base.parameters())
            self.medusa_heads.to(device=param.device, dtype=param.dtype)

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, base_model=None,
                        base_model_name_or_path=None, processor=None, **kwargs):
        """Load the artifact: its config, the base model it names, and the trained heads."""
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
        if base_model is None:
            base_model, processor = load_base_model(config.base_model_name_or_path, config.base_family, **kwargs)
        model = cls(config, base=base_model, processor=processor)
        model.load_heads(heads_path)
        model.eval()
        return model

    @classmethod
    def from_base(cls, base_model_name_or_path: str, family: str | None = None, medusa_num_heads: int = 4,
                  medusa_num_layers: int = 1, base_model=None, processor=None, **kwargs):
        """Fresh (zero-initialised) heads on a frozen base: the starting point for training."""
        if base_model is None:
            base_model, processor = load_base_model(base_model_name_or_path, family, **kwargs)
        family = family or detect_family(base_model)
        backbone = BACKBONES[family](base_model)
        config = MedusaConfig(
            base_model_name_or_path=str(base_model_name_or_path), base_family=family,
            medusa_num_heads=medusa_num_heads, medusa_num_layers=medusa_num_layers,
            hidden_size=backbone.hidden_size, vocab_size=backbone.vocab_size,
        )
        return cls(config, base=base_model, processor=processor).eval()

    def load_heads(self, path):
        state = _read_heads(path)
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
            self.config.auto_map = {"AutoConfig": "configuration_medusa.MedusaConfig",
                                    "AutoModel": "modeling_medusa.MedusaForASR"}
            self.config.architectures = ["MedusaForASR"]
            self.config.save_pretrained(tmp)
            heads = {k: v.detach().contiguous().cpu() for k, v in self.medusa_heads.state_dict().items()}
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

    # ------------------------------------------------------------------ heads
    @property
    def family(self) -> str:
        return self.config.base_family

    @property
    def default_max_new_tokens(self) -> int:
        return DEFAULT_MAX_NEW_TOKENS[self.family]

    @property
    def max_audio_seconds(self) -> float:
        return self.backbone.max_audio_seconds

    @property
    def pad_token_id(self) -> int:
        return self.backbone.pad_token_id

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., K, V]: each head, then the base's shared output projection."""
        return self.backbone.logits(self.medusa_heads(hidden))

    def project_for_decoding(self, hidden: torch.Tensor):
        """[B, T, H] -> (base logits [B, T, V], drafts_at: node [B] -> head logits [B, K, V]).

        On a GPU the output projection is memory-bound, so the heads ride along in the same pass
        over it for every node; on a CPU it is compute-bound, so the heads run on the chosen node
        only. A ``drafter`` set on the model replaces the heads.
        """
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        if hidden.device.type == "cuda" and self.drafter is None:
            both = self.backbone.logits(torch.cat([hidden[..., None, :], self.medusa_heads(hidden)], dim=-2))
            return both[..., 0, :], lambda node: both[rows, node, 1:]
        draft = self.drafter or self.head_logits
        return self.backbone.logits(hidden), lambda node: draft(hidden[rows, node])

    def draft_tree(self, draft: str | list | None = "auto") -> DraftTree:
        """``"chain"``, ``"tree"``/``"auto"`` (the config's measured tree when it has one), or explicit paths."""
        if isinstance(draft, (list, tuple)):
            return DraftTree.from_paths(draft)
        if draft in ("tree", "auto") and self.config.tree:
            return DraftTree.from_paths(self.config.tree)
        if draft not in ("chain", "tree", "auto", None):
            raise ValueError(f"draft={draft!r}: use 'auto', 'chain', 'tree' or a list of paths.")
        return DraftTree.chain(self.config.medusa_num_heads)

    def _draft_candidates(self, draft) -> list[DraftTree]:
        """``draft="auto"`` with measured head accuracy: plain greedy, the chain, the config's tree and
        trees of other sizes built from the same accuracy compete (the size that pays depends on the
        device, dtype and batch: a bigger tree accepts more but costs more to verify)."""
        accuracy = (self.config.head_accuracy or {}).get("topk")
        if draft != "auto" or not accuracy:
            return [self.draft_tree(draft)]
        options = [DraftTree(()), DraftTree.chain(self.config.medusa_num_heads)]
        if self.config.tree:
            options.append(DraftTree.from_paths(self.config.tree))
        options += [DraftTree.from_paths(build_tree_from_accuracy(accuracy, nodes)) for nodes in AUTO_TREE_SIZES]
        return list(dict.fromkeys(options))  # unique, in order

    def _fastest_draft(self, candidates: list[DraftTree], state, use_graph: bool = False) -> DraftTree:
        """The draft with the most expected tokens per second of verify time on this device, dtype and
        batch size. Verify passes are timed once on the real prefilled state (as a captured CUDA graph
        when rounds will be captured); expected tokens per round come from the measured head
        accuracy, rescaled by the acceptance actually observed so far."""
        candidates = [t for t in candidates if t.num_nodes == 1 or self._expected_tokens(t) > 1.0 + 1e-6]
        if len(candidates) == 1:
            return candidates[0]  # no draft is expected to add a token: nothing to time
        key = (state.lengths.device.type, str(self.dtype), state.next_token.shape[0], use_graph)
        for tree in candidates:
            if (key, tree) not in self._verify_cost:
                self._verify_cost[key, tree] = self._verify_seconds(tree, state, use_graph)
        return max(candidates, key=lambda tree: self._expected_tokens(tree) / self._verify_cost[key, tree])

    def _expected_tokens(self, tree: DraftTree) -> float:
        predicted = expected_tokens_per_round(tree, self.config.head_accuracy["topk"])
        return 1.0 + (predicted - 1.0) * self._acceptance_scale

    def _observe_acceptance(self, tree: DraftTree, stats: MedusaStats):
        """Track observed / predicted extra tokens per round (an average over calls), so ``draft="auto"``
        adapts when the audio is harder than the heads' held-out data."""
        accuracy = (self.config.head_accuracy or {}).get("topk")
        if not accuracy or tree.num_nodes == 1 or not stats.row_rounds:
            return
        predicted = expected_tokens_per_round(tree, accuracy) - 1.0
        if predicted > 0:
            ratio = (stats.mean_accepted_per_round - 1.0) / predicted
            self._acceptance_scale = 0.7 * self._acceptance_scale + 0.3 * ratio

    def _verify_seconds(self, tree: DraftTree, state, use_graph: bool = False, repeats: int = 5) -> float:
        """Median seconds of one verify pass (decoder + projection + heads) of ``tree`` on ``state``;
        it writes past the valid cache slots only, so the state is unchanged."""
        tt = tree.tensors(state.lengths.device)
        tokens = state.next_token[:, None].expand(-1, tree.num_nodes)

        def verify_pass():
            hidden = self.backbone.decode(state, tokens, tt.depths, tt.ancestors)
            _, drafts_at = self.project_for_decoding(hidden)
            if tree.num_nodes > 1:
                drafts_at(torch.zeros_like(state.next_token))

        if use_graph:
            static_before, state.static = state.static, True  # captured rounds attend over the whole cache
            try:
                return _graph_seconds(verify_pass, repeats)
            finally:
                state.static = static_before

        def timed_pass() -> float:
            _synchronize(state.lengths.device)
            start = time.perf_counter()
            verify_pass()
            _synchronize(state.lengths.device)
            return time.perf_counter() - start

        return _median_after_warmup(timed_pass, repeats)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, *args, use_medusa: bool = True, draft="auto", return_stats: bool = False,
                 max_new_tokens: int | None = None, min_new_tokens: int | None = None,
                 cuda_graph: bool | None = None, compile: bool = False, **kwargs):
        """The base's greedy ``generate``, accelerated: same inputs, same token ids.

        ``use_medusa=False`` runs the base's own generate. Sampling, beam search and options the
        Medusa loop does not implement fall back to it with a warning. ``return_stats=True``
        returns ``(sequences, stats)`` with rounds, drafted/accepted tokens and the mean tokens
        accepted per round. ``cuda_graph`` (default: on for CUDA devices) runs each round as one
        captured CUDA graph over a fixed-shape cache; ``compile=True`` also compiles that round with
        ``torch.compile`` (fused kernels: faster rounds, but the first call of each batch size and
        draft compiles for a while). Captured rounds are kept for later calls; ``release_caches()``
        frees them.
        """
        if args:
            kwargs.setdefault(self.backbone.required_inputs[0], args[0])
        _check_max_new_tokens(max_new_tokens)
        reason = None if use_medusa else "disabled"
        reason = (reason or _generation_fallback_reason(kwargs, self.base.generation_config, self.family)
                  or self.backbone.unsupported_reason(kwargs))
        if reason is not None:
            if reason != "disabled":
                warnings.warn(f"Medusa decoding does not support {reason}; using the base model's generate.")
            out = self.base.generate(**_base_kwargs(kwargs, max_new_tokens, min_new_tokens))
            return (out, MedusaStats().as_dict()) if return_stats else out
        _check_inputs(kwargs, self.backbone.required_inputs)
        candidates = self._draft_candidates(draft)
        process = self.backbone.make_logits_processor(min_new_tokens)
        slack = 2 * max(t.num_nodes for t in candidates)
        on_cuda = self.backbone.base.device.type == "cuda"
        use_graph = on_cuda if cuda_graph is None else bool(cuda_graph)  # off CUDA: fixed shapes, no capture
        fixed_shape = use_graph or compile
        if fixed_shape:
            self._prepare_fixed_shape_rounds(fuse=on_cuda)
        pool = self._cache_pool if fixed_shape else None
        state, max_new, prompt = self.backbone.prefill(kwargs, max_new_tokens, slack, process, cache_pool=pool)
        tree = candidates[0] if len(candidates) == 1 else self._fastest_draft(candidates, state, use_graph and on_cuda)
        stats = MedusaStats(draft=tree.name)
        if fixed_shape:
            runner = self._static_runner(state, tree, process, min_new_tokens, compile, use_graph)
            generated = runner.run(max_new, self.backbone.eos_token_ids, stats)
        else:
            generated = medusa_decode(self.backbone, self.project_for_decoding, process, state, tree, max_new,
                                      self.backbone.eos_token_ids, stats)
        if len(candidates) > 1:
            self._observe_acceptance(tree, stats)
        sequences = self.backbone.format_output(generated, prompt)
        return (sequences, stats.as_dict()) if return_stats else sequences

    generate_medusa = generate

    def _static_runner(self, state, tree: DraftTree, process, min_new_tokens, compile: bool,
                       use_graph: bool) -> StaticRoundRunner:
        """A captured runner for this cache, draft and logits rules: built (and its graph captured) on
        first use, then reused by later calls of the same shapes."""
        runners = self._runners
        key = (id(state.cache), tree, min_new_tokens, id(self.drafter), compile, use_graph)
        runner = runners.get(key)
        if runner is None:
            for stale in [k for k, r in runners.items() if not self._cache_pool.holds(r.state.cache)]:
                runners.pop(stale).release()
            runner = runners[key] = StaticRoundRunner(self.backbone, self.project_for_decoding, process, state, tree,
                                                      use_graph=use_graph, compile=compile)
        else:
            runner.load(state)
        return runner

    def _prepare_fixed_shape_rounds(self, fuse: bool):
        """Captured rounds hold raw pointers to the weights, so when any weight tensor was replaced
        since they were captured (``.to()``, ``.half()``, a reload) they are dropped, not replayed over
        freed memory. Then (GPU) q/k/v and gate/up are fused for the rounds (views: no extra memory)."""
        if self._weights_signature() == self._rounds_signature:
            return
        self.release_caches()
        if fuse:
            self.backbone.fuse_projections()
        self._rounds_signature = self._weights_signature()

    def _weights_signature(self) -> tuple:
        return tuple((p.data_ptr(), p.dtype, p.device) for p in self.parameters())

    def release_caches(self):
        """Free the captured rounds and their preallocated KV caches (GPU memory); later calls
        capture again."""
        for runner in self._runners.values():
            runner.release()
        self._runners.clear()
        self._cache_pool.caches.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @torch.no_grad()
    def collect_hidden_states(self, max_new_tokens: int | None = None, **inputs):
        """Greedy decode (one token a round); per row ``(tokens[T], hiddens[T, H])`` where
        ``hiddens[i]`` is the last-layer hidden state whose argmax produced ``tokens[i]``."""
        _check_inputs(inputs, self.backbone.required_inputs)
        _check_max_new_tokens(max_new_tokens)
        reason = self.backbone.unsupported_reason(inputs)
        if reason is not None:  # e.g. right padding: the rows' last prompt positions would be padding
            raise ValueError(f"collect_hidden_states records the base's plain greedy decoding and cannot take "
                             f"{reason}; build the inputs with prepare_audio_inputs.")
        process = self.backbone.make_logits_processor(None)
        state, max_new, _ = self.backbone.prefill(inputs, max_new_tokens, 1, process)
        hiddens = [[] for _ in range(state.hidden.shape[0])]
        tokens = medusa_decode(self.backbone, project_without_drafts(self.backbone), process,
                               state, DraftTree(()), max_new,
                               self.backbone.eos_token_ids, hidden_log=hiddens)
        return [(torch.tensor(t), torch.stack(h)) for t, h in zip(tokens, hiddens)]

    # ------------------------------------------------------------------ audio convenience
    def check_prompt_options(self, language: str | None = None, task: str | None = None) -> None:
        """ValueError naming the problem when this base cannot take the language or task."""
        language, task = self._effective_prompt_options(language, task)
        if self.family == "whisper":
            self.backbone.check_prompt_options(language, task)
        elif language or task:
            raise ValueError("language/task apply to Whisper bases; MERaLiON-2 takes an instruction instead, "
                             "e.g. instruction='Please transcribe this speech.'")

    @torch.no_grad()
    def max_new_tokens_limit(self, language: str | None = None, task: str | None = None) -> int | None:
        """The most new tokens one call can ask for with this language/task, or None where this base sets no
        limit here. Whisper: its decoder positions minus the prompt, whose length is measured by building it
        (language detection runs over one silent encoder frame)."""
        if self.family != "whisper":
            return None
        language, task = self._effective_prompt_options(language, task)
        silence = torch.zeros(1, 1, self.backbone.hidden_size, dtype=self.dtype, device=self.device)
        prompt = self.backbone.decoder_prompt(self.backbone._cross_attention_kv(silence), 1, language, task)
        return self.base.config.max_target_positions - prompt.shape[1]

    def _effective_prompt_options(self, language, task) -> tuple:
        """An English-only Whisper transcribes English: language en/english and task transcribe are what it
        does anyway, so they are dropped instead of refused (translation or another language still fail)."""
        english_only = self.family == "whisper" and not getattr(self.backbone.generation_config, "lang_to_id", None)
        if english_only and language and language.strip("<|>").lower() in ("en", "english"):
            language = None
        if english_only and task == "transcribe":
            task = None
        return language, task

    def prepare_audio_inputs(self, audios, sampling_rate: int = 16000, instruction: str | None = None,
                             language: str | None = None, task: str | None = None):
        """A batch of 16 kHz mono float arrays -> the base's generate inputs. ``language`` and ``task``
        (multilingual Whisper only; default: the model's own, i.e. detect the language and transcribe)
        are carried in the inputs; ``instruction`` is MERaLiON-2's prompt."""
        if self.processor is None:
            raise ValueError("This model was loaded without a processor; pass processor= to from_pretrained.")
        if sampling_rate != 16000:
            raise ValueError(f"Audio must be 16 kHz (got {sampling_rate} Hz); resample it first.")
        self.check_prompt_options(language, task)
        language, task = self._effective_prompt_options(language, task)
        if self.family == "whisper":
            inputs = dict(self.processor(list(audios), sampling_rate=16000, return_tensors="pt"))
            return {**inputs, **{k: v for k, v in (("language", language), ("task", task)) if v}}
        prompt = (f"Instruction: {instruction or 'Please transcribe this speech.'} \n"
                  "Follow the text instruction based on the following audio: <SpeechHere>")
        chat = [{"role": "user", "content": prompt}]
        tokenizer = self.processor.tokenizer
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        side, tokenizer.padding_side = tokenizer.padding_side, "left"  # decoding continues each row at its end
        try:
            return dict(self.processor(text=[text] * len(audios), audios=list(audios), sampling_rate=16000))
        finally:
            tokenizer.padding_side = side

    def decode_text(self, sequences: torch.Tensor, inputs: dict | None = None) -> list[str]:
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        if self.family == "meralion2" and inputs is not None and "input_ids" in inputs:
            sequences = sequences[:, inputs["input_ids"].shape[1]:]
        texts = tokenizer.batch_decode(sequences, skip_special_tokens=True)
        return [t.replace("<Speaker1>:", "").replace("<Speaker2>:", "").strip() for t in texts]


MERaLiON2MedusaForASR = MedusaForASR  # the name the seed's snippet uses


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_after_warmup(timed_run, repeats: int) -> float:
    """Median of ``repeats`` results of ``timed_run()`` (seconds), after one untimed warm-up run."""
    times = [timed_run() for _ in range(repeats + 1)]
    return sorted(times[1:])[repeats // 2]


def _graph_seconds(fn, repeats: int) -> float:
    """Median seconds of ``fn`` replayed as a CUDA graph (captured after a warm-up on a side stream)."""
    graph = capture_cuda_graph(fn)

    def timed_replay() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000

    seconds = _median_after_warmup(timed_replay, repeats)
    del graph
    return seconds


# --------------------------------------------------------------------------- base loading


def cache_dir() -> Path:
    """This project's one cache folder: ``$MEDUSA_ASR_CACHE``, else ``$XDG_CACHE_HOME/medusa-asr``, else
    ``~/.cache/medusa-asr``. It holds the Whisper bases converted offline by ``pipeline.real_whisper``
    (loading looks there before the Hub), the wheels and packages they come from, and the demo clip."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "medusa-asr"


def detect_family(base) -> str:
    if hasattr(base, "text_decoder") and hasattr(base, "speech_encoder"):
        return "meralion2"
    if getattr(base.config, "model_type", "") == "whisper":
        return "whisper"
    raise ValueError(f"Cannot tell the family of {type(base).__name__}; pass family='whisper' or 'meralion2'.")


class BaseModelNotFound(OSError):
    """The base model could not be loaded from a folder, a converted copy or the Hub (or its cache)."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason
        super().__init__(self.message("pass base_model_name_or_path=<local folder>"))

    def message(self, how_to_point: str) -> str:
        return (f"Could not load the base model {self.name!r} ({self.reason}). It is not a local folder, "
                f"{converted_base_folder(self.name)} holds no converted copy, and the Hub or its cache does not "
                f"have it: download it, convert it (Whisper tiny.en/base: python -m pipeline.real_whisper "
                f"{self.name}), or {how_to_point}.")


def load_base_model(name_or_path: str, family: str | None = None, **kwargs):
    """Load a base model (+ its processor) by Hub id or folder; a PEFT adapter folder is merged."""
    load_kwargs = {k: v for k, v in kwargs.items() if k in BASE_LOAD_KWARGS and v is not None}
    name_or_path = resolve_base(name_or_path)
    adapter = _peft_adapter_base(name_or_path, load_kwargs)
    source = resolve_base(adapter) if adapter else name_or_path
    family = family or _family_from_config(source, load_kwargs)
    try:
        if family == "meralion2":
            from transformers import AutoModelForSpeechSeq2Seq

            load_kwargs.setdefault("attn_implementation", "eager")  # sdpa would drop Gemma2's attention soft-cap
            base = AutoModelForSpeechSeq2Seq.from_pretrained(source, trust_remote_code=True, **load_kwargs)
        else:
            from transformers import WhisperForConditionalGeneration

            base = WhisperForConditionalGeneration.from_pretrained(source, **load_kwargs)
    except OSError as err:
        raise BaseModelNotFound(str(source), f"{type(err).__name__}: {_first_line(err)}") from err
    if adapter:
        base = _merge_adapter(base, name_or_path)
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
        return AutoProcessor.from_pretrained(source, trust_remote_code=family == "meralion2", **keep)
    except (OSError, ValueError, TypeError, KeyError) as err:
        warnings.warn(f"Loaded {source} without a processor ({type(err).__name__}: {_first_line(err)}); "
                      "prepare_audio_inputs and decode_text need one: pass processor= to from_pretrained.")
        return None


def _peft_adapter_base(name_or_path, load_kwargs) -> str | None:
    local = Path(str(name_or_path)) / "adapter_config.json"
    if local.is_file():
        return json.loads(local.read_text())["base_model_name_or_path"]
    if Path(str(name_or_path)).exists():
        return None
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(str(name_or_path), "adapter_config.json", revision=load_kwargs.get("revision"))
        return json.loads(Path(path).read_text())["base_model_name_or_path"]
    except Exception:
        return None


def _family_from_config(source, load_kwargs) -> str:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=True,
                                            **{k: v for k, v in load_kwargs.items() if k in ("revision", "token")})
    except (OSError, ValueError) as err:
        raise BaseModelNotFound(str(source), _first_line(err)) from err
    model_type = getattr(config, "model_type", "")
    if model_type == "whisper":
        return "whisper"
    if model_type.startswith("meralion"):
        return "meralion2"
    raise ValueError(f"{source!r} is a {model_type!r} model; supported bases are MERaLiON-2 and Whisper.")


def _resolve_artifact(name_or_path, kwargs) -> str:
    if Path(str(name_or_path)).is_dir():
        return str(name_or_path)
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(str(name_or_path), revision=kwargs.get("revision"), token=kwargs.get("token"))
    except Exception as err:
        raise OSError(f"Could not find the Medusa artifact {name_or_path!r}: {err}") from err


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
# What each backbone leaves out (MERaLiON-2's decoder applies no token suppression or forced ids; Whisper's
# short-form thresholds and timestamps).
FAMILY_GREEDY_AS_IS = {
    "meralion2": {"suppress_tokens": ([],), "begin_suppress_tokens": ([],), "forced_decoder_ids": ([],)},
    "whisper": {"compression_ratio_threshold": (), "logprob_threshold": (), "no_speech_threshold": (),
                "return_timestamps": (False,), "return_token_timestamps": (False,), "return_segments": (False,)},
}
# Read by the backbones from the base's own generation config: a call that changes them goes to the base.
BASE_CONFIG_SETTINGS = {
    "meralion2": ("eos_token_id", "pad_token_id", "max_length"),
    "whisper": ("eos_token_id", "pad_token_id", "max_length", "decoder_start_token_id", "suppress_tokens",
                "begin_suppress_tokens", "forced_decoder_ids", "no_timestamps_token_id"),
}
# generate() arguments that are objects or callbacks the Medusa loop cannot apply.
CALL_ONLY_OPTIONS = ("generation_config", "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn",
                     "assistant_model", "streamer", "negative_prompt_ids", "custom_generate")
MODE_NAMES = {"sample": "sampling", "beam_sample": "beam sampling"}


def _generation_fallback_reason(kwargs: dict, base_config, family: str) -> str | None:
    """The first setting that makes the base's generate decode other than by the plain greedy search the
    Medusa loop reproduces, named with where it came from; None when there is none. Settings are those of
    the base's generation config updated with this call's, as the base's generate merges them."""
    for name in CALL_ONLY_OPTIONS:
        if kwargs.get(name) is not None:
            return f"the {name} argument"
    merged = copy.deepcopy(base_config)
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
    if family == "whisper" and not _is_greedy_whisper_temperature(kwargs.get("temperature")):
        return f"sampling ({named('temperature')}: Whisper samples when the temperature is above 0)"
    as_is = {**GREEDY_AS_IS, **FAMILY_GREEDY_AS_IS.get(family, {})}
    for name, neutral in as_is.items():
        value = kwargs[name] if name in kwargs else getattr(merged, name, None)
        if not (value is None or (not torch.is_tensor(value) and value in neutral)):
            return named(name)
    for name in BASE_CONFIG_SETTINGS.get(family, ()):
        if name in kwargs and kwargs[name] != getattr(base_config, name, None):
            return f"{named(name)} (the decoder applies the base's own {name})"
    return None


def _is_mode_default(value) -> bool:
    return value is None or value is False or (type(value) in (int, float) and value in (0, 1))


def _is_greedy_whisper_temperature(temperature) -> bool:
    """Whisper's generate samples whenever its ``temperature`` argument (not the config's) is above 0."""
    temperatures = temperature if isinstance(temperature, (list, tuple)) else [temperature]
    return all(t is None or t == 0 for t in temperatures)


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
