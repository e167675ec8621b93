"""Where a MERaLiON-2 verify pass spends its time on the GPU: the fused, compiled and captured pass of
``tools.benchmark_gpu`` (random weights of the full shape), its kernels grouped by kind (weight products, attention,
Triton-fused elementwise, other) with torch.profiler, for inductor's default choice of product kernels and for its
autotuned choice (``max_autotune_gemm``: Triton templates timed against cuBLAS), and for variants of the pass
(``--variants``: ``+``-joined settings among ``rows`` / ``broadcast`` (the compiled grouped attention's form),
``table`` / ``computed`` (rotary cos/sin gathered from a table or computed in the pass), ``tuned`` (inductor's
coordinate-descent tuning of its own kernels), ``multikernel`` / ``cooperative`` (inductor's reductions over a row
wider than 1 024, e.g. the 3B shape's norms over 2 304: a persistent form timed against the looped one, or split
across thread blocks; by default they loop, one block a row), ``cublaslt`` (the weight products through cuBLASLt's
heuristics instead of cuBLAS's: ``torch.backends.cuda.preferred_blas_library``), ``pdl`` (inductor's Triton
kernels launched as programmatic dependent launches, Hopper: each may start while the kernel before it ends) and
``old`` (the cache write and argmax before 2026-12-04); ``now`` alone is the pass as ``generate`` runs it). A pass's ``pass_ms`` is timed in turn with the other variants of its
size (fair between them), ``pass_ms_alone`` right after its capture. Writes one JSON with the command.

    python -m tools.verify_pass_kernels --shape meralion2-3b --tokens 1,5 \
        --out benchmarks/round_cost/h200_meralion2-3b_verify_kernels.json
"""

import argparse
import collections
import statistics

import torch

from backbone_meralion2 import MERaLiON2Backbone  # noqa: E402
from backbone import compile_fixed_shape  # noqa: E402
from medusa_fast import capture_cuda_graph  # noqa: E402
from draft_timing import cuda_ms  # noqa: E402
from tools.benchmark_gpu import measure_copy_bandwidth, time_cuda, verify_pass  # noqa: E402
from tools import cli_args  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402
from tools.meralion2_shaped import build_model, decoder_bytes, make_prompt  # noqa: E402
from medusa_options import KernelOptions  # noqa: E402
from tools.profile_rounds import compiled_forms  # noqa: E402

KINDS = (("product", ("gemm", "gemv", "nvjet", "cutlass", "sm90_xmma", "splitk", "triton_tem")),
         ("attention", ("flash", "fmha", "attention", "sdpa")),
         ("triton", ("triton_",)))


def kind(name: str) -> str:
    lowered = name.lower()
    return next((k for k, marks in KINDS if any(m in lowered for m in marks)), "other")


