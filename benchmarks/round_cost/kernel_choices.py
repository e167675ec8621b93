"""GPU micro-benchmarks behind the round's kernel choices: small top-k and few-query attention, q/k/v GEMMs.

    python benchmarks/round_cost/kernel_choices.py OUT.json   (on a CUDA GPU; writes the JSON it prints)
"""
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import medusa_heads  # noqa: E402
from medusa_heads import best_indices  # noqa: E402
from graph_timing import graph_us  # noqa: E402

medusa_heads.ITERATED_ARGMAX_MAX_K = 16  # iterated argmax for every k measured here (9 included)
dev = torch.device("cuda")
torch._dynamo.config.recompile_limit = 256  # one compile per shape (the first run hit the default 8)
out = {}


def chunked_topk(x, k: int, chunk: int = 128):
    """top-k via the k best chunk maxima, then a top-k over those chunks' elements."""
    n, v = x.shape
    c = x.view(n, v // chunk, chunk)
    best_chunks = c.amax(-1).topk(k, -1).indices  # [n, k]
    cand = c.gather(1, best_chunks[..., None].expand(-1, -1, chunk)).view(n, k * chunk)
    pos = cand.topk(k, -1).indices
    return (best_chunks.gather(1, pos // chunk) * chunk + pos % chunk)


topk_rows = []
for v in (8192,):
    for n in (1, 4, 9):
        for k in (2, 4, 9):
            x = torch.randn(n, v, device=dev, dtype=torch.bfloat16)
            ref = x.topk(k, -1).indices
            row = {"n": n, "k": k, "V": v}
            row["eager_topk"] = graph_us(lambda: x.topk(k, -1).indices)
            ct = torch.compile(lambda t: t.topk(k, -1).indices, dynamic=False)
            row["compiled_topk"] = graph_us(lambda: ct(x))
            ci = torch.compile(lambda t: best_indices(t, k), dynamic=False)
            assert torch.equal(ci(x).sort(-1).values, ref.sort(-1).values)
            row["compiled_iter_argmax"] = graph_us(lambda: ci(x))
            cc = torch.compile(lambda t: chunked_topk(t, k), dynamic=False)
            assert torch.equal(cc(x).sort(-1).values, ref.sort(-1).values)
            row["compiled_chunked"] = graph_us(lambda: cc(x))
            row["argmax_only"] = graph_us(lambda: x.argmax(-1))
            print(row, flush=True)
            topk_rows.append(row)
out["topk"] = topk_rows


def matmul_attn(q, k, v, mask):
    s = q @ k.transpose(-1, -2)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1, dtype=torch.float32).to(v.dtype) @ v


attn_rows = []
cm = torch.compile(matmul_attn, dynamic=False)
backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
for heads in (6, 8):
    for kind, L in (("cross", 1500), ("self", 512), ("self", 128), ("self", 64)):
        for n in (1, 5, 17, 33):
            q = torch.randn(1, heads, n, 64, device=dev, dtype=torch.bfloat16)
            k = torch.randn(1, heads, L, 64, device=dev, dtype=torch.bfloat16)
            vv = torch.randn(1, heads, L, 64, device=dev, dtype=torch.bfloat16)
            mask = None if kind == "cross" else (torch.rand(1, 1, n, L, device=dev) > 0.3)
            row = {"heads": heads, "kind": kind, "L": L, "n": n}
            for name, b in backends.items():
                try:
                    with sdpa_kernel([b]):
                        fn = lambda: F.scaled_dot_product_attention(q, k, vv, attn_mask=mask)
                        fn()
                        row[name] = graph_us(fn)
                except RuntimeError:  # a backend that cannot take this shape (flash: no mask)
                    row[name] = None
            row["default"] = graph_us(lambda: F.scaled_dot_product_attention(q, k, vv, attn_mask=mask))
            row["compiled_matmul"] = graph_us(lambda: cm(q * 0.125, k, vv, mask))
            print(row, flush=True)
            attn_rows.append(row)
out["attention"] = attn_rows

gemm_rows = []
for d in (384, 512):
    for n in (1, 5, 17):
        x = torch.randn(1, n, d, device=dev, dtype=torch.bfloat16)
        ws = [torch.randn(d, d, device=dev, dtype=torch.bfloat16) for _ in range(3)]
        bs = [torch.randn(d, device=dev, dtype=torch.bfloat16) for _ in range(3)]
        wc, bc = torch.cat(ws), torch.cat(bs)
        row = {"d": d, "n": n,
               "three_linears": graph_us(lambda: [F.linear(x, w, b) for w, b in zip(ws, bs)]),
               "one_fused_linear": graph_us(lambda: F.linear(x, wc, bc)),
               "one_linear": graph_us(lambda: F.linear(x, ws[0], bs[0]))}
        print(row, flush=True)
        gemm_rows.append(row)
out["gemm"] = gemm_rows
out["torch"] = torch.__version__
json.dump(out, open(sys.argv[1], "w"), indent=1)
