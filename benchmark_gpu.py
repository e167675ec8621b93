"""GPU benchmark on a MERaLiON-2-3B-shaped model (random weights, bf16): verify-pass cost against the
memory-bandwidth floor, and the end-to-end decode loop with a *replayed* acceptance profile.

Random weights cannot draft, so the decode-loop rows replay an acceptance profile: drafts come from
the base's own known continuation and each head is right with a given per-rank probability. These
rows measure speed at a realistic acceptance, not draft quality. Prints a table, writes JSON.

    python benchmark_gpu.py --out benchmarks/gpu
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn as nn

from backbone_meralion2 import MERaLiON2Backbone
from draft_policy import cuda_ms
from medusa_decoding import CachePool, DraftTree, MedusaStats, build_tree_from_accuracy, run_rounds
from medusa_fast import CapturedRounds, capture_cuda_graph
from medusa_heads import MedusaDrafter

SEED_TOP1 = [0.76, 0.47, 0.35, 0.27]  # the seed model card's held-out per-head accuracy (MERaLiON-2-3B)
SEED_PROFILE = "seed_76_47_35_27"
PROMPT_TEXT_TOKENS = 37  # ~137-token prompt: 100 speech tokens + chat template and instruction


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
    """Same module names and sizes as MERaLiON-2-3B, built from the library's Whisper encoder and Gemma2."""

    def __init__(self, text_layers=26):
        super().__init__()
        from transformers import Gemma2Config, Gemma2ForCausalLM, GenerationConfig, WhisperConfig
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        speech = WhisperConfig(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                               num_mel_bins=128, max_source_positions=1500)
        text = Gemma2Config(hidden_size=2304, num_hidden_layers=text_layers, num_attention_heads=8,
                            num_key_value_heads=4, head_dim=256, intermediate_size=9216, vocab_size=256000,
                            sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                            query_pre_attn_scalar=256, max_position_embeddings=8192)
        text._attn_implementation = "eager"  # soft-capping needs eager attention in the library
        self.speech_encoder = WhisperEncoder(speech)
        self.ln_speech = nn.LayerNorm(1280)
        self.speech_audio_adapter = GatedAdapter()
        self.text_decoder = Gemma2ForCausalLM(text)
        self.config = type("Cfg", (), {"text_config": text, "speech_token_index": 255999})()
        self.generation_config = GenerationConfig(eos_token_id=[1, 107], pad_token_id=0)

    @property
    def device(self):
        return next(self.parameters()).device

    @property
    def dtype(self):
        return next(self.parameters()).dtype


def build_model(device, dtype, text_layers=26):
    torch.manual_seed(0)
    with torch.device(device):
        model = MERaLiON2Shaped(text_layers).to(dtype).eval().requires_grad_(False)
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


def prefill(backbone, inputs, max_new, extra, min_new=None, cache_pool=None):
    process = backbone.make_logits_processor(min_new)
    state, _, _ = backbone.prefill(inputs, max_new, extra, process, cache_pool=cache_pool)
    return state, process


# --------------------------------------------------------------------------- verify-pass cost