def kernel_table(replay, replays: int = 20, top: int = 12) -> dict:
    """us per pass by kernel kind, the kernel count per pass and the ``top`` costliest kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    per_kind, per_kernel, count = collections.Counter(), collections.Counter(), 0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA or "memcpy" in event.name.lower():
            continue
        us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        per_kind[kind(event.name)] += us / replays
        per_kernel[event.name[:90]] += us / replays
        count += 1
    return {"us_by_kind": dict(per_kind), "kernels_per_pass": count / replays,
            "top_kernels_us": dict(per_kernel.most_common(top))}


def use_variant(variant: str) -> KernelOptions:
    """Inductor settings for one ``--variants`` entry, and the kernel forms it names (defaults for every setting it
    does not name)."""
    import torch._inductor.config as inductor

    settings = set(variant.split("+")) - {"now"}
    known = ("rows", "broadcast", "table", "computed", "tuned", "multikernel", "cooperative", "cublaslt", "pdl", "old")
    unknown = settings - set(known)
    if unknown:
        raise SystemExit(f"unknown variant setting(s) {sorted(unknown)}: use {', '.join(known)}")
    defaults = KernelOptions()
    kernels = KernelOptions(grouped_attention=next((f for f in ("rows", "broadcast") if f in settings),
                                                   defaults.grouped_attention),
                            rope_table_devices=(() if "computed" in settings else ("cuda",) if "table" in settings
                                                else defaults.rope_table_devices))
    inductor.coordinate_descent_tuning = "tuned" in settings
    inductor.triton.multi_kernel = 1 if "multikernel" in settings else 0
    inductor.triton.cooperative_reductions = "cooperative" in settings
    if "pdl" in settings and not hasattr(inductor.triton, "enable_pdl"):
        raise SystemExit(f"variant setting 'pdl' needs inductor's triton.enable_pdl, which torch {torch.__version__} lacks")
    if hasattr(inductor.triton, "enable_pdl"):
        inductor.triton.enable_pdl = "pdl" in settings
    torch.backends.cuda.preferred_blas_library("cublaslt" if "cublaslt" in settings else DEFAULTS["blas"])
    return compiled_forms("old" not in settings, kernels)


DEFAULTS = {"blas": torch.backends.cuda.preferred_blas_library()}


def capture(backbone, inputs, n: int, autotune: bool):
    """The pass of ``n`` tokens compiled (products autotuned or not) and captured as a CUDA graph. No reset of
    dynamo between passes (``compile_fixed_shape`` raises its recompile limit instead): the graphs captured before are
    replayed later, and a reset could free the compiled kernels they launch."""
    import torch._inductor.config as inductor

    inductor.max_autotune_gemm = autotune
    return capture_cuda_graph(compile_fixed_shape(verify_pass(backbone, inputs, n)), warmups=3)


def interleaved_ms(replays: dict, repeats: int = 30, timer=cuda_ms) -> dict:
    """Median ms of each replay, timed in turn (one of each per turn, after a warm-up turn). Timed one after
    another instead, a process's later graphs measured slower than its first (the gaps between kernels grew by
    200-300 us a pass), whatever the variant."""
    for replay in replays.values():
        replay()
    times = {name: [] for name in replays}
    for _ in range(repeats):
        for name, replay in replays.items():
            times[name].append(timer(replay))
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.verify_pass_kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="meralion2-3b")
    parser.add_argument("--tokens", type=cli_args.positive_ints_text, default="1,5")
    parser.add_argument("--batch", type=cli_args.positive_int, default=1, help="rows a pass verifies, each with --tokens tokens")
    parser.add_argument("--autotune", default="off,on")
    parser.add_argument("--variants", default="now", help="comma-separated variants of the pass (see the module's doc)")
    parser.add_argument("--top", type=cli_args.positive_int, default=12, help="how many of the costliest kernels to list")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    model = build_model(torch.device("cuda"), torch.bfloat16, args.shape, None)
    floor_ms = decoder_bytes(model) / measure_copy_bandwidth(torch.device("cuda")) * 1000
    inputs = make_prompt(model, args.batch, model.device)
    fused = MERaLiON2Backbone(model)
    fused.fuse_projections()
    rows = []

    def write():
        write_json_atomic(args.out, {"command": command_line("tools.verify_pass_kernels"),
                                     "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                     "shape": args.shape, "batch": args.batch, "floor_ms": floor_ms, "rows": rows})

    for n in (int(t) for t in args.tokens.split(",")):
        for autotune in args.autotune.split(","):
            graphs = {}
            for variant in args.variants.split(","):
                kernels = use_variant(variant)
                backbone = MERaLiON2Backbone(model)  # (a fresh one: the rotary table is made at prefill)
                backbone.kernels = kernels
                backbone.fused = fused.fused  # (fusing again would copy the weights once more for every variant)
                graphs[variant] = capture(backbone, inputs, n, autotune == "on")
                rows.append({"variant": variant, "tokens": n, "autotuned_products": autotune == "on",
                             "pass_ms_alone": time_cuda(graphs[variant].replay),
                             **kernel_table(graphs[variant].replay, top=args.top)})
                print(rows[-1], flush=True)
                write()  # (a run cut short keeps every pass measured)
            for variant, ms in interleaved_ms({v: g.replay for v, g in graphs.items()}).items():
                row = next(r for r in rows[-len(graphs):] if r["variant"] == variant)
                row.update(pass_ms=ms, x_floor=ms / floor_ms)
                print(variant, n, f"{ms:.3f} ms = {ms / floor_ms:.2f}x the floor", flush=True)
            write()
            del graphs

if __name__ == "__main__":
    main()
