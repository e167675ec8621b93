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
    python -m tools.benchmark_gpu --shape whisper-large-v3 --sections lengths,batching --batches 16 \
        --batch-new-tokens 16,32,64,128      # Whisper shapes (tools.whisper_shaped): whole calls and decode alone

Whisper shapes (``whisper-large-v3``, ``whisper-large-v3-turbo``: the library's own model, real config, random
weights) replay the shipped whisper-base heads' measured per-head top-k; their rows also give the call without its
encoder (``decode_tok_per_s``: the library's generate given the encoder's output; ours: the call less the encoder's
time at that batch size, ``encoder_ms``). ``--device cpu --tiny`` runs the same path at a tiny size (a smoke test).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from tools import cli_args
from tools import benchmark_gpu_report as report_gpu
from tools import runtime
from tools import whisper_shaped
from tools.files import command_line, write_atomic, write_json_atomic
from backbone import encoder_output
from backbone_meralion2 import MERaLiON2Backbone
from backbone_whisper import WhisperBackbone
from draft_timing import cuda_ms
from draft_trees import DraftTree, build_tree_from_accuracy
from kv_cache import CachePool
from medusa_fast import capture_cuda_graph
from tools.meralion2_shaped import (DRAFTER_COSTS, SEED_PROFILE, SEED_TOP1, SHAPES, ReplayDrafter, ReplayedRunner,
                                   build_model, decoder_bytes, make_prompt, plain_continuation, prefill, rank_profile)

SECTIONS = ("verify", "lengths", "batching")
ALL_SHAPES = sorted({**SHAPES, **whisper_shaped.SHAPES})


# --------------------------------------------------------------------------- timing helpers


def measure_copy_bandwidth(device, gib=4) -> float:
    n = gib * (1 << 30) // 2
    src, dst = torch.empty(n, dtype=torch.bfloat16, device=device), torch.empty(n, dtype=torch.bfloat16, device=device)
    src.normal_()
    ms = time_cuda(lambda: dst.copy_(src), repeats=20)
    return 2 * n * 2 / (ms / 1000)  # bytes read + written per second


