#!/usr/bin/env python
"""Cost of one decode round, and what inside it costs, for Whisper-shaped models (random weights).

    python -m tools.profile_rounds --device cuda --shapes tiny.en,base --dtypes bfloat16,float32 --out OUT

A round's cost does not depend on the weights' values, so random weights of the real shapes measure it.
For each shape, dtype, draft (plain greedy, chain of 4, trees of 16/32/64 nodes) and mode (``graph``: the
fixed-shape round captured as one CUDA graph; ``compiled``: torch.compile'd, then captured; ``eager`` on a
CPU) it reports the median time of one round replayed alone, the same round split into its stages (each
stage timed alone: drafting, the decoder pass, the output projection + argmax, acceptance + state update)
and, with ``--profile``, torch.profiler's kernel table of the compiled round (kernel count and time); with
``--timeline``, the captured round's own timeline (its kernels as the graph replays them: the time the GPU is
busy, the gaps between kernels, and the largest gaps with the kernels on either side). On a GPU the base's
projections are fused as ``generate`` fuses them (``--fused-projections off`` times them unfused, for an A/B;
``--compiled-forms new,old`` the compiled rounds' cache write and argmax as now and as before).
Writes OUT/round_cost.json and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

import medusa_heads
from draft_timing import cuda_ms
from draft_trees import DraftTree, build_tree_from_accuracy
from medusa_decoding import accept
from medusa_fast import CapturedRounds, capture_cuda_graph
from medusa_options import KernelOptions
from tools import cli_args
from tools.files import command_line, write_json_atomic

SHAPES = {  # d_model, decoder layers, heads, ffn, vocab (the converted real models)
    "tiny.en": (384, 4, 6, 1536, 51864),
    "base": (512, 6, 8, 2048, 51865),
}
PROFILE_TOPK = [[0.55, 0.65, 0.68, 0.71], [0.19, 0.27, 0.31, 0.34], [0.10, 0.16, 0.20, 0.23], [0.065, 0.11, 0.15, 0.18]]


def build_model(shape: str, dtype, device, head_kind: str, draft_vocab: int, encoder_layers: int = 1):
    """Random weights of a real Whisper shape with heads; one encoder layer unless asked (rounds never run it)."""
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

    from configuration_medusa import MedusaConfig
    from modeling_medusa import MedusaForASR

    d, layers, heads, ffn, vocab = SHAPES[shape]
    config = WhisperConfig(vocab_size=vocab, d_model=d, encoder_layers=encoder_layers, decoder_layers=layers,
                           encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                           decoder_ffn_dim=ffn, num_mel_bins=80, max_source_positions=1500, max_target_positions=448,
                           decoder_start_token_id=vocab - 7, eos_token_id=vocab - 8, pad_token_id=vocab - 8)
    torch.manual_seed(0)
    base = WhisperForConditionalGeneration(config).eval()
    base.generation_config = GenerationConfig(decoder_start_token_id=vocab - 7, eos_token_id=vocab - 8,
                                              pad_token_id=vocab - 8, max_length=448,
                                              suppress_tokens=list(range(vocab - 100, vocab - 10)))
    base.to(device=device, dtype=dtype)
    medusa_config = MedusaConfig(base_model_name_or_path=f"random-{shape}", base_family="whisper", hidden_size=d,
                                 vocab_size=vocab, medusa_num_heads=4, head_kind=head_kind,
                                 speech_attention=head_kind == "path")
    model = MedusaForASR(medusa_config, base=base).eval()
    with torch.no_grad():
        for p in model.medusa_heads.parameters():
            p.normal_(0, 0.02)
    if draft_vocab:
        model.set_draft_vocab(torch.arange(draft_vocab))
    return model


def compiled_forms(new: bool, kernels: KernelOptions | None = None) -> KernelOptions:
    """``kernels`` (default: the defaults) with the compiled rounds' cache write and argmax as they are (``new``) or
    as they were before (the per-layer scatter, one plain argmax)."""
    kernels = kernels or KernelOptions()
    return kernels if new else dataclasses.replace(kernels, cache_index_put=False, gpu_argmax_block=0)


def drafts_for(num_heads: int) -> dict:
    return {"none": DraftTree(()), "chain4": DraftTree.chain(num_heads),
            "tree16": DraftTree.from_paths(build_tree_from_accuracy(PROFILE_TOPK, 16)),
            "tree32": DraftTree.from_paths(build_tree_from_accuracy(PROFILE_TOPK, 32)),
            "tree64": DraftTree.from_paths(build_tree_from_accuracy(PROFILE_TOPK, 64))}


def timed(fn, device, repeats: int = 50, before=None) -> float:
    """Median milliseconds of ``fn`` (a CUDA graph replay or a plain call), after warm-up; ``before`` runs
    untimed ahead of every call (e.g. to put the state back)."""
    before = before or (lambda: None)
    for _ in range(3):
        before()
        fn()
    times = []
    for _ in range(repeats):
        before()
        times.append(cuda_ms(fn) if device.type == "cuda" else wall_ms(fn))
    return statistics.median(times)


def wall_ms(fn) -> float:
    """Milliseconds of one call of ``fn`` by the host's clock (CPU work)."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def as_graph(fn, device):
    if device.type != "cuda":
        return fn
    graph = capture_cuda_graph(fn)
    return graph.replay