def verify_cost_table(model, backbone, sizes, compile_sizes, report):
    """Cost of one verify pass vs tokens verified: HF eager, ours eager / captured / compiled+captured,
    then the same with q/k/v and gate/up fused (``fuse_projections``)."""
    device = model.device
    rows = []
    inputs = make_prompt(model, 1, device)
    embeds = backbone._prompt_embeddings(inputs["input_ids"], inputs["input_features"], None)
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
        if n in compile_sizes:
            row.update(compiled_graph_ms(ours, "ours_compiled_graph_ms"))
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
    """One captured (optionally compiled) round for a draft tree and batch size, reused by every
    timed call as ``generate`` reuses it: a call = prefill into the runner's cache + the rounds."""

    def __init__(self, backbone, inputs, continuation, profile, tree, max_new, compile):
        self.backbone, self.max_new = backbone, max_new
        self.pool = CachePool()
        state, self.process = self._prefill(inputs, tree)
        self.drafter = ReplayDrafter(backbone, continuation, profile, seed=1)
        drafter = MedusaDrafter(tree, continuation.device, self.drafter) if tree.num_nodes > 1 else None
        start = time.perf_counter()
        self.runner = CapturedRounds(backbone, drafter, self.process, state, tree, compile=compile,
                                     num_generated=self.drafter.num_generated)
        torch.cuda.synchronize()
        self.setup_seconds = time.perf_counter() - start  # compile + capture, paid once per shape

    def _prefill(self, inputs, tree):
        return prefill(self.backbone, inputs, self.max_new, 2 * tree.num_nodes, min_new=self.max_new, cache_pool=self.pool)

    def __call__(self, inputs):
        """One call: prefill, then the decode rounds; returns (outputs, stats with loop_seconds)."""
        state, _ = self._prefill(inputs, self.runner.tree)
        self.runner.load(state)
        stats = MedusaStats()
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = run_rounds(self.runner, state.next_token.tolist(), self.max_new, self.backbone.eos_token_ids, stats)
        torch.cuda.synchronize()
        stats.loop_seconds = time.perf_counter() - start
        return out, stats

    def release(self):
        self.runner.release()
        self.pool.caches.clear()


def plain_continuation(backbone, inputs, max_new):
    state, process = prefill(backbone, inputs, max_new, 4, min_new=max_new)
    runner = CapturedRounds(backbone, None, process, state, DraftTree(()))
    out = run_rounds(runner, state.next_token.tolist(), max_new, backbone.eos_token_ids)
    return torch.tensor(out, device=inputs["input_ids"].device)


def seed_style_chain(model, backbone, inputs, continuation, profile, max_new, seed):
    """The seed's loop shape: HF text_decoder forward per round (eager), DynamicCache cropped on reject."""
    from transformers import DynamicCache

    embeds = backbone._prompt_embeddings(inputs["input_ids"], inputs["input_features"], None)
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


def hf_generate(model, backbone, inputs, max_new, cache_implementation=None):
    embeds = backbone._prompt_embeddings(inputs["input_ids"], inputs["input_features"], None)
    kwargs = {"cache_implementation": cache_implementation} if cache_implementation else {}
    return model.text_decoder.generate(inputs_embeds=embeds, attention_mask=torch.ones(embeds.shape[:2], device=embeds.device),
                                       max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False, **kwargs)


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


def decode_table(model, backbone, profiles, max_new, batches, compile_batches, tree_nodes, repeats, report):
    device = model.device
    rows = []
    inputs1 = make_prompt(model, 1, device)
    continuation = plain_continuation(backbone, inputs1, max_new)

    def add(name, profile_name, batch, seconds, tokens, extra=None):
        rows.append({"method": name, "profile": profile_name, "batch": batch, "seconds": seconds,
                     "tokens_per_s": tokens / seconds, **(extra or {})})
        report(rows)

    def add_replayed(draft_name, profile_name, profile, tree, batch, compile):
        row = replayed_row(backbone, inputs1, continuation, profile, tree, max_new, batch, compile, repeats)
        name = f"ours_{draft_name}_{'compiled_graph' if compile else 'graph'}"
        if "error" in row:
            rows.append({"method": name, "profile": profile_name, "batch": batch, **row})
            report(rows)
        else:
            add(name, profile_name, batch, row.pop("seconds"), batch * max_new, row)

    for compile in (False, True):
        add_replayed("greedy", "none", [[1.0]], DraftTree(()), 1, compile)
    for profile_name, profile in profiles.items():
        seconds, (tokens, rounds) = timed(lambda: seed_style_chain(model, backbone, inputs1, continuation, profile, max_new, 1), repeats=1)
        add("seed_style_eager_chain", profile_name, 1, seconds, max_new, {"rounds": rounds, "exact": tokens == continuation[0].tolist()})
        topk = [[sum(p[: r + 1]) for r in range(len(p))] for p in profile]
        trees = (("chain", DraftTree.chain(len(profile))),
                 (f"tree{tree_nodes}", DraftTree.from_paths(build_tree_from_accuracy(topk, tree_nodes))))
        main_profile = profile_name == SEED_PROFILE
        for batch in batches if main_profile else [1]:  # batch 1 first: a run cut short keeps the headline rows
            for draft_name, tree in trees:
                for compile in (False, True) if batch in compile_batches else (False,):
                    add_replayed(draft_name, profile_name, profile, tree, batch, compile)
    # Last: the library's static-cache generate compiles and captures graphs of its own.
    for cache_impl, name in ((None, "hf_generate_dynamic"), ("static", "hf_generate_static")):
        try:
            seconds, out = timed(lambda: hf_generate(model, backbone, inputs1, max_new, cache_impl), repeats=1 if cache_impl is None else repeats)
            add(name, "none", 1, seconds, max_new)
        except Exception as err:
            rows.append({"method": name, "error": f"{type(err).__name__}: {str(err)[:300]}"})
    return rows


