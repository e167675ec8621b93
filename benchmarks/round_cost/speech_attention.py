"""GPU micro-benchmark: a few queries attending to the speech (1 500 unmasked frames), the ways SDPA can run it.

FlashAttention's split-KV kernel and its combine cost ~11 us for 2-33 queries where cuDNN's kernel for one query
takes ~6.6 (`h200_kernel_choices.json`). Folding the queries into the batch (batch 1: keys and values expanded
with stride 0, no copy) or into the heads (grouped-query attention) may let the one-query kernel serve them all.

    python benchmarks/round_cost/speech_attention.py OUT.json   (on a CUDA GPU; writes the JSON it prints)
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from graph_timing import graph_us

dev = torch.device("cuda")
torch._dynamo.config.recompile_limit = 256
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def flash(q, k, v):
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[0]


def batch_fold(q, k, v):
    """[1, H, n, D] queries as n batches of one query over the same keys/values (stride-0 batch)."""
    n = q.shape[2]
    out = F.scaled_dot_product_attention(q.transpose(0, 2), k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1))
    return out.transpose(0, 2)


def head_fold(q, k, v):
    """[B, H, n, D] queries as H*n heads of one query, n of them per key/value head (grouped-query attention)."""
    b, h, n, d = q.shape
    out = F.scaled_dot_product_attention(q.reshape(b, h * n, 1, d), k, v, enable_gqa=True)
    return out.view(b, h, n, d)


WAYS = {"flash": flash, "batch_fold": batch_fold, "head_fold": head_fold,
        "sdpa_default": lambda q, k, v: F.scaled_dot_product_attention(q, k, v)}
COMPILED = (flash, batch_fold, head_fold)  # also timed compiled, as inside the rounds


def measure(fn, q, k, v, reference, backend=None):
    """(us per call eager, us per call compiled, max abs error) or None where the way cannot run."""
    try:
        def call(f=fn):
            if backend is None:
                return f(q, k, v)
            with sdpa_kernel([backend]):
                return f(q, k, v)
        error = (call().float() - reference).abs().max().item()
        eager = graph_us(call)
        compiled_fn = torch.compile(fn, dynamic=False) if fn in COMPILED else None
        compiled = graph_us(lambda: compiled_fn(q, k, v)) if backend is None and fn in COMPILED else None
        return {"eager_us": eager, "compiled_us": compiled, "max_abs_error": round(error, 5)}
    except (RuntimeError, torch._dynamo.exc.BackendCompilerFailed) as e:
        return {"error": str(e).splitlines()[0][:160]}


def main(path):
    rows = []
    for heads in (6,):  # tiny.en (base has 8; the kernels' choice was the same for both in h200_kernel_choices)
        for batch in (1, 4):
            for n in (1, 2, 5, 17, 33):
                q = torch.randn(batch, n, heads, 64, device=dev, dtype=torch.bfloat16).transpose(1, 2)
                k, v = (torch.randn(batch, heads, 1500, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
                reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
                row = {"heads": heads, "batch": batch, "n": n}
                for name, fn in WAYS.items():
                    if name == "batch_fold" and batch > 1:
                        continue
                    row[name] = measure(fn, q, k, v, reference)
                    if name in ("batch_fold", "head_fold"):
                        for backend_name, backend in BACKENDS.items():
                            row[f"{name}_{backend_name}"] = measure(fn, q, k, v, reference, backend)
                print(json.dumps(row), flush=True)
                rows.append(row)
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "command": " ".join(sys.argv),
           "rows": rows}
    json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