def prefilled_state(model, device, dtype, batch: int, slack: int):
    features = torch.randn(batch, 80, 3000, device=device, dtype=dtype)
    process = model.backbone.make_logits_processor(None)
    state, _, _ = model.backbone.prefill({"input_features": features}, 200, slack, process,
                                         cache_pool=model.round_cache.pool)
    return state, process


def stage_costs(model, state, process, tree, device, graph: bool) -> dict:
    """Each stage of a round timed alone (same shapes as inside the captured round)."""
    backbone, tt = model.backbone, tree.tensors(device)
    drafter = model.make_drafter(tree, device)
    upto = state.cache.capacity
    chunk = drafter(state) if drafter else state.next_token[:, None]
    hidden = backbone.decode(state, chunk, tt.depths, tt.ancestors, upto)
    num_generated = torch.ones(chunk.shape[0], dtype=torch.long, device=device)
    stages = {
        "draft": (lambda: drafter(state)) if drafter else None,
        "decoder": lambda: backbone.decode(state, chunk, tt.depths, tt.ancestors, upto),
        "projection+argmax": lambda: process(backbone.logits(hidden), num_generated[:, None] + tt.depths).argmax(-1),
        "accept": lambda: accept(chunk, chunk, tt),
    }
    wrap = (lambda fn: as_graph(fn, device)) if graph else (lambda fn: fn)
    return {name: round(timed(wrap(fn), device), 4) for name, fn in stages.items() if fn is not None}


def round_costs(model, state, process, tree, device, modes, profile: bool, timeline: bool = False) -> dict:
    """Median ms of one whole round per mode (the state is put back before each, untimed); with
    ``profile``, the compiled round's kernel table too; with ``timeline``, each captured round's timeline."""
    out = {}
    for mode in modes:
        runner = CapturedRounds(model.backbone, model.make_drafter(tree, device), process, state, tree,
                                use_graph=False, compile=mode == "compiled")
        saved = [t.clone() for t in runner._mutable()]

        def restore():
            for target, value in zip(runner._mutable(), saved):
                target.copy_(value)

        step = lambda: runner._compiled(runner)  # noqa: E731
        if mode != "eager" and device.type == "cuda":
            graph = capture_cuda_graph(step, warmups=3, reset=restore)
            step = graph.replay
        out[f"round_ms_{mode}"] = round(timed(step, device, before=restore), 4)
        if timeline and mode != "eager" and device.type == "cuda":
            out[f"timeline_{mode}"] = graph_timeline(step, restore)
        if profile and mode == "compiled" and device.type == "cuda":
            out["kernels"] = kernel_table(lambda: runner._compiled(runner), restore)
    return out