def replayed_row(backbone, inputs1, continuation, profile, tree, max_new, batch, compile, repeats) -> dict:
    """Median end-to-end call (prefill + rounds) and decode-loop speed of one reused runner."""
    inputs = {k: v.expand(batch, *v.shape[1:]).contiguous() for k, v in inputs1.items()}
    cont = continuation.expand(batch, -1).contiguous()
    torch.cuda.reset_peak_memory_stats()
    replay = None
    try:
        replay = ReplayedRunner(backbone, inputs, cont, profile, tree, max_new, compile)
        replay(inputs)  # warm-up call
        calls, loops, stats = [], [], None
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            out, stats = replay(inputs)
            calls.append(time.perf_counter() - start)
            loops.append(stats.loop_seconds)
        exact = all(o == continuation[0].tolist() for o in out)
        return {"seconds": statistics.median(calls), "mean_accepted_per_round": stats.mean_accepted_per_round,
                "exact": exact, "decode_loop_seconds": statistics.median(loops),
                "decode_loop_tokens_per_s": batch * max_new / statistics.median(loops),
                "setup_seconds": replay.setup_seconds,
                "peak_memory_allocated_GB": torch.cuda.max_memory_allocated() / 1e9}
    except torch.OutOfMemoryError as err:
        return {"error": f"OutOfMemoryError: {str(err)[:200]}"}
    finally:
        if replay is not None:
            replay.release()
        del replay
        gc.collect()
        torch.cuda.empty_cache()


