"""4-bit weight products by rows verified, per kernel, at the MERaLiON-2-3B shape on a GPU: tinygemm
(``aten._weight_int4pack_mm``, what ``tools.weight_only.Int4WeightOnlyLinear`` and torchao's ``tile_packed_to_4d``
layout run), torchao 0.18's default int4 layout (``Int4WeightOnlyConfig(group_size=128)``: the ``plain`` layout, a
CUTLASS mixed-input GEMM from the ``mslk-cuda`` package, ``torch.ops.mslk.bf16i4bf16_rowwise``) and bf16 cuBLAS.

On tinygemm a product's cost grows with the rows it multiplies (it is a matrix-vector kernel at heart), which is
what makes 4-bit trees expensive to verify (docs/RESULTS.md). A tensor-core GEMM on the packed weights should not
grow so; this measures whether one PyTorch users can install does, and whether its rows are computed the same
whatever the other rows (``row_invariant``: row 0 of an n-row product equals the one-row product bit for bit,
which a lossless verify pass relies on less than a near-tie rule does, but which decides how often near-ties flip).

Each product is timed as 26 calls in a CUDA graph, each on its own weight (a pass's 26 layers; one weight would stay
in L2), medians of replays, every kernel in the same run. Writes one JSON with the command.

    python benchmarks/quantised/int4_kernels.py --rows 1,5,16,64 --out benchmarks/quantised/h200_int4_kernels.json
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, ".")
from tools.files import command_line, write_json_atomic  # noqa: E402
from tools.meralion2_shaped import SHAPES, weight_products  # noqa: E402

SHAPE = "meralion2-3b"


def tinygemm_layers(linears):
    from tools.weight_only import Int4WeightOnlyLinear

    return [Int4WeightOnlyLinear(linear) for linear in linears]


def torchao_layers(linears):
    """torchao's default int4 weight-only layout (``plain``, the mslk kernel), groups of 128."""
    import copy

    from torchao.quantization import Int4WeightOnlyConfig, quantize_

    layers = [nn.Sequential(copy.deepcopy(linear)) for linear in linears]
    for layer in layers:
        quantize_(layer, Int4WeightOnlyConfig(group_size=128))
    return [layer[0] for layer in layers]


KERNELS = {"bf16_cublas": lambda linears: linears, "int4_tinygemm": tinygemm_layers, "int4_torchao_mslk": torchao_layers}


def graph_us(layers, xs) -> float:
    """One CUDA graph of every layer on its input; us per layer, median of replays."""
    from medusa_fast import capture_cuda_graph
    from tools.benchmark_gpu import time_cuda

    graph = capture_cuda_graph(lambda: [layer(x) for layer, x in zip(layers, xs)], warmups=2)
    return time_cuda(graph.replay, repeats=9, warmup=1) * 1000 / len(layers)


def measure(name: str, rows_list, kernels) -> list[dict]:
    k, n, _ = weight_products(SHAPE)[name]
    layers_per_pass = SHAPES[SHAPE]["num_hidden_layers"]
    torch.manual_seed(0)
    linears = [nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16) for _ in range(layers_per_pass)]
    out = []
    for kernel in kernels:
        try:
            layers = KERNELS[kernel](linears)
        except Exception as exc:  # (a kernel this machine cannot build or load)
            out.append({"product": name, "kernel": kernel, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            print(f"{name:8s} {kernel:18s} unavailable: {out[-1]['error']}", flush=True)
            continue
        for rows in rows_list:
            xs = [torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for _ in range(layers_per_pass)]
            try:
                with torch.no_grad():
                    one = layers[0](xs[0][:1])
                    full = layers[0](xs[0])
                    error = (full.float() - xs[0].float() @ linears[0].weight.float().T).abs().max().item()
                    us = graph_us(layers, xs)
            except Exception as exc:
                out.append({"product": name, "kernel": kernel, "rows": rows, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                print(f"{name:8s} {kernel:18s} rows {rows:2d}: failed {out[-1]['error']}", flush=True)
                continue
            row = {"product": name, "in": k, "out": n, "kernel": kernel, "rows": rows, "us": round(us, 2),
                   "row_invariant": bool(torch.equal(one[0], full[0])), "max_abs_error_vs_bf16": round(error, 4)}
            out.append(row)
            print(f"{name:8s} {kernel:18s} rows {rows:2d}: {us:7.2f} us  invariant {row['row_invariant']}", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--products", default="qkv,o,gate_up,down")
    p.add_argument("--rows", default="1,5,16,64")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    started, rows = time.time(), []
    versions = {"torch": torch.__version__}
    for package in ("torchao", "mslk"):
        try:
            versions[package] = getattr(__import__(package), "__version__", "?")
        except Exception as exc:
            versions[package] = f"not loadable: {type(exc).__name__}: {str(exc)[:160]}"
    print(versions, flush=True)
    for name in args.products.split(","):
        rows += measure(name, [int(r) for r in args.rows.split(",")], args.kernels.split(","))
        write_json_atomic(args.out, {"command": command_line("benchmarks/quantised/int4_kernels.py", argv),
                                     "device": torch.cuda.get_device_name(), **versions,
                                     "seconds": round(time.time() - started), "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