def kernel_table(step, restore, rows: int = 25) -> dict:
    """torch.profiler over 10 rounds run without a graph (so each kernel shows): count and top kernels."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        restore()
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            restore()
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0]
    events.sort(key=lambda e: -e.device_time_total)
    return {"kernels_per_round": sum(e.count for e in events) / 10,
            "device_us_per_round": round(sum(e.device_time_total for e in events) / 10, 1),
            "top": [{"name": e.key[:90], "calls_per_round": e.count / 10, "us_per_round": round(e.device_time_total / 10, 2)}
                    for e in events[:rows]]}


MARKER = "spin"  # torch.cuda._sleep's kernel, launched before and after each replay to tell replays apart


def graph_timeline(replay, restore, rounds: int = 12, largest: int = 8) -> dict:
    """The captured round as the GPU runs it: per replay, the span from its first kernel's start to its last
    one's end, the time kernels (and copies) ran, and the gaps between them; medians over ``rounds`` replays,
    and the largest gaps of the median replay with the kernels on either side."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            restore()
            torch.cuda._sleep(20_000)
            replay()
            torch.cuda._sleep(20_000)
        torch.cuda.synchronize()
    replays = split_replays(device_events(prof))
    return summarise_replays(replays, largest)


def device_events(prof) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every kernel, copy and fill the profiler saw on the GPU, in start order."""
    events = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(events)


def split_replays(events) -> list[list[tuple[float, float, str]]]:
    """The events between the marker before each replay and the one after it (the state restore's copies
    fall between a replay's closing marker and the next one's opening marker, and are left out)."""
    segments, current = [], None
    for event in events:
        if MARKER in event[2]:
            if current is not None:
                segments.append(current)
            current = []
        elif current is not None:
            current.append(event)
    return segments[::2]


def summarise_replays(replays, largest: int) -> dict:
    def stats(events):
        busy = sum(end - start for start, end, _ in events)
        span = events[-1][1] - events[0][0]
        return {"kernels": len(events), "span_us": span, "busy_us": busy, "gaps_us": span - busy}

    rows = [stats(r) for r in replays if r]
    median_span = statistics.median(r["span_us"] for r in rows)
    typical = min((r for r in replays if r), key=lambda r: abs(stats(r)["span_us"] - median_span))
    gaps = sorted(((b[0] - a[1], a[2][:70], b[2][:70]) for a, b in zip(typical, typical[1:])), reverse=True)
    ends_before = [typical[0][0]] + [end for _, end, _ in typical[:-1]]
    in_order = [[round(start - before, 2), round(end - start, 2), name[:90]]
                for before, (start, end, name) in zip(ends_before, typical)]
    return {**{k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]},
            "largest_gaps": [{"us": round(g, 2), "after": a, "before": b} for g, a, b in gaps[:largest]],
            "in_order": in_order}  # [gap before us, duration us, name] of the median replay's events


def write_rows(args, device, argv, rows: list, modes) -> None:
    """Add each row's cost relative to plain greedy (same shape, dtype and mode); write the JSON."""
    import platform

    import transformers

    for row in rows:
        variant = ("shape", "dtype", "attention", "fused_drafting", "fused_projections", "compiled_forms")
        plain = next((r for r in rows if r["draft"] == "none" and all(r.get(k) == row.get(k) for k in variant)), None)
        for mode in modes:
            if plain and f"round_ms_{mode}" in row and f"round_ms_{mode}" in plain:
                row[f"vs_plain_{mode}"] = round(row[f"round_ms_{mode}"] / plain[f"round_ms_{mode}"], 3)
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d"),
            "command": command_line("tools.profile_rounds", argv)}
    write_json_atomic(Path(args.out) / "round_cost.json", {**meta, "rows": rows}, indent=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.profile_rounds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shapes", default="tiny.en,base")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--modes", default=None, help="graph,compiled (CUDA) or eager (CPU)")
    p.add_argument("--head-kinds", default="medusa,path")
    p.add_argument("--draft-vocab", type=cli_args.non_negative_int, default=4096)
    p.add_argument("--attention", default="auto", help="half-precision attention(s) to time: auto,sdpa,matmul")
    p.add_argument("--iterated-argmax-max-k", type=cli_args.non_negative_int, default=medusa_heads.ITERATED_ARGMAX_MAX_K,
                   help="drafts' top-k as iterated argmax up to this k (0: always torch.topk)")
    p.add_argument("--drafts", default="none,chain4,tree16,tree32")
    p.add_argument("--fused-drafting", default="on", help="path heads' fused drafting (GPU) to time: on,off")
    p.add_argument("--fused-projections", default="on",
                   help="the base's projections fused as generate() fuses them on a GPU, to time: on,off")
    p.add_argument("--compiled-forms", default="new",
                   help="compiled rounds' cache write and argmax to time: new (one index_put_ into the whole cache, "
                        "blocked argmax) and/or old (a scatter into each layer's view, one argmax reduction a row)")
    p.add_argument("--batch", type=cli_args.positive_int, default=1)
    p.add_argument("--profile", action="store_true", help="kernel tables of the compiled rounds (CUDA)")
    p.add_argument("--timeline", action="store_true",
                   help="the captured rounds' own timelines: busy time, gaps, the largest gaps (CUDA)")
    p.add_argument("--profile-shapes", default="tiny.en", help="shapes whose kernel tables are taken")
    p.add_argument("--compile-dtypes", default="bfloat16,float32", help="dtypes whose rounds are also compiled")
    p.add_argument("--out", default="work_data/round_cost")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    medusa_heads.ITERATED_ARGMAX_MAX_K = args.iterated_argmax_max_k
    modes = (args.modes or ("graph,compiled" if device.type == "cuda" else "eager")).split(",")
    rows = []
    with torch.no_grad():
        for shape in args.shapes.split(","):
            for dtype_name in args.dtypes.split(","):
                dtype = getattr(torch, dtype_name)
                variants = [(k, a, f, q, c) for k in args.head_kinds.split(",") for a in args.attention.split(",")
                            for f in args.fused_drafting.split(",") for q in args.fused_projections.split(",")
                            for c in args.compiled_forms.split(",")]
                for kind, attention, fused, fused_projections, forms in variants:
                    model = build_model(shape, dtype, device, kind, args.draft_vocab)
                    model.set_options(kernels=compiled_forms(forms == "new"))
                    model.backbone.half_attention = attention
                    model.set_options(fused_path_drafting=("cuda",) if fused == "on" else ())
                    if fused_projections == "on" and device.type == "cuda":
                        model.backbone.fuse_projections()  # as generate() does on a GPU
                    for name, tree in drafts_for(4).items():
                        if name not in args.drafts.split(","):
                            continue
                        state, process = prefilled_state(model, device, dtype, args.batch, 2 * tree.num_nodes)
                        row = {"shape": shape, "dtype": dtype_name, "heads": kind, "attention": attention, "draft": name,
                               "fused_drafting": fused, "fused_projections": fused_projections,
                               "compiled_forms": forms, "nodes": tree.num_nodes, "batch": args.batch,
                               "iterated_argmax_max_k": args.iterated_argmax_max_k,
                               "stages_ms": stage_costs(model, state, process, tree, device, device.type == "cuda")}
                        dtype_modes = [m for m in modes if m != "compiled" or dtype_name in args.compile_dtypes.split(",")]
                        row.update(round_costs(model, state, process, tree, device, dtype_modes,
                                               args.profile and shape in args.profile_shapes.split(","),
                                               args.timeline))
                        rows.append(row)
                        print(json.dumps({k: v for k, v in row.items() if k != "kernels"
                                          and not k.startswith("timeline")}), flush=True)
                        for key in (k for k in row if k.startswith("timeline")):
                            print(f"  {key}: {json.dumps({k: v for k, v in row[key].items() if k != 'in_order'})}",
                                  flush=True)
                        write_rows(args, device, argv, rows, modes)  # so far: a run cut short keeps its rows
                    model.release_caches()
    write_rows(args, device, argv, rows, modes)
    print(f"\n{'shape':8s} {'dtype':9s} {'heads':7s} {'attn':7s} {'fused':5s} {'proj':4s} {'draft':7s} "
          + " ".join(f"{m + ' ms':>12s} {'x plain':>8s}" for m in modes))
    for row in rows:
        print(f"{row['shape']:8s} {row['dtype']:9s} {row['heads']:7s} {row['attention']:7s} {row['fused_drafting']:5s} "
              f"{row['fused_projections']:4s} "
              f"{row['draft']:7s} "
              + " ".join(f"{row.get(f'round_ms_{m}', float('nan')):12.3f} {row.get(f'vs_plain_{m}', float('nan')):8.2f}"
                         for m in modes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