def check_graph_reuse(device) -> dict:
    """Correctness and cost of reusing captured rounds across generate calls (tiny random Whisper):
    every call must equal the base's own generate; the first call captures, later ones replay."""
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent / "tests"))
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/gpu")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--sizes", default="1,2,3,5,8,16,32,64")
    parser.add_argument("--compile-sizes", default="5,64")
    parser.add_argument("--text-layers", type=int, default=26, help="fewer for a smoke test")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--compile-batches", default="1,4,16", help="batch sizes also run with compiled rounds")
    parser.add_argument("--tree-nodes", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--whisper-topk", default=None, help="artifact config.json whose head_accuracy.topk to replay too")
    parser.add_argument("--skip-verify", action="store_true")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--check-reuse-only", action="store_true", help="only check captured-round reuse")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmark_gpu.py needs a CUDA GPU; benchmark.py measures the CPU.")
    import transformers

    device = torch.device("cuda")
    if args.check_reuse_only:
        result = check_graph_reuse(device)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "reuse_check.json").write_text(json.dumps(result, indent=2))
        print("all exact:", result["all_exact"])
        return
    model = build_model(device, torch.bfloat16, args.text_layers)
    backbone = MERaLiON2Backbone(model)
    bandwidth = measure_copy_bandwidth(device)
    weight_bytes = decoder_bytes(model)
    floor_ms = weight_bytes / bandwidth * 1000
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "dtype": "bfloat16", "date": time.strftime("%Y-%m-%d"),
        "copy_bandwidth_GBps": bandwidth / 1e9, "decoder_weight_GB": weight_bytes / 1e9, "floor_ms": floor_ms,
        "floor_tokens_per_s": 1000 / floor_ms, "max_new_tokens": args.max_new_tokens,
    }
    print(result, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def report(section):
        def write(rows):
            print(rows[-1], flush=True)
            result[section] = rows
            write_json_atomic(out / "results.json", result)  # a run cut short keeps every finished row
        return write

    if not args.skip_verify:
        verify_cost_table(model, backbone, [int(s) for s in args.sizes.split(",")],
                          {int(s) for s in args.compile_sizes.split(",")}, report("verify_pass"))
    profiles = {SEED_PROFILE: rank_profile(SEED_TOP1)}
    if args.whisper_topk:
        acc = json.loads(Path(args.whisper_topk).read_text())["head_accuracy"]
        profiles["whisper_tiny_en_measured"] = rank_profile([a[0] for a in acc["topk"]], acc["topk"])
    result["fused_projections"] = backbone.fuse_projections()  # as generate() does on a GPU
    if not args.skip_decode:
            decode_table(model, backbone, profiles, args.max_new_tokens, [int(b) for b in args.batches.split(",")],
                     [int(b) for b in args.compile_batches.split(",") if b], args.tree_nodes, args.repeats,
                     report("decode"))
    table = render_markdown(result)
    (out / "results.md").write_text(table)
    print(table)


def render_markdown(result: dict) -> str:
    floor = result["floor_ms"]
    lines = ["# GPU benchmark: MERaLiON-2-3B shape, random weights, bf16",
             "",
             f"{result['device']}, torch {result['torch']}, transformers {result['transformers']}, {result['date']}. "
             f"Floor (one read of the decoder's {result['decoder_weight_GB']:.2f} GB at the measured "
             f"{result['copy_bandwidth_GBps']:.0f} GB/s copy bandwidth): {floor:.2f} ms = {1000 / floor:.0f} tok/s.",
             "", "## One verify pass (ms; x floor)", "",
             "| tokens | HF eager | ours eager | ours graph | ours compiled+graph | fused graph | fused compiled+graph |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    cell = lambda v: "" if v is None else f"{v:.2f} ({v / floor:.2f}x)"
    for r in result.get("verify_pass", []):
        lines.append(f"| {r['tokens']} | " + " | ".join(cell(r.get(k)) for k in (
            "hf_eager_ms", "ours_eager_ms", "ours_graph_ms", "ours_compiled_graph_ms", "fused_graph_ms",
            "fused_compiled_graph_ms")) + " |")
    lines += ["", f"## Decode, {result.get('max_new_tokens', '')} tokens; replayed acceptance rows marked by profile", "",
              "| method | profile | batch | call tok/s | loop tok/s | tokens/round | exact | setup s | peak GB |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    num = lambda v, f: "" if v is None else format(v, f)
    for r in result.get("decode", []):
        if "error" in r:
            lines.append(f"| {r['method']} | {r.get('profile', '')} | {r.get('batch', '')} | {r['error'][:60]} |||||")
            continue
        lines.append(f"| {r['method']} | {r['profile']} | {r['batch']} | {r['tokens_per_s']:.0f} | "
                     f"{num(r.get('decode_loop_tokens_per_s'), '.0f')} | {num(r.get('mean_accepted_per_round'), '.2f')} | "
                     f"{r.get('exact', '')} | {num(r.get('setup_seconds'), '.1f')} | {num(r.get('peak_memory_allocated_GB'), '.1f')} |")
    return "\n".join(lines) + "\n"


def write_json_atomic(path: Path, data):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


if __name__ == "__main__":
    with torch.no_grad():
        main()
