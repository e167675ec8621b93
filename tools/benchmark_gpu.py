"""GPU benchmark on MERaLiON-2-shaped models (3B or 10B; random weights, bf16): verify-pass cost against
the memory-bandwidth floor, whole calls at realistic output lengths, and batching against batched greedy.

Random weights cannot draft, so the decode rows replay an acceptance profile: drafts come from the base's
own known continuation and each head is right with a given per-rank probability. These rows measure speed
at a realistic acceptance (speed-only), never draft quality. Each run updates ``OUT/results-SHAPE.json``
(section by section, with the command that measured it), its Markdown, and ``OUT/summary.json`` over every
shape measured there (``benchmark_gpu_report.py``).

    python -m tools.benchmark_gpu --shape meralion2-3b --sections verify,lengths
    python -m tools.benchmark_gpu --shape meralion2-3b --sections batching
    python -m tools.benchmark_gpu --shape meralion2-10b --sections verify,lengths
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from pathlib import Path

import sys

import torch
import torch.nn as nn

from tools import benchmark_gpu_report as report_gpu
from tools.files import write_atomic, write_json_atomic
from backbone_meralion2 import MERaLiON2Backbone
from draft_policy import cuda_ms
from draft_trees import DraftTree, build_tree_from_accuracy
from kv_cache import CachePool
from medusa_decoding import MedusaStats, run_rounds
from medusa_fast import CapturedCalls, CapturedRounds, capture_cuda_graph
from medusa_heads import MedusaDrafter

SEED_TOP1 = [0.76, 0.47, 0.35, 0.27]  # the seed model card's held-out per-head accuracy (MERaLiON-2-3B)
SEED_PROFILE = "seed_76_47_35_27"
PROMPT_TEXT_TOKENS = 37  # ~137-token prompt: 100 speech tokens + chat template and instruction
SHAPES = {  # the Gemma2 decoders of MERaLiON-2-3B (Gemma2-2B) and MERaLiON-2-10B (Gemma2-9B)
    "meralion2-3b": {"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
                     "num_key_value_heads": 4, "intermediate_size": 9216},
    "meralion2-10b": {"hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
                      "num_key_value_heads": 8, "intermediate_size": 14336},
}
SECTIONS = ("verify", "lengths", "batching")


# --------------------------------------------------------------------------- the model


class GatedAdapter(nn.Module):
    """MERaLiON-2's gated speech adapter shape: 15 frames stacked -> 6400 -> gated -> 2304."""

    def __init__(self, speech_dim=1280, text_dim=2304, scale=15, inner=6400):
        super().__init__()
        self.scale = scale
        self.mlp_adapter = nn.Sequential(nn.Linear(speech_dim * scale, inner), nn.SiLU())
        self.gate_proj, self.pool_proj = nn.Linear(inner, inner), nn.Linear(inner, inner)
        self.out_proj = nn.Linear(inner, text_dim)

    def forward(self, x):
        b, t, d = x.shape
        x = self.mlp_adapter(x.reshape(b, t // self.scale, d * self.scale))
        return self.out_proj(nn.functional.silu(self.gate_proj(x)) * self.pool_proj(x))


class MERaLiON2Shaped(nn.Module):
    """Same module names and sizes as MERaLiON-2 (``SHAPES``), built from the library's Whisper encoder
    (Whisper-large-v3's) and Gemma2."""

    def __init__(self, shape="meralion2-3b", text_layers=None):
        super().__init__()
        from transformers import Gemma2Config, Gemma2ForCausalLM, GenerationConfig, WhisperConfig
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        speech = WhisperConfig(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                               num_mel_bins=128, max_source_positions=1500)
        sizes = dict(SHAPES[shape], **({"num_hidden_layers": text_layers} if text_layers else {}))
        text = Gemma2Config(**sizes, head_dim=256, vocab_size=256000, sliding_window=4096,
                            final_logit_softcapping=30.0, attn_logit_softcapping=50.0, query_pre_attn_scalar=256,
                            max_position_embeddings=8192)
        text._attn_implementation = "eager"  # soft-capping needs eager attention in the library
        speech._attn_implementation = "sdpa"  # the library's default for a loaded Whisper encoder
        self.speech_encoder = WhisperEncoder(speech)
        self.ln_speech = nn.LayerNorm(1280)
        self.speech_audio_adapter = GatedAdapter(text_dim=sizes["hidden_size"])
        self.text_decoder = Gemma2ForCausalLM(text)
        self.config = type("Cfg", (), {"text_config": text, "speech_token_index": 255999})()
        self.generation_config = GenerationConfig(eos_token_id=[1, 107], pad_token_id=0)

    @property
    def device(self):
        return next(self.parameters()).device

    @property
    def dtype(self):
        return next(self.parameters()).dtype


def build_model(device, dtype, shape="meralion2-3b", text_layers=None):
    torch.manual_seed(0)
    with torch.device(device):
        model = MERaLiON2Shaped(shape, text_layers).to(dtype).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model


def decoder_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.text_decoder.parameters())


# --------------------------------------------------------------------------- timing helpers


def measure_copy_bandwidth(device, gib=4) -> float:
    n = gib * (1 << 30) // 2
    src, dst = torch.empty(n, dtype=torch.bfloat16, device=device), torch.empty(n, dtype=torch.bfloat16, device=device)
    src.normal_()
    ms = time_cuda(lambda: dst.copy_(src), repeats=20)
    return 2 * n * 2 / (ms / 1000)  # bytes read + written per second


def time_cuda(fn, repeats=30, warmup=5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(cuda_ms(fn) for _ in range(repeats))


# --------------------------------------------------------------------------- prompt & prefill


def make_prompt(model, batch, device):
    features = torch.randn(batch, 128, 3000, device=device, dtype=model.dtype)
    ids = torch.randint(2, 200000, (batch, PROMPT_TEXT_TOKENS + 100), device=device)
    ids[:, 10:110] = 255999
    return {"input_ids": ids, "input_features": features, "feature_attention_mask": torch.ones(batch, 3000, device=device)}


def prefill(backbone, inputs, max_new, extra, min_new=None, cache_pool=None, capture=None):
    process = backbone.make_logits_processor(min_new)
    state, _, _ = backbone.prefill(inputs, max_new, extra, process, cache_pool=cache_pool, capture=capture)
    return state, process


# --------------------------------------------------------------------------- verify-pass cost


def verify_cost_table(model, backbone, sizes, compile_sizes, report):
    """Cost of one verify pass vs tokens verified: HF eager, ours eager / captured, then with q/k/v and
    gate/up fused (``fuse_projections``, what ``generate`` runs on a GPU) captured and compiled + captured."""
    device = model.device
    rows = []
    inputs = make_prompt(model, 1, device)
    embeds = backbone._prompt_embeddings(inputs["input_ids"], inputs["input_features"])
    from transformers import DynamicCache

    def ours_pass(n):
        ids = torch.randint(2, 200000, (1, n), device=device)
        state, _ = prefill(backbone, inputs, 8, 2 * n)
        tt = (DraftTree.chain(n - 1) if n > 1 else DraftTree(())).tensors(device)
        upto = state.cache.capacity  # the captured rounds attend over the whole cache
        return lambda: backbone.logits(backbone.decode(state, ids, tt.depths, tt.ancestors, upto))

    for n in sizes:
        row = {"tokens": n}
        ids = torch.randint(2, 200000, (1, n), device=device)
        cache = DynamicCache()
        model.text_decoder(inputs_embeds=embeds, past_key_values=cache, use_cache=True)

        def hf_eager():
            model.text_decoder(input_ids=ids, past_key_values=cache, use_cache=True)
            cache.crop(-n)

        row["hf_eager_ms"] = time_cuda(hf_eager, repeats=15)
        ours = ours_pass(n)
        row["ours_eager_ms"] = time_cuda(ours, repeats=15)
        row["ours_graph_ms"] = graph_ms(ours)
        rows.append(row)
        report(rows)
    if backbone.fuse_projections():
        for row in rows:
            ours = ours_pass(row["tokens"])
            row["fused_graph_ms"] = graph_ms(ours)
            if row["tokens"] in compile_sizes:
                row.update(compiled_graph_ms(ours, "fused_compiled_graph_ms"))
            report(rows)
    return rows


def speech_encoder_ms(model, backbone) -> float:
    """One 30 s window through the speech encoder, ln_speech and the adapter, as a CUDA graph: the part of
    the prefill no decoder change can shorten."""
    features = backbone._speech_features(make_prompt(model, 1, model.device)["input_features"])
    return graph_ms(lambda: model.speech_audio_adapter(model.ln_speech(model.speech_encoder(features).last_hidden_state)))


def graph_ms(fn) -> float:
    graph = capture_cuda_graph(fn, warmups=3)
    ms = time_cuda(graph.replay)
    del graph
    return ms


def compiled_graph_ms(fn, name) -> dict:
    try:
        start = time.perf_counter()
        compiled = torch.compile(fn, dynamic=False)
        graph = capture_cuda_graph(compiled, warmups=3)
        compile_s = time.perf_counter() - start
        return {name: time_cuda(graph.replay), name.replace("_ms", "_compile_s"): compile_s}
    except Exception as err:  # compile support varies by torch build
        return {name: None, name.replace("_ms", "_error"): f"{type(err).__name__}: {str(err)[:200]}"}


# --------------------------------------------------------------------------- replayed acceptance


def rank_profile(top1, extra_topk=None, ranks=4):
    """Per head: probability that the true token sits at rank r (r < ranks); the rest is a miss."""
    profile = []
    for h, p1 in enumerate(top1):
        if extra_topk is not None:
            acc = extra_topk[h][:ranks]
        else:  # assumption for the seed (only top-1 published): half the misses are in the top-`ranks`
            acc = [p1 + (1 - p1) * 0.5 * r / (ranks - 1) for r in range(ranks)]
        probs = [acc[0]] + [max(acc[r] - acc[r - 1], 0.0) for r in range(1, len(acc))]
        profile.append(probs)
    return profile


class ReplayDrafter:
    """Head logits built on the device from the known continuation: head h's true token (the
    (h+1)-th after the round's root) is put at a sampled rank (or missed), decoys fill the ranks above
    it. Used as a ``MedusaDrafter``'s heads; capturable in a CUDA graph. ``num_generated`` is the
    runner's own count of emitted tokens (shared buffer), so the drafts follow the decode."""

    def __init__(self, backbone, continuation, profile, seed=0):
        self.backbone, self.cont = backbone, continuation  # cont [B, L]
        self.vocab = backbone.vocab_size
        self.num_heads, self.ranks = len(profile), len(profile[0])
        batch, length = continuation.shape
        gen = torch.Generator(device="cpu").manual_seed(seed)
        probs = torch.tensor([p + [max(1 - sum(p), 0.0)] for p in profile])  # [K, R+1]
        draws = torch.multinomial(probs.repeat(batch * length, 1), 1, generator=gen)
        self.rank_table = draws.view(batch, length, self.num_heads).to(continuation.device)
        self.num_generated = torch.ones(batch, dtype=torch.long, device=continuation.device)

    def __call__(self, hidden):
        """hidden [B, H] of the round's root -> head logits [B, K, V]."""
        batch, device = hidden.shape[0], hidden.device
        heads = torch.arange(self.num_heads, device=device)
        pos = (self.num_generated[:, None] + heads[None, :]).clamp(max=self.cont.shape[1] - 1)  # [B, K]
        true = self.cont.gather(1, pos)
        rank = self.rank_table[torch.arange(batch, device=device)[:, None], pos, heads[None, :]]
        drafts = torch.zeros(batch, self.num_heads, self.vocab, device=device, dtype=hidden.dtype)
        for j in range(self.ranks):
            decoy = (true + 1 + j) % self.vocab
            drafts.scatter_(2, decoy[..., None], torch.where(j < rank, 10.0 - j, 0.0)[..., None].to(hidden.dtype))
        score = torch.where(rank < self.ranks, 10.0 - rank.float(), torch.zeros_like(rank, dtype=torch.float32))
        drafts.scatter_(2, true[..., None], score[..., None].to(hidden.dtype))
        return drafts


class ReplayedRunner:
    """One captured (optionally compiled) round for a draft tree and batch size, reused by every timed call
    as ``generate`` reuses it: a call = the captured prefill (speech encoder, adapter and the prompt's pass as
    one CUDA graph, into the runner's cache) + the rounds. Sized for ``max_new`` tokens; a call may stop
    sooner (its tokens are then the first of the same continuation)."""

    def __init__(self, backbone, inputs, continuation, profile, tree, max_new, compile):
        self.backbone, self.max_new = backbone, max_new
        self.pool, self.calls = CachePool(), CapturedCalls()
        state, self.process = self._prefill(inputs, tree)
        self.drafter = ReplayDrafter(backbone, continuation, profile, seed=1)
        drafter = MedusaDrafter(tree, continuation.device, self.drafter) if tree.num_nodes > 1 else None
        start = time.perf_counter()
        self.runner = CapturedRounds(backbone, drafter, self.process, state, tree, compile=compile,
                                     num_generated=self.drafter.num_generated)
        torch.cuda.synchronize()
        self.setup_seconds = time.perf_counter() - start  # compile + capture, paid once per shape

    def _prefill(self, inputs, tree):
        return prefill(self.backbone, inputs, self.max_new, 2 * tree.num_nodes, min_new=self.max_new,
                       cache_pool=self.pool, capture=self.calls)

    @property
    def prefill_captured(self) -> bool:
        return bool(self.calls.graphs) and all(entry is not None for entry in self.calls.graphs.values())

    def __call__(self, inputs, new_tokens=None):
        """One call: prefill, then the rounds; returns (outputs, stats with prefill_seconds (the time to the
        first token) and loop_seconds)."""
        torch.cuda.synchronize()
        start = time.perf_counter()
        state, _ = self._prefill(inputs, self.runner.tree)
        self.runner.load(state)
        first = state.next_token.tolist()
        stats = MedusaStats()
        stats.prefill_seconds = time.perf_counter() - start
        start = time.perf_counter()
        out = run_rounds(self.runner, first, new_tokens or self.max_new, self.backbone.eos_token_ids, stats)
        torch.cuda.synchronize()
        stats.loop_seconds = time.perf_counter() - start
        return out, stats

    def release(self):
        self.runner.release()
        self.calls.release()
        self.pool.caches.clear()


def plain_continuation(backbone, inputs, max_new):
    state, process = prefill(backbone, inputs, max_new, 4, min_new=max_new)
    runner = CapturedRounds(backbone, None, process, state, DraftTree(()))
    out = run_rounds(runner, state.next_token.tolist(), max_new, backbone.eos_token_ids)
    return torch.tensor(out, device=inputs["input_ids"].device)


def seed_style_chain(model, backbone, inputs, continuation, profile, max_new, seed):
    """The seed's loop shape: HF text_decoder forward per round (eager), DynamicCache cropped on reject."""
    from transformers import DynamicCache

    embeds = backbone._prompt_embeddings(inputs["input_ids"], inputs["input_features"])
    cache = DynamicCache()
    out = model.text_decoder(inputs_embeds=embeds, past_key_values=cache, use_cache=True)
    length = embeds.shape[1]
    tokens = [int(out.logits[0, -1].argmax())]
    drafter = ReplayDrafter(backbone, continuation[:1], profile, seed)
    rounds = 0
    while len(tokens) < max_new:
        drafter.num_generated = torch.tensor([len(tokens)], device=embeds.device)
        drafts = drafter(embeds[:, -1]).argmax(-1)[0].tolist()
        chunk = torch.tensor([[tokens[-1]] + drafts], device=embeds.device)
        logits = model.text_decoder(input_ids=chunk, past_key_values=cache, use_cache=True).logits[0]
        predicted = logits.argmax(-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == predicted[accepted]:
            accepted += 1
        tokens += drafts[:accepted] + [predicted[accepted]]
        length += accepted + 1
        excess = cache.get_seq_length() - length
        if excess:
            cache.crop(-excess)  # (a negative crop removes tokens on every transformers version)
        rounds += 1
    return tokens[:max_new], rounds


def hf_generate(model, backbone, inputs, new_tokens, cache=None):
    """The library's own greedy ``generate`` on the prompt embeddings: dynamic cache, or ``cache`` (a
    ``StaticCache`` sized for the longest call and reset here, so that every length replays the graphs the
    library compiled for it)."""
    embeds = backbone._prompt_embeddings(inputs["input_ids"], inputs["input_features"])
    kwargs = {}
    if cache is not None:
        cache.reset()
        kwargs["past_key_values"] = cache
    return model.text_decoder.generate(inputs_embeds=embeds, attention_mask=torch.ones(embeds.shape[:2], device=embeds.device),
                                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **kwargs)


def hf_static_cache(model, capacity):
    from transformers import StaticCache

    return StaticCache(config=model.text_decoder.config, max_cache_len=capacity)


def timed(fn, repeats=3):
    fn()  # warm-up
    torch.cuda.synchronize()
    times = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


# --------------------------------------------------------------------------- decode tables


class DecodeBench:
    """Whole calls on one prompt (repeated ``batch`` times) with a known greedy continuation: ours with a
    replayed profile, our plain greedy, and the library's generate (static and dynamic cache), each row
    one measurement of ``new_tokens`` per row of the batch."""

    def __init__(self, model, backbone, shape, max_new, repeats):
        self.model, self.backbone, self.shape = model, backbone, shape
        self.max_new, self.repeats = max_new, repeats
        self.inputs1 = make_prompt(model, 1, model.device)
        self.continuation = plain_continuation(backbone, self.inputs1, max_new)
        self.rows, self.report = [], None

    def start_section(self, report):
        """Rows from here on go to ``report`` (one results section)."""
        self.rows, self.report = [], report

    def batched(self, batch):
        inputs = {k: v.expand(batch, *v.shape[1:]).contiguous() for k, v in self.inputs1.items()}
        return inputs, self.continuation.expand(batch, -1).contiguous()

    def add(self, row):
        self.rows.append({"shape": self.shape, **row})
        self.report(self.rows)

    def ours(self, method, draft, tree, profile_name, profile, batch, lengths, compile):
        """``method`` ("ours" / "ours_greedy") with one runner, timed at each of ``lengths``."""
        inputs, cont = self.batched(batch)
        base = {"method": method, "draft": draft, "profile": profile_name, "batch": batch,
                "rounds_mode": "compiled" if compile else "graph"}
        torch.cuda.reset_peak_memory_stats()
        replay = None
        try:
            replay = ReplayedRunner(self.backbone, inputs, cont, profile, tree, self.max_new, compile)
            replay(inputs)  # warm-up call
            for n in lengths:
                self.add({**base, **self._ours_row(replay, inputs, n, batch)})
        except torch.OutOfMemoryError as err:
            self.add({**base, "error": f"OutOfMemoryError: {str(err)[:200]}"})
        finally:
            if replay is not None:
                replay.release()
            del replay
            gc.collect()
            torch.cuda.empty_cache()

    def _ours_row(self, replay, inputs, n, batch) -> dict:
        calls, loops, prefills, stats, out = [], [], [], None, None
        for _ in range(self.repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            out, stats = replay(inputs, n)
            calls.append(time.perf_counter() - start)
            loops.append(stats.loop_seconds)
            prefills.append(stats.prefill_seconds)
        call, loop = statistics.median(calls), statistics.median(loops)
        return {"new_tokens": n, "call_seconds": call, "call_tok_per_s": batch * n / call,
                "loop_tok_per_s": batch * n / loop, "outside_rounds_ms": (call - loop) * 1000,
                "time_to_first_token_ms": statistics.median(prefills) * 1000,
                "tokens_per_round": stats.mean_accepted_per_round,
                "exact": all(o == self.continuation[0, :n].tolist() for o in out),
                "first_divergence": first_divergence(out, self.continuation[0, :n].tolist()),
                "prefill_captured": replay.prefill_captured, "setup_seconds": replay.setup_seconds,
                "peak_memory_allocated_GB": torch.cuda.max_memory_allocated() / 1e9}

    def hf(self, method, batch, lengths):
        """The library's generate: ``hf_static`` (one StaticCache for every length; the library compiles
        its forward) or ``hf_dynamic`` (eager, one repeat: it is slow)."""
        inputs, _ = self.batched(batch)
        torch.cuda.reset_peak_memory_stats()
        try:
            cache = hf_static_cache(self.model, inputs["input_ids"].shape[1] + max(lengths)) if method == "hf_static" else None
            for n in lengths:
                seconds, out = timed(lambda: hf_generate(self.model, self.backbone, inputs, n, cache),
                                     repeats=self.repeats if cache is not None else 1)
                self.add({"method": method, "draft": "none", "profile": "none", "batch": batch, "new_tokens": n,
                          "call_seconds": seconds, "call_tok_per_s": batch * n / seconds,
                          "matches_our_greedy": all(row[-n:].tolist() == self.continuation[0, :n].tolist() for row in out),
                          "peak_memory_allocated_GB": torch.cuda.max_memory_allocated() / 1e9})
        except Exception as err:  # the library's compile support varies by version
            self.add({"method": method, "batch": batch, "error": f"{type(err).__name__}: {str(err)[:300]}"})
        gc.collect()
        torch.cuda.empty_cache()

    def seed_style(self, profile_name, profile):
        n = self.max_new
        seconds, (tokens, rounds) = timed(lambda: seed_style_chain(self.model, self.backbone, self.inputs1, self.continuation,
                                                                   profile, n, 1), repeats=1)
        self.add({"method": "seed_style_eager_chain", "draft": f"chain-{len(profile)}", "profile": profile_name,
                  "batch": 1, "new_tokens": n, "call_seconds": seconds, "call_tok_per_s": n / seconds,
                  "tokens_per_round": n / rounds, "exact": tokens == self.continuation[0].tolist()})


def first_divergence(rows: list[list[int]], reference: list[int]) -> int | None:
    """The first position where any row leaves the reference continuation (None: every row follows it)."""
    positions = [next((i for i, (a, b) in enumerate(zip(row, reference)) if a != b), None) for row in rows]
    return min((p for p in positions if p is not None), default=None)


def draft_trees(profile, names):
    """Name ("none", "chain", "tree-N") -> DraftTree for a replayed profile."""
    topk = [[sum(p[: r + 1]) for r in range(len(p))] for p in profile]
    trees = {}
    for name in names:
        if name == "none":
            trees[name] = DraftTree(())
        elif name == "chain":
            trees[f"chain-{len(profile)}"] = DraftTree.chain(len(profile))
        else:
            trees[name] = DraftTree.from_paths(build_tree_from_accuracy(topk, int(name.split("-")[1])))
    return trees


def lengths_table(bench, profiles, drafts, lengths, compile):
    """Batch 1 at realistic ASR output lengths: every method, whole calls."""
    for profile_name, profile in profiles.items():
        for name, tree in draft_trees(profile, drafts).items():
            if name == "none" and profile_name != SEED_PROFILE:
                continue
            method = "ours_greedy" if name == "none" else "ours"
            bench.ours(method, name, tree, profile_name if name != "none" else "none", profile, 1, lengths, compile)
        bench.seed_style(profile_name, profile)
    for method in ("hf_static", "hf_dynamic"):
        bench.hf(method, 1, lengths)


def batching_table(bench, profile, drafts_by_batch, new_tokens, compile_batches):
    """Batch sizes against batched greedy (ours without drafts, the library's generate) at one length."""
    for batch, drafts in drafts_by_batch.items():
        for name, tree in draft_trees(profile, drafts).items():
            method = "ours_greedy" if name == "none" else "ours"
            bench.ours(method, name, tree, "none" if name == "none" else SEED_PROFILE, profile, batch, [new_tokens],
                       batch in compile_batches)
        for method in ("hf_static", "hf_dynamic"):
            bench.hf(method, batch, [new_tokens])


def check_graph_reuse(device) -> dict:
    """Correctness and cost of reusing captured rounds across generate calls (tiny random Whisper):
    every call must equal the base's own generate; the first call captures, later ones replay."""
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from modeling_medusa import MedusaForASR
    from oracle import randomize_heads
    from tiny_models import build_tiny_whisper, random_features

    folder = build_tiny_whisper(Path(tempfile.mkdtemp()) / "whisper", seed=2)
    model = MedusaForASR.from_base(str(folder), device_map=str(device))
    randomize_heads(model, 0)
    rows = []
    for call in range(6):
        features = random_features(2, call).to(device)
        expected = model.generate(input_features=features, max_new_tokens=20, use_medusa=False)
        for draft in ("chain", [[0], [1], [0, 0], [0, 1], [0, 0, 0]]):
            torch.cuda.synchronize()
            start = time.perf_counter()
            got = model.generate(input_features=features, max_new_tokens=20, draft=draft)
            torch.cuda.synchronize()
            rows.append({"call": call, "draft": "chain" if draft == "chain" else "tree", "exact": torch.equal(expected, got),
                         "ms": (time.perf_counter() - start) * 1000, "runners": len(model.round_cache.runners)})
            print(rows[-1], flush=True)
    return {"calls": rows, "all_exact": all(r["exact"] for r in rows)}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/gpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="meralion2-3b")
    parser.add_argument("--sections", default="verify,lengths,batching", help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--text-layers", type=int, default=None, help="fewer decoder layers, for a smoke test")
    parser.add_argument("--sizes", default="1,2,3,5,8,16,32,64", help="verify: tokens per pass")
    parser.add_argument("--compile-sizes", default="5,64", help="verify: sizes also compiled")
    parser.add_argument("--lengths", default="16,32,64,128", help="lengths: new tokens per call, batch 1")
    parser.add_argument("--length-drafts", default="none,chain,tree-32")
    parser.add_argument("--batches", default="4,16,64", help="batching (batch 1 is the lengths section)")
    parser.add_argument("--batch-drafts", default="none,chain,tree-8,tree-32")
    parser.add_argument("--batch-new-tokens", type=int, default=64)
    parser.add_argument("--max-verify-tokens", type=int, default=1024, help="batching: skip trees above batch x nodes")
    parser.add_argument("--compile-batches", default="1,16", help="batch sizes whose rounds are also compiled")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--whisper-topk", default=None, help="artifact config.json whose head_accuracy.topk to replay too")
    parser.add_argument("--check-reuse-only", action="store_true", help="only check captured-round reuse")
    args = parser.parse_args(argv)
    args.sections = [name for name in args.sections.split(",") if name]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; use any of {', '.join(SECTIONS)}.")
    return args


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tools.benchmark_gpu needs a CUDA GPU; tools.benchmark measures the CPU.")
    import shlex

    import transformers

    device, out = torch.device("cuda"), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.check_reuse_only:
        result = check_graph_reuse(device)
        write_atomic(out / "reuse_check.json", json.dumps(result, indent=2))
        print("all exact:", result["all_exact"])
        return
    model = build_model(device, torch.bfloat16, args.shape, args.text_layers)
    backbone = MERaLiON2Backbone(model)
    bandwidth, weight_bytes = measure_copy_bandwidth(device), decoder_bytes(model)
    floor_ms = weight_bytes / bandwidth * 1000
    path = out / f"results-{args.shape}.json"
    result = report_gpu.read_results(path)
    result.update({
        "shape": args.shape, "text_layers": model.config.text_config.num_hidden_layers,
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "dtype": "bfloat16", "date": time.strftime("%Y-%m-%d"),
        "copy_bandwidth_GBps": bandwidth / 1e9, "decoder_weight_GB": weight_bytes / 1e9, "floor_ms": floor_ms,
        "floor_tokens_per_s": 1000 / floor_ms,
    })
    command = shlex.join(["python", "-m", "tools.benchmark_gpu", *(sys.argv[1:] if argv is None else argv)])
    print({k: v for k, v in result.items() if not isinstance(v, (list, dict))}, flush=True)

    def section(name):
        result.setdefault("commands", {})[name] = command
        result[name] = []

        def write(rows):
            print(rows[-1], flush=True)
            result[name] = list(rows)
            write_json_atomic(path, result)  # a run cut short keeps every finished row
        return write

    result["speech_encoder_graph_ms"] = speech_encoder_ms(model, backbone)
    if "verify" in args.sections:
        verify_cost_table(model, backbone, ints(args.sizes), set(ints(args.compile_sizes)), section("verify"))
    result["fused_projections"] = backbone.fuse_projections()  # as generate() does on a GPU
    profiles = {SEED_PROFILE: rank_profile(SEED_TOP1)}
    if args.whisper_topk:
        acc = json.loads(Path(args.whisper_topk).read_text())["head_accuracy"]
        profiles["whisper_tiny_en_measured"] = rank_profile([a[0] for a in acc["topk"]], acc["topk"])
    lengths, compile_batches = ints(args.lengths), set(ints(args.compile_batches))
    if "lengths" in args.sections or "batching" in args.sections:
        max_new = max(lengths + [args.batch_new_tokens])
        bench = DecodeBench(model, backbone, args.shape, max_new, args.repeats)
        if "lengths" in args.sections:
            bench.start_section(section("lengths"))
            lengths_table(bench, profiles, args.length_drafts.split(","), lengths, 1 in compile_batches)
        if "batching" in args.sections:
            drafts = args.batch_drafts.split(",")
            by_batch = {b: [d for d in drafts if not d.startswith("tree-") or b * int(d[5:]) <= args.max_verify_tokens]
                        for b in ints(args.batches)}
            bench.start_section(section("batching"))
            batching_table(bench, profiles[SEED_PROFILE], by_batch, args.batch_new_tokens, compile_batches)
    write_json_atomic(path, result)
    table = report_gpu.render_markdown(result)
    write_atomic(path.with_suffix(".md"), table)
    print(table)
    report_gpu.write_summary(out)


if __name__ == "__main__":
    with torch.no_grad():
        main()
