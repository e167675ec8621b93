"""Products of a few rows (a verify pass's 1-64 tokens) against a large weight, as a Triton kernel of our own,
timed against cuBLAS (``F.linear``) at the MERaLiON-2 shapes, on a GPU.

At 5 rows cuBLAS reads the 3B shape's q/k/v and o weights at ~2.1 TB/s of the H200's ~4.8 (it tiles 64 output
columns per block, so the o product's 2 304 columns keep 36 of 132 SMs busy), down at ~3.1 and gate/up at ~3.35
(`h200_meralion2-3b_verify_kernels.json`). This kernel gives every block ``BLOCK_N`` output columns and the whole
reduction (or one of ``SPLIT_K`` slices of it, summed after in a fixed order), always 16 rows a block: a row's
sum runs in the same order whatever the other rows, so a verify pass of n rows computes each row exactly as a
one-row pass does (products that are batch-invariant by construction).

Each configuration is timed as one product per decoder layer in a CUDA graph, each against its own weight (as a
pass's layers are; one weight would stay in L2 and flatter the kernel), medians of repeats, against cuBLAS in the same run.

    python benchmarks/round_cost/skinny_gemm.py --shapes meralion2-3b --rows 1,5,16 \
        --out benchmarks/round_cost/h200_skinny_gemm.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from tools.files import command_line, write_json_atomic  # noqa: E402
from tools.meralion2_shaped import SHAPES, weight_products  # noqa: E402

BLOCK_M = 16  # tl.dot's smallest tile: every row count up to 16 runs the same instructions
CONFIGS = [dict(block_n=n, block_k=k, split_k=s, stages=st)
           for n, k, s, st in itertools.product((16, 32, 64), (128, 256), (1, 2, 4), (3, 4))]


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def skinny_kernel(x_ptr, w_ptr, out_ptr, M, N, K, K_PER_SPLIT: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n, pid_k = tl.program_id(0), tl.program_id(1)
        rows = tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_start = pid_k * K_PER_SPLIT
        for offset in range(0, K_PER_SPLIT, BLOCK_K):
            ks = k_start + offset + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
            w = tl.load(w_ptr + cols[:, None] * K + ks[None, :], mask=(cols[:, None] < N) & (ks[None, :] < K), other=0.0)
            acc += tl.dot(x, tl.trans(w))
        out = out_ptr + pid_k * M * N + rows[:, None] * N + cols[None, :]
        tl.store(out, acc, mask=(rows[:, None] < M) & (cols[None, :] < N))

    return skinny_kernel


_KERNEL = None


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, block_n: int = 32, block_k: int = 256, split_k: int = 1,
                  warps: int = 4, stages: int = 3) -> torch.Tensor:
    """x [M, K] (M <= 16) @ weight[N, K].T -> [M, N] in x's dtype, float32 sums; split-K partials summed in order."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _kernel()
    m, k = x.shape
    n = weight.shape[0]
    if m > BLOCK_M:
        raise ValueError(f"skinny_linear takes at most {BLOCK_M} rows, not {m}")
    k_per_split = -(-k // (split_k * block_k)) * block_k
    partial = torch.empty(split_k, m, n, device=x.device, dtype=torch.float32)
    grid = (-(-n // block_n), split_k)
    _KERNEL[grid](x, weight, partial, m, n, k, K_PER_SPLIT=k_per_split, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k,
                  num_warps=warps, num_stages=stages)
    return (partial[0] if split_k == 1 else partial.sum(0)).to(x.dtype)


def graph_us_per_product(product, xs, weights) -> float:
    """One CUDA graph of ``product(x, w)`` over every weight in turn; us per product, median of replays."""
    from medusa_fast import capture_cuda_graph
    from tools.benchmark_gpu import time_cuda

    graph = capture_cuda_graph(lambda: [product(x, w) for x, w in zip(xs, weights)], warmups=2)
    return time_cuda(graph.replay, repeats=7, warmup=1) * 1000 / len(weights)


def measure_product(shape: str, name: str, rows: int, configs) -> dict:
    k, n, _ = weight_products(shape)[name]
    layers = SHAPES[shape]["num_hidden_layers"]
    torch.manual_seed(0)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
    xs = [torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    megabytes = n * k * 2 / 1e6
    cublas = graph_us_per_product(F.linear, xs, weights)
    reference = F.linear(xs[0].float(), weights[0].float())
    row = {"shape": shape, "product": name, "in": k, "out": n, "rows": rows, "weight_MB": round(megabytes, 2),
           "cublas_us": round(cublas, 2), "cublas_TBps": round(megabytes / cublas, 3), "configs": []}
    for config in configs:
        try:
            out = skinny_linear(xs[0], weights[0], **config)
            error = (out.float() - reference).abs().max().item()
            us = graph_us_per_product(lambda x, w, c=config: skinny_linear(x, w, **c), xs, weights)
        except Exception as exc:  # (a configuration Triton cannot build here)
            row["configs"].append({**config, "error": str(exc)[:120]})
            continue
        invariant = bool(torch.equal(skinny_linear(xs[0][:1], weights[0], **config), out[:1]))
        row["configs"].append({**config, "us": round(us, 2), "TBps": round(megabytes / us, 3),
                               "vs_cublas": round(cublas / us, 3), "max_abs_error": error, "row_invariant": invariant})
    best = min((c for c in row["configs"] if "us" in c), key=lambda c: c["us"], default=None)
    row["best"] = best
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="meralion2-3b")
    p.add_argument("--products", default="qkv,o,gate_up,down")
    p.add_argument("--rows", default="1,5,16")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    rows = []
    started = time.time()
    for shape in args.shapes.split(","):
        for name in args.products.split(","):
            for count in map(int, args.rows.split(",")):
                row = measure_product(shape, name, count, CONFIGS)
                rows.append(row)
                best = row["best"] or {}
                print(f"{shape} {name:8s} rows {count:2d}: cuBLAS {row['cublas_us']:7.2f} us ({row['cublas_TBps']:.2f} TB/s)"
                      f"  best {best.get('us', float('nan')):7.2f} us ({best.get('TBps', float('nan')):.2f} TB/s, "
                      f"x{best.get('vs_cublas', float('nan')):.2f}) {({k: best.get(k) for k in ('block_n', 'block_k', 'split_k', 'stages')})}"
                      f" invariant {best.get('row_invariant')}", flush=True)
                write_json_atomic(args.out, {"command": command_line("benchmarks/round_cost/skinny_gemm.py", argv),
                                             "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                             "seconds": round(time.time() - started), "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
