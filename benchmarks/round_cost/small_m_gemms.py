"""How close the weight products of a MERaLiON-2 verify pass come to the memory bandwidth, by kernel: cuBLAS
(``F.linear``), torch.compile's default choice and its autotuned choice (``max-autotune-no-cudagraphs``: Triton
templates against cuBLAS), for the few rows a verify pass multiplies (1 to 64 tokens).

Each product cycles through copies of its weight that together exceed the GPU's L2 cache, so every call reads its
weight from memory, as a decoder layer does. Writes one JSON with the command.

    python benchmarks/round_cost/small_m_gemms.py --out benchmarks/round_cost/h200_small_m_gemms.json
"""

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from tools.files import command_line, write_json_atomic  # noqa: E402
from tools.meralion2_shaped import weight_products  # noqa: E402

L2_BYTES = 60e6  # H200: 60 MB (more copies than needed on smaller caches)


def timed_ms(fn, weights, x, repeats: int) -> float:
    """Median ms of one product, each call on the next copy of the weight (read from memory, not L2)."""
    for w in weights:
        fn(x, w)
    torch.cuda.synchronize()
    times = []
    for r in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for w in weights:
            fn(x, w)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / len(weights))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="meralion2-3b,meralion2-10b")
    parser.add_argument("--rows", default="1,5,16,32,64")
    parser.add_argument("--kernels", default="cublas,compiled,autotuned")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    for limit in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, limit):  # one compiled product per shape, not an eager fallback after 8
            setattr(torch._dynamo.config, limit, 1024)
    kernels = {"cublas": F.linear,
               "compiled": torch.compile(F.linear, dynamic=False),
               "autotuned": torch.compile(F.linear, dynamic=False, mode="max-autotune-no-cudagraphs")}
    kernels = {name: kernels[name] for name in args.kernels.split(",")}
    rows = [int(m) for m in args.rows.split(",")]
    results = []
    for shape in args.shapes.split(","):
        for name, (n_in, n_out, per_layer) in weight_products(shape).items():
            nbytes = n_in * n_out * 2
            weights = [torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16) / n_in ** 0.5
                       for _ in range(max(2, int(3 * L2_BYTES / nbytes) + 1))]
            for m in rows:
                x = torch.randn(m, n_in, device="cuda", dtype=torch.bfloat16)
                row = {"shape": shape, "product": name, "in": n_in, "out": n_out, "per_layer": per_layer, "rows": m}
                for kernel, fn in kernels.items():
                    ms = timed_ms(fn, weights, x, args.repeats)
                    row[f"{kernel}_ms"], row[f"{kernel}_GBps"] = ms, nbytes / ms / 1e6
                results.append(row)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
            del weights
            torch.cuda.empty_cache()
    write_json_atomic(args.out, {"command": command_line("benchmarks/round_cost/small_m_gemms.py"), "device": torch.cuda.get_device_name(),
                                 "torch": torch.__version__, "rows": results})


if __name__ == "__main__":
    main()
