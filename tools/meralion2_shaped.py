"""MERaLiON-2-shaped models with random weights (3B or 10B decoder, Whisper-large-v3 encoder, gated adapter:
the module names and sizes of the real ones) and the replayed acceptance that drives their drafts: random weights
cannot draft, so each head's token is the base's own known continuation put at a sampled rank. What
``benchmark_gpu`` times; speed only, never draft quality."""

from __future__ import annotations

import time

import torch
import torch.nn as nn

from draft_trees import DraftTree
from kv_cache import CachePool
from medusa_decoding import MedusaStats, run_rounds
from medusa_fast import CapturedCalls, CapturedRounds
from medusa_heads import MedusaDrafter
from tools.runtime import synchronize

SEED_TOP1 = [0.76, 0.47, 0.35, 0.27]  # the seed model card's held-out per-head accuracy (MERaLiON-2-3B)
SEED_PROFILE = "seed_76_47_35_27"
PROMPT_TEXT_TOKENS = 37  # ~137-token prompt: 100 speech tokens + chat template and instruction
SHAPES = {  # the Gemma2 decoders of MERaLiON-2-3B (Gemma2-2B) and MERaLiON-2-10B (Gemma2-9B)
    "meralion2-3b": {"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
                     "num_key_value_heads": 4, "intermediate_size": 9216},
    "meralion2-10b": {"hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
                      "num_key_value_heads": 8, "intermediate_size": 14336},
}
GEMMA2_HEAD_DIM, GEMMA2_VOCAB = 256, 256000
TINY_WIDTHS = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 128,
               "head_dim": 32}  # ``tiny``: a shape's layer count at widths a CPU compiles and runs in seconds


def weight_products(shape: str) -> dict:
    """name -> (in, out, per layer): the weight products of a verify pass of the shape, with q/k/v and gate/up fused
    as ``generate`` fuses them on a GPU."""
    config = SHAPES[shape]
    hidden, heads, kv, mlp = (config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                  "intermediate_size"))
    return {"qkv": (hidden, (heads + 2 * kv) * GEMMA2_HEAD_DIM, True), "o": (heads * GEMMA2_HEAD_DIM, hidden, True),
            "gate_up": (hidden, 2 * mlp, True), "down": (mlp, hidden, True), "lm_head": (hidden, GEMMA2_VOCAB, False)}


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


def speech_encoder_config(attention: str = "sdpa", tiny: bool = False):
    """MERaLiON-2's speech encoder (Whisper-large-v3's; ``tiny``: 2 layers of width 64); SDPA attention as
    ``MedusaForASR`` loads it (``speech_attention_as_sdpa``)."""
    from transformers import WhisperConfig

    widths = dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128) if tiny else \
        dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120)
    config = WhisperConfig(**widths, num_mel_bins=128, max_source_positions=1500)
    config._attn_implementation = attention
    return config


class MERaLiON2Shaped(nn.Module):
    """Same module names and sizes as MERaLiON-2 (``SHAPES``), built from the library's Whisper encoder
    (Whisper-large-v3's) and Gemma2."""

    def __init__(self, shape="meralion2-3b", text_layers=None, tiny=False):
        super().__init__()
        from transformers import Gemma2Config, Gemma2ForCausalLM, GenerationConfig
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        speech = speech_encoder_config(tiny=tiny)
        sizes = {**SHAPES[shape], "head_dim": GEMMA2_HEAD_DIM, **(TINY_WIDTHS if tiny else {}),
                 **({"num_hidden_layers": text_layers} if text_layers else {})}
        text = Gemma2Config(**sizes, vocab_size=256000, sliding_window=4096, final_logit_softcapping=30.0,
                            attn_logit_softcapping=50.0, query_pre_attn_scalar=sizes["head_dim"],
                            max_position_embeddings=8192)
        text._attn_implementation = "eager"  # soft-capping needs eager attention in the library
        self.speech_encoder = WhisperEncoder(speech)
        self.ln_speech = nn.LayerNorm(speech.d_model)
        self.speech_audio_adapter = GatedAdapter(speech.d_model, sizes["hidden_size"], inner=128 if tiny else 6400)
        self.text_decoder = Gemma2ForCausalLM(text)
        self.config = type("Cfg", (), {"text_config": text, "speech_token_index": 255999})()
        self.generation_config = GenerationConfig(eos_token_id=[1, 107], pad_token_id=0)

    @property
    def device(self):
        return next(self.parameters()).device

    @property
    def dtype(self):
        return next(self.parameters()).dtype


def build_model(device, dtype, shape="meralion2-3b", text_layers=None, tiny=False):
    torch.manual_seed(0)
    with torch.device(device):
        model = MERaLiON2Shaped(shape, text_layers, tiny).to(dtype).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model


def decoder_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.text_decoder.parameters())


# --------------------------------------------------------------------------- prompt & prefill