def reset_peak_memory(device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gb(device) -> float | None:
    return torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else None


def free_memory(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def time_cuda(fn, repeats=30, warmup=5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(cuda_ms(fn) for _ in range(repeats))


# --------------------------------------------------------------------------- verify-pass cost


def verify_cost_table(model, backbone, sizes, compile_sizes, report):
    """Cost of one verify pass vs tokens verified: HF eager, ours eager / captured, then with q/k/v and
    gate/up fused (``fuse_projections``, what ``generate`` runs on a GPU) captured and compiled + captured."""
    device = model.device
    rows = []
    inputs = make_prompt(model, 1, device)
    embeds = backbone.prompt_embeddings(inputs["input_ids"], inputs["input_features"])
    from transformers import DynamicCache

    for n in sizes:
        row = {"tokens": n}
        ids = torch.randint(2, 200000, (1, n), device=device)
        cache = DynamicCache()
        model.text_decoder(inputs_embeds=embeds, past_key_values=cache, use_cache=True)

        def hf_eager():
            model.text_decoder(input_ids=ids, past_key_values=cache, use_cache=True)
            cache.crop(-n)

        row["hf_eager_ms"] = time_cuda(hf_eager, repeats=15)
        ours = verify_pass(backbone, inputs, n)
        row["ours_eager_ms"] = time_cuda(ours, repeats=15)
        row["ours_graph_ms"] = graph_ms(ours)
        rows.append(row)
        report(rows)
    if backbone.fuse_projections():
        for row in rows:
            ours = verify_pass(backbone, inputs, row["tokens"])
            row["fused_graph_ms"] = graph_ms(ours)
            if row["tokens"] in compile_sizes:
                row.update(compiled_graph_ms(ours, "fused_compiled_graph_ms"))
            report(rows)
    return rows


def verify_pass(backbone, inputs, n):
    """One verify pass of ``n`` tokens (decoder + output projection) on a prefilled prompt, as a function to time.
    The cache comes from a ``CachePool`` as in ``generate``: its capacity rounded up to 128 slots (an odd capacity
    sends the attention's products to cuBLAS's unaligned kernels)."""
    device = inputs["input_ids"].device
    ids = torch.randint(2, 200000, (inputs["input_ids"].shape[0], n), device=device)
    state, _ = prefill(backbone, inputs, 8, 2 * n, cache_pool=CachePool())
    tt = (DraftTree.chain(n - 1) if n > 1 else DraftTree(())).tensors(device)
    upto = state.cache.capacity  # the captured rounds attend over the whole cache
    return lambda: backbone.logits(backbone.decode(state, ids, tt.depths, tt.ancestors, upto))


def speech_encoder_ms(model, backbone) -> float:
    """One 30 s window through the speech encoder, ln_speech and the adapter, as a CUDA graph: the part of
    the prefill no decoder change can shorten (as ``generate`` runs it: the residual stream contiguous)."""
    features = backbone.speech_features(make_prompt(model, 1, model.device)["input_features"])
    return graph_ms(lambda: model.speech_audio_adapter(model.ln_speech(encoder_output(model.speech_encoder, features))))


def graph_ms(fn) -> float:
    graph = capture_cuda_graph(fn, warmups=3)
    ms = time_cuda(graph.replay)
    del graph
    return ms


def encoder_graph_ms(backbone, features) -> float:
    """A Whisper encoder over ``features`` plus every decoder layer's cross-attention keys and values (what our
    prefill runs before the decoder prompt), as a CUDA graph; on a CPU the median of timed calls."""
    fn = lambda: backbone._speech_kv_of(features)  # noqa: E731
    if features.device.type == "cuda":
        return graph_ms(fn)
    return timed(fn, repeats=3, device=features.device)[0] * 1000


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


def seed_style_chain(model, backbone, inputs, continuation, profile, max_new, seed):
    """The seed's loop shape: HF text_decoder forward per round (eager), DynamicCache cropped on reject."""
    from transformers import DynamicCache

    embeds = backbone.prompt_embeddings(inputs["input_ids"], inputs["input_features"])
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
    embeds = backbone.prompt_embeddings(inputs["input_ids"], inputs["input_features"])
    kwargs = {}
    if cache is not None:
        cache.reset()
        kwargs["past_key_values"] = cache
    return model.text_decoder.generate(inputs_embeds=embeds, attention_mask=torch.ones(embeds.shape[:2], device=embeds.device),
                                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **kwargs)


def hf_static_cache(model, capacity):
    from transformers import StaticCache

    return StaticCache(config=model.text_decoder.config, max_cache_len=capacity)


def timed(fn, repeats=3, device=torch.device("cuda")):
    fn()  # warm-up
    runtime.synchronize(device)
    times = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        runtime.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def meralion2_hf_calls(model, backbone, method, inputs, longest):
    """(the library's generate at ``n`` new tokens as ``call(n)``, None: no decode-only form) for a MERaLiON-2 shape."""
    cache = hf_static_cache(model, inputs["input_ids"].shape[1] + longest) if method == "hf_static" else None
    return (lambda n: hf_generate(model, backbone, inputs, n, cache)), None


def whisper_hf_calls(model, backbone, method, inputs, longest):
    """(whole call ``call(n)``, the call given the encoder's output ``decode(n)``) of the library's Whisper generate;
    ``hf_static``: one static cache for both and every length."""
    capacity = len(backbone.prompt_template()) + longest
    cache = whisper_shaped.hf_static_cache(model, capacity) if method == "hf_static" else None
    encoded = model.model.encoder(inputs["input_features"]).last_hidden_state
    return (lambda n: whisper_shaped.hf_generate(model, inputs, n, cache),
            lambda n: whisper_shaped.hf_generate(model, inputs, n, cache, encoded=encoded))


@dataclasses.dataclass
class Shaped:
    """A shape's random-weight model and what the benchmark needs of its family."""

    model: object
    backbone: object
    make_prompt: Callable  # (model, batch, device) -> inputs
    hf_calls: Callable  # (model, backbone, method, inputs, longest new tokens) -> (call(n), decode(n) or None)
    layers: int  # decoder layers
    weight_bytes: int  # the decoder's
    profiles: dict  # name -> replayed rank profile; the first is the shape's own
    labels: dict  # written into every decode row
    encoder_per_batch: bool = False  # rows give the encoder's time and the call without it

    @property
    def profile(self) -> str:
        return next(iter(self.profiles))


def meralion2_of(model, backbone=None, profiles=None) -> Shaped:
    """A MERaLiON-2-shaped ``model`` (``tools.meralion2_shaped``) as the benchmark takes it; the seed profile unless
    ``profiles``."""
    return Shaped(model, backbone or MERaLiON2Backbone(model), make_prompt, meralion2_hf_calls,
                  model.config.text_config.num_hidden_layers, decoder_bytes(model),
                  profiles or {SEED_PROFILE: rank_profile(SEED_TOP1)}, {})


def meralion2_shaped(args, device) -> Shaped:
    model = build_model(device, torch.bfloat16, args.shape, args.text_layers)
    profiles = {SEED_PROFILE: rank_profile(SEED_TOP1)}
    if args.whisper_topk:
        acc = json.loads(Path(args.whisper_topk).read_text())["head_accuracy"]
        profiles["whisper_tiny_en_measured"] = rank_profile([a[0] for a in acc["topk"]], acc["topk"])
    return meralion2_of(model, profiles=profiles)


def whisper_large_shaped(args, device) -> Shaped:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = whisper_shaped.build_model(device, dtype, args.shape, args.text_layers, tiny=args.tiny)
    name, profile = whisper_shaped.measured_profile()
    labels = {"speed_only": True, "weights": "random" + (" (tiny widths)" if args.tiny else ""),
              "acceptance": "replayed: the shipped heads/whisper-base path heads' measured held-out per-head top-k "
                            "(config.json head_accuracy.topk)"}
    return Shaped(model, WhisperBackbone(model), whisper_shaped.make_prompt, whisper_hf_calls,
                  model.config.decoder_layers, whisper_shaped.decoder_bytes(model), {name: profile}, labels,
                  encoder_per_batch=True)


# --------------------------------------------------------------------------- decode tables


class DecodeBench:
    """Whole calls on one prompt (repeated ``batch`` times) with a known greedy continuation: ours with a
    replayed profile, our plain greedy, and the library's generate (static and dynamic cache), each row
    one measurement of ``new_tokens`` per row of the batch."""

    def __init__(self, shaped: Shaped, shape, max_new, repeats, drafter_cost="replay"):
        self.shaped, self.model, self.backbone, self.shape = shaped, shaped.model, shaped.backbone, shape
        self.device = self.backbone.device
        self.max_new, self.repeats, self.drafter_cost = max_new, repeats, drafter_cost
        self.inputs1 = shaped.make_prompt(self.model, 1, self.device)
        self.continuation = plain_continuation(self.backbone, self.inputs1, max_new)
        self.rows, self.report, self.encoder_ms = [], None, {}

    def start_section(self, report):
        """Rows from here on go to ``report`` (one results section)."""
        self.rows, self.report = [], report

    def batched(self, batch):
        inputs = {k: v.expand(batch, *v.shape[1:]).contiguous() for k, v in self.inputs1.items()}
        return inputs, self.continuation.expand(batch, -1).contiguous()

    def add(self, row):
        self.rows.append({"shape": self.shape, **row, **self.shaped.labels})
        self.report(self.rows)

    def encoder_ms_at(self, batch) -> float:
        """The encoder (and cross-attention keys and values) at ``batch``, timed once per batch size."""
        if batch not in self.encoder_ms:
            self.encoder_ms[batch] = encoder_graph_ms(self.backbone, self.batched(batch)[0]["input_features"])
        return self.encoder_ms[batch]

    def without_encoder(self, row, batch) -> dict:
        """``row`` with the encoder's time and the call's tokens per second without it (for shapes that time it)."""
        if not self.shaped.encoder_per_batch or "call_seconds" not in row:
            return row
        encoder_ms = self.encoder_ms_at(batch)
        decode = row["call_seconds"] - encoder_ms / 1000
        return {**row, "encoder_ms": encoder_ms, "decode_tok_per_s": batch * row["new_tokens"] / decode}

    def ours(self, method, draft, tree, profile_name, profile, batch, lengths, compile):
        """``method`` ("ours" / "ours_greedy") with one runner, timed at each of ``lengths``."""
        inputs, cont = self.batched(batch)
        base = {"method": method, "draft": draft, "profile": profile_name, "batch": batch,
                "rounds_mode": "compiled" if compile else "graph" if self.device.type == "cuda" else "eager",
                "drafter_cost": self.drafter_cost}
        reset_peak_memory(self.device)
        replay = None
        try:
            replay = ReplayedRunner(self.backbone, inputs, cont, profile, tree, self.max_new, compile, self.drafter_cost)
            replay(inputs)  # warm-up call
            for n in lengths:
                self.add(self.without_encoder({**base, **self.call_row(replay, inputs, n, batch)}, batch))
        except torch.OutOfMemoryError as err:
            self.add({**base, "error": f"OutOfMemoryError: {str(err)[:200]}"})
        finally:
            if replay is not None:
                replay.release()
            del replay
            free_memory(self.device)

    def call_row(self, replay, inputs, n, batch) -> dict:
        """Whole calls of a runner (``runner(inputs, n) -> (outputs, stats)``, timed apart), medians of the repeats."""
        calls, loops, prefills, stats, out = [], [], [], None, None
        for _ in range(self.repeats):
            runtime.synchronize(self.device)
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
                "peak_memory_allocated_GB": peak_memory_gb(self.device)}

    def hf(self, method, batch, lengths):
        """The library's generate: ``hf_static`` (one StaticCache for every length; the library compiles
        its forward) or ``hf_dynamic`` (eager, one repeat: it is slow); where the family has one, also the call
        given the encoder's output (``decode_tok_per_s``)."""
        inputs, _ = self.batched(batch)
        reset_peak_memory(self.device)
        repeats = self.repeats if method == "hf_static" else 1
        try:
            call, decode = self.shaped.hf_calls(self.model, self.backbone, method, inputs, max(lengths))
            for n in lengths:
                seconds, out = timed(lambda: call(n), repeats, self.device)
                row = {"method": method, "draft": "none", "profile": "none", "batch": batch, "new_tokens": n,
                       "call_seconds": seconds, "call_tok_per_s": batch * n / seconds,
                       "matches_our_greedy": all(r[-n:].tolist() == self.continuation[0, :n].tolist() for r in out)}
                if decode is not None:
                    decode_seconds, _ = timed(lambda: decode(n), repeats, self.device)
                    row.update(decode_seconds=decode_seconds, decode_tok_per_s=batch * n / decode_seconds)
                self.add({**row, "peak_memory_allocated_GB": peak_memory_gb(self.device)})
        except Exception as err:  # the library's compile support varies by version
            self.add({"method": method, "batch": batch, "error": f"{type(err).__name__}: {str(err)[:300]}"})
        free_memory(self.device)

    def seed_style(self, profile_name, profile, n):
        if not isinstance(self.backbone, MERaLiON2Backbone):  # (the seed's loop ran MERaLiON-2's text decoder)
            return
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
    """Name ("none", "chain" or its result name "chain-K", "tree-N") -> DraftTree for a replayed profile."""
    topk = [[sum(p[: r + 1]) for r in range(len(p))] for p in profile]
    trees = {}
    for name in names:
        if name == "none":
            trees[name] = DraftTree(())
        elif name.startswith("chain"):
            trees[f"chain-{len(profile)}"] = DraftTree.chain(len(profile))
        else:
            trees[name] = DraftTree.from_paths(build_tree_from_accuracy(topk, int(name.split("-")[1])))
    return trees


LENGTH_GROUPS = ("ours", "hf")  # the lengths section's rows, measured in one run or in parts


def lengths_table(bench, profiles, drafts, lengths, compile, groups=LENGTH_GROUPS):
    """Batch 1 at realistic ASR output lengths, whole calls: our loop's rows (drafts, greedy, the seed-style
    chain) and/or the library's generate (``groups``)."""
    if "ours" in groups:
        for profile_name, profile in profiles.items():
            for name, tree in draft_trees(profile, drafts).items():
                if name == "none" and profile_name != next(iter(profiles)):
                    continue
                method = "ours_greedy" if name == "none" else "ours"
                bench.ours(method, name, tree, profile_name if name != "none" else "none", profile, 1, lengths, compile)
            bench.seed_style(profile_name, profile, max(lengths))  # (the longest length this run measures)
    if "hf" in groups:
        for method in ("hf_static", "hf_dynamic"):
            bench.hf(method, 1, lengths)


def length_rows_kept(rows: list[dict], groups, lengths=None) -> list[dict]:
    """Earlier lengths rows a run keeps: those of the method groups it does not measure ("hf": the library's
    generate, "ours": every row of our loop) and those of lengths it does not measure (``lengths``; None: all), so
    the section can be measured in parts."""
    def measured_again(row):
        group = "hf" if row.get("method", "").startswith("hf_") else "ours"
        return group in groups and (lengths is None or row.get("new_tokens") in lengths)
    return [row for row in rows if not measured_again(row)]


def batching_table(bench, profile_name, profile, drafts_by_batch, lengths, compile_batches):
    """Batch sizes against batched greedy (ours without drafts, the library's generate) at each of ``lengths``."""
    for batch, drafts in drafts_by_batch.items():
        for name, tree in draft_trees(profile, drafts).items():
            method = "ours_greedy" if name == "none" else "ours"
            bench.ours(method, name, tree, "none" if name == "none" else profile_name, profile, batch, lengths,
                       batch in compile_batches)
        for method in ("hf_static", "hf_dynamic"):
            bench.hf(method, batch, lengths)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/gpu")
    parser.add_argument("--shape", choices=ALL_SHAPES, default="meralion2-3b")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: Whisper shapes only, with --tiny, to smoke-test the path (no CUDA graphs, float32)")
    parser.add_argument("--tiny", action="store_true", help="Whisper shapes: tiny widths and one encoder layer")
    parser.add_argument("--sections", default="verify,lengths,batching", help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--text-layers", type=cli_args.positive_int, default=None, help="fewer decoder layers, for a smoke test")
    parser.add_argument("--sizes", type=cli_args.positive_ints_text, default="1,2,3,5,8,16,32,64", help="verify: tokens per pass")
    parser.add_argument("--compile-sizes", type=cli_args.positive_ints_text, default="5,64", help="verify: sizes also compiled")
    parser.add_argument("--lengths", type=cli_args.positive_ints_text, default="16,32,64,128", help="lengths: new tokens per call, batch 1")
    parser.add_argument("--length-drafts", default="none,chain,tree-32")
    parser.add_argument("--length-methods", default=",".join(LENGTH_GROUPS),
                        help="lengths: ours (our loop's rows) and/or hf (the library's generate); the earlier rows "
                             "of a group not named are kept")
    parser.add_argument("--batches", type=cli_args.positive_ints_text, default="4,16,64", help="batching (batch 1 is the lengths section)")
    parser.add_argument("--batch-drafts", default="none,chain,tree-8,tree-32")
    parser.add_argument("--batch-new-tokens", type=cli_args.positive_ints_text, default="64",
                        help="batching: new tokens per call (comma-separated: several lengths)")
    parser.add_argument("--max-verify-tokens", type=cli_args.positive_int, default=1024, help="batching: skip trees above batch x nodes")
    parser.add_argument("--compile-batches", type=cli_args.positive_ints_text, default=None,
                        help="batch sizes whose rounds are compiled (default: 1,16 for MERaLiON-2 shapes, none for "
                             "Whisper shapes: a 32-layer round's compile would not fit a short device call)")
    parser.add_argument("--repeats", type=cli_args.positive_int, default=3)
    parser.add_argument("--drafter-cost", choices=DRAFTER_COSTS, default="replay",
                        help="replay: the replayed drafts' own cost; heads: also what trained heads with an 8 192-token "
                             "draft vocabulary compute each round (tools.meralion2_shaped.HeadsCostDrafter)")
    parser.add_argument("--whisper-topk", default=None, help="artifact config.json whose head_accuracy.topk to replay too")
    args = parser.parse_args(argv)
    args.sections = [name for name in args.sections.split(",") if name]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; use any of {', '.join(SECTIONS)}.")
    unknown = {g for g in args.length_methods.split(",") if g} - set(LENGTH_GROUPS)
    if unknown:
        parser.error(f"--length-methods: unknown {sorted(unknown)}; use any of {', '.join(LENGTH_GROUPS)}.")
    whisper = args.shape in whisper_shaped.SHAPES
    if (args.device == "cpu" or args.tiny) and not whisper:
        parser.error("--device cpu and --tiny are for the Whisper shapes.")
    if whisper and "verify" in args.sections:
        parser.error("--sections verify is measured on the MERaLiON-2 shapes; use lengths,batching.")
    if args.compile_batches is None:
        args.compile_batches = "" if whisper else "1,16"
    return args


def rows_not_measured_again(rows: list[dict], batches: set, compile_batches: set) -> list[dict]:
    """Earlier batching rows a run keeps: other batch sizes, and its own sizes' rows in the other rounds mode (so
    batch sizes can be measured in parts, each within a device call's time limit)."""
    def measured_again(row):
        if row["batch"] not in batches:
            return False
        mode = "compiled" if row["batch"] in compile_batches else "graph"
        return row.get("rounds_mode", mode) == mode  # (the library's rows have no mode: measured again)
    return [row for row in rows if not measured_again(row)]


def naming_their_run(rows: list[dict], section_command: str | None) -> list[dict]:
    """Rows a rerun keeps, each with the command of the run that measured it: a row without its own named the
    section's command, which the rerun replaces."""
    return [{**row, "command": row.get("command", section_command)} for row in rows]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def build_shaped(args, device) -> Shaped:
    return (whisper_large_shaped if args.shape in whisper_shaped.SHAPES else meralion2_shaped)(args, device)


def machine_facts(device) -> dict:
    import transformers

    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({platform.processor() or 'cpu'})"
    return {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def floor_facts(device, weight_bytes) -> dict:
    """The decoder's one-read floor at the measured copy bandwidth (a GPU's; none on a CPU)."""
    if device.type != "cuda":
        return {"decoder_weight_GB": weight_bytes / 1e9, "floor_ms": None}
    bandwidth = measure_copy_bandwidth(device)
    floor_ms = weight_bytes / bandwidth * 1000
    return {"copy_bandwidth_GBps": bandwidth / 1e9, "decoder_weight_GB": weight_bytes / 1e9, "floor_ms": floor_ms,
            "floor_tokens_per_s": 1000 / floor_ms}


def main(argv=None):
    args = parse_args(argv)
    runtime.time_drafts_afresh()
    device, out = torch.device(args.device), Path(args.out)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("tools.benchmark_gpu needs a CUDA GPU; tools.benchmark measures the CPU.")
    out.mkdir(parents=True, exist_ok=True)
    shaped = build_shaped(args, device)
    model, backbone = shaped.model, shaped.backbone
    path = out / f"results-{args.shape}.json"
    result = report_gpu.read_results(path)
    result.update({"shape": args.shape, "text_layers": shaped.layers, **machine_facts(device),
                   "dtype": str(model.dtype).removeprefix("torch."), "profile": shaped.profile, **shaped.labels})
    if "verify" in args.sections or "floor_ms" not in result:  # the floor the verify rows are divided by: their run's
        result.update(floor_facts(device, shaped.weight_bytes))
    if shaped.encoder_per_batch:  # (the Whisper shapes: what the replayed heads gave for real)
        result["replayed_profile"] = {"name": shaped.profile, "rank_probabilities": shaped.profiles[shaped.profile],
                                      "heads_measured_tokens_per_round": whisper_shaped.measured_rounds()}
    command = command_line("tools.benchmark_gpu", argv)
    print({k: v for k, v in result.items() if not isinstance(v, (list, dict))}, flush=True)

    def section(name, kept=()):
        kept = naming_their_run(kept, result.setdefault("commands", {}).get(name))
        result["commands"][name] = command
        result[name] = list(kept)

        def write(rows):
            print(rows[-1], flush=True)
            result[name] = list(kept) + [{**row, "command": row.get("command", command)} for row in rows]
            write_json_atomic(path, result)  # a run cut short keeps every finished row
        return write

    if shaped.encoder_per_batch:
        result["speech_encoder_graph_ms"] = encoder_graph_ms(backbone, shaped.make_prompt(model, 1, device)["input_features"])
    else:
        result["speech_encoder_graph_ms"] = speech_encoder_ms(model, backbone)
    if "verify" in args.sections:
        verify_cost_table(model, backbone, ints(args.sizes), set(ints(args.compile_sizes)), section("verify"))
    result["fused_projections"] = device.type == "cuda" and backbone.fuse_projections()  # as generate() does on a GPU
    lengths, compile_batches = ints(args.lengths), set(ints(args.compile_batches))
    batch_lengths = ints(args.batch_new_tokens)
    if "lengths" in args.sections or "batching" in args.sections:
        bench = DecodeBench(shaped, args.shape, max(lengths + batch_lengths), args.repeats, args.drafter_cost)
        if "lengths" in args.sections:
            groups = [g for g in args.length_methods.split(",") if g]
            bench.start_section(section("lengths", length_rows_kept(result.get("lengths", []), groups, set(lengths))))
            lengths_table(bench, shaped.profiles, args.length_drafts.split(","), lengths, 1 in compile_batches, groups)
        if "batching" in args.sections:
            drafts = args.batch_drafts.split(",")
            by_batch = {b: [d for d in drafts if not d.startswith("tree-") or b * int(d[5:]) <= args.max_verify_tokens]
                        for b in ints(args.batches)}
            kept = rows_not_measured_again(result.get("batching", []), set(by_batch), compile_batches)
            bench.start_section(section("batching", kept))
            batching_table(bench, shaped.profile, shaped.profiles[shaped.profile], by_batch, batch_lengths,
                           compile_batches)
        result["encoder_graph_ms_by_batch"] = {str(b): ms for b, ms in sorted(bench.encoder_ms.items())} or None
    write_json_atomic(path, result)
    table = report_gpu.render_markdown(result)
    write_atomic(path.with_suffix(".md"), table)
    print(table)
    report_gpu.write_summary(out)


if __name__ == "__main__":
    with torch.no_grad():
        main()