def make_prompt(model, batch, device):
    features = torch.randn(batch, 128, 3000, device=device, dtype=model.dtype)
    ids = torch.randint(2, 200000, (batch, PROMPT_TEXT_TOKENS + 100), device=device)
    ids[:, 10:110] = 255999
    return {"input_ids": ids, "input_features": features, "feature_attention_mask": torch.ones(batch, 3000, device=device)}


def prefill(backbone, inputs, max_new, extra, min_new=None, cache_pool=None, capture=None, compile=False):
    process = backbone.make_logits_processor(min_new)
    state, _, _ = backbone.prefill(inputs, max_new, extra, process, cache_pool=cache_pool, capture=capture,
                                   compile=compile)
    return state, process


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
    runner's own count of emitted tokens (shared buffer), so the drafts follow the decode. Its cost is only that
    of writing and searching those logits: ``HeadsCostDrafter`` also pays what trained heads compute."""

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
        drafts = torch.zeros(hidden.shape[0], self.num_heads, self.vocab, device=hidden.device, dtype=hidden.dtype)
        return self.replayed(drafts, lambda tokens: tokens)

    def token_ids(self, indices):
        """The token ids of the logits' columns (``MedusaDrafter``'s ``token_ids``)."""
        return indices

    def replayed(self, drafts, column):
        """``drafts`` [B, K, columns] (at most 0 everywhere) with this round's replayed ranks written in: the true token
        (column ``column(token)``) at its sampled rank with a score of 10 - rank, decoys above it (0 for a miss)."""
        batch, device = drafts.shape[0], drafts.device
        heads = torch.arange(self.num_heads, device=device)
        pos = (self.num_generated[:, None] + heads[None, :]).clamp(max=self.cont.shape[1] - 1)  # [B, K]
        true = self.cont.gather(1, pos)
        rank = self.rank_table[torch.arange(batch, device=device)[:, None], pos, heads[None, :]]
        for j in range(self.ranks):
            decoy = column(decoy_token(true, j, self.vocab))
            drafts.scatter_(2, decoy[..., None], torch.where(j < rank, 10.0 - j, 0.0)[..., None].to(drafts.dtype))
        score = torch.where(rank < self.ranks, 10.0 - rank.float(), torch.zeros_like(rank, dtype=torch.float32))
        drafts.scatter_(2, column(true)[..., None], score[..., None].to(drafts.dtype))
        return drafts


def decoy_token(true, j: int, vocab: int):
    """The token a replayed head ranks j-th above a true token it does not put first."""
    return (true + 1 + j) % vocab


class HeadsCostDrafter(ReplayDrafter):
    """The replayed drafts at the cost of trained Medusa heads: every round ``num_heads`` residual heads of
    ``layers`` blocks (random weights) run on the root's hidden state and project onto a draft vocabulary of
    ``draft_vocab`` rows of the base's output projection (as the pipeline trains them), and the replayed ranks are
    written over their logits (shifted far below), so acceptance is the replay's and the time is the heads'. The
    draft vocabulary holds every token the replay can write (the continuation's and their decoys)."""

    def __init__(self, backbone, continuation, profile, seed=0, draft_vocab=8192, layers=1):
        super().__init__(backbone, continuation, profile, seed)
        from medusa_heads import DraftProjection, MedusaHeads

        device, weight = continuation.device, backbone.output_projection.weight
        written = torch.cat([continuation.flatten()] + [decoy_token(continuation, j, self.vocab).flatten()
                                                        for j in range(self.ranks)]).unique()
        draft_vocab = min(draft_vocab, self.vocab)
        if len(written) > draft_vocab:
            raise ValueError(f"draft_vocab={draft_vocab} cannot hold the {len(written)} tokens the replay writes")
        others = torch.ones(self.vocab, dtype=torch.bool, device=device)
        others[written] = False
        fill = others.nonzero()[:, 0][: draft_vocab - len(written)]
        self.vocab_ids = torch.cat([written, fill]).sort().values
        self.columns = torch.zeros(self.vocab, dtype=torch.long, device=device)
        self.columns[self.vocab_ids] = torch.arange(len(self.vocab_ids), device=device)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        self.heads = MedusaHeads(self.num_heads, layers, weight.shape[1])
        for parameter in self.heads.parameters():  # (zero-initialised heads would be the identity: still the cost)
            parameter.data = (torch.randn(parameter.shape, generator=generator) * 0.02).to(device, weight.dtype)
        self.projection = DraftProjection(backbone, self.vocab_ids)

    def __call__(self, hidden):
        logits = self.projection.logits(self.heads(hidden)) - 1e4  # [B, K, draft_vocab], below every replayed score
        return self.replayed(logits, lambda tokens: self.columns[tokens])

    def token_ids(self, indices):
        return self.vocab_ids[indices]


class ReplayedVerdicts:
    """A backbone whose next-token choice is replayed: ``own[b, i]``, the token this model is taken to choose at
    output index ``i`` (given the target's tokens before it), stands in for its argmax. Its output projection and
    rules still run, at their full cost. Random weights cannot agree with another model; this is how an
    intermediate model's agreement with the target is replayed (``own_continuation``)."""

    def __init__(self, backbone, own: torch.Tensor):
        self.backbone, self.own = backbone, own
        self.replaying = torch.ones((), dtype=torch.bool, device=own.device)  # a tensor: never folded away

    def __getattr__(self, name):
        return getattr(self.backbone, name)

    def predict(self, hidden, rules, num_generated, path):
        real = self.backbone.predict(hidden, rules, num_generated, path)
        return torch.where(self.replaying, self.own.gather(1, num_generated.clamp(max=self.own.shape[1] - 1)), real)


def own_continuation(continuation: torch.Tensor, agreement: float, length: int, vocab: int, seed: int = 0):
    """What a model that agrees with the target on each next token with probability ``agreement`` (given the
    target's tokens before it) would choose at each of ``length`` output indices: the target's continuation
    with each token after the first replaced by another one with probability ``1 - agreement`` (and past its
    end, other tokens)."""
    batch, known = continuation.shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    own = (torch.arange(length)[None, :] * 7919 + 13).remainder(vocab).repeat(batch, 1).to(continuation.device)
    known = min(known, length)
    own[:, :known] = continuation[:, :known]
    misses = torch.rand(batch, length, generator=gen) >= agreement
    misses[:, 0] = False  # the first token is the target's own (the intermediate follows it from the start)
    misses = misses.to(continuation.device)
    return torch.where(misses & (torch.arange(length, device=own.device) < known), (own + 1) % vocab, own)


DRAFTER_COSTS = ("replay", "heads")


def replay_drafter(cost: str, backbone, continuation, profile, seed=0) -> ReplayDrafter:
    """``cost``: "replay" (only the replayed logits' own cost) or "heads" (also what trained heads with a draft
    vocabulary compute: ``HeadsCostDrafter``)."""
    if cost not in DRAFTER_COSTS:
        raise ValueError(f"drafter cost {cost!r}: use one of {', '.join(DRAFTER_COSTS)}")
    kind = HeadsCostDrafter if cost == "heads" else ReplayDrafter
    return kind(backbone, continuation, profile, seed=seed)


class ReplayedRunner:
    """One captured (optionally compiled) round for a draft tree and batch size, reused by every timed call
    as ``generate`` reuses it: a call = the captured prefill (speech encoder, adapter and the prompt's pass as
    one CUDA graph, into the runner's cache; with ``compile``, the prompt's pass compiled as ``generate``'s is) +
    the rounds. Sized for ``max_new`` tokens; a call may stop
    sooner (its tokens are then the first of the same continuation)."""

    def __init__(self, backbone, inputs, continuation, profile, tree, max_new, compile, drafter_cost="replay"):
        self.backbone, self.max_new, self.compile = backbone, max_new, compile
        self.pool, self.calls = CachePool(), CapturedCalls()
        state, self.process = self._prefill(inputs, tree)
        self.drafter = replay_drafter(drafter_cost, backbone, continuation, profile, seed=1)
        drafter = (MedusaDrafter(tree, continuation.device, self.drafter, self.drafter.token_ids)
                   if tree.num_nodes > 1 else None)
        start = time.perf_counter()
        self.runner = CapturedRounds(backbone, drafter, self.process, state, tree, compile=compile,
                                     num_generated=self.drafter.num_generated)
        synchronize(continuation.device)
        self.setup_seconds = time.perf_counter() - start  # compile + capture, paid once per shape

    def _prefill(self, inputs, tree):
        capture = self.calls if self.backbone.device.type == "cuda" else None  # (CUDA graphs: a GPU's only)
        return prefill(self.backbone, inputs, self.max_new, 2 * tree.num_nodes, min_new=self.max_new,
                       cache_pool=self.pool, capture=capture, compile=self.compile)

    @property
    def prefill_captured(self) -> bool:
        return bool(self.calls.graphs) and all(entry is not None for entry in self.calls.graphs.values())

    def __call__(self, inputs, new_tokens=None):
        """One call: prefill, then the rounds; returns (outputs, stats with prefill_seconds (the time to the
        first token) and loop_seconds)."""
        device = self.backbone.device
        synchronize(device)
        start = time.perf_counter()
        state, _ = self._prefill(inputs, self.runner.tree)
        self.runner.load(state)
        first = state.next_token.tolist()
        stats = MedusaStats()
        stats.prefill_seconds = time.perf_counter() - start
        start = time.perf_counter()
        out = run_rounds(self.runner, first, new_tokens or self.max_new, self.backbone.eos_token_ids, stats)
        synchronize(device)
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
    return torch.tensor(out, device=backbone.device)
