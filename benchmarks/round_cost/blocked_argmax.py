"""The verify pass's argmax over a whole vocabulary and the drafts' top-k, compiled as one reduction per row (what
torch.compile makes of ``argmax``: one program per row, latency-bound on a GPU) against a blocked form (the maximum of
each block of the row, the first block holding the best, the argmax inside it: several short reductions spread over
the GPU). Each timed inside a CUDA graph of back-to-back calls, the logits produced by a product first as in a round.

    python benchmarks/round_cost/blocked_argmax.py --out benchmarks/round_cost/h200_blocked_argmax.json
"""
import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_kernels import blocked_argmax  # noqa: E402
from graph_timing import graph_us  # noqa: E402
from medusa_heads import best_indices, blocked_best_indices  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402

# the verify pass (what, rows, vocabulary, hidden width) over tiny.en's and Gemma2's vocabularies; a draft depth's
# (rows, k) over an 8 192-token draft vocabulary
VERIFY = [("tiny.en", r, 51864, 384) for r in (1, 17)] + [("meralion2-3b", r, 256000, 2304) for r in (5, 64)]
DRAFT = [(r, k) for r in (1, 4) for k in (1, 4)]


def timed(fn, *inputs) -> float:
    compiled = torch.compile(fn, dynamic=False)
    compiled(*inputs)
    return graph_us(lambda: compiled(*inputs))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", default="1024,2048")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch._dynamo.config.recompile_limit = 256
    dev, dtype = torch.device("cuda"), torch.bfloat16
    widths = [int(w) for w in args.widths.split(",")]
    rows = []
    for what, n, vocab, width in VERIFY:
        hidden = torch.randn(1, n, width, device=dev, dtype=dtype)
        weight = torch.randn(vocab, width, device=dev, dtype=dtype) / width ** 0.5
        row = {"what": f"verify {what}", "rows": n, "vocab": vocab,
               "product_only": timed(lambda h: F.linear(h, weight), hidden),
               "argmax": timed(lambda h: F.linear(h, weight).argmax(-1), hidden)}
        reference = F.linear(hidden, weight).argmax(-1)
        for w in widths:
            fn = lambda h, w=w: blocked_argmax(F.linear(h, weight), w)  # noqa: E731
            assert torch.equal(torch.compile(fn, dynamic=False)(hidden), reference)
            row[f"blocked_{w}"] = timed(fn, hidden)
        print(row, flush=True)
        rows.append(row)
    for n, k in DRAFT:
        states = torch.randn(1, n, 384, device=dev, dtype=dtype)
        weight = torch.randn(8192, 384, device=dev, dtype=dtype) / 384 ** 0.5
        row = {"what": "draft top-k", "rows": n, "k": k, "vocab": 8192,
               "iterated_argmax": timed(lambda s: best_indices(F.linear(s, weight), k), states)}
        for w in (256, 512):
            row[f"blocked_{w}"] = timed(lambda s, w=w: blocked_best_indices(F.linear(s, weight), k, w), states)
        print(row, flush=True)
        rows.append(row)
    write_json_atomic(args.out, {"command": command_line("benchmarks/round_cost/blocked_argmax.py"),
                                 "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows})


if __name__ == "__main__":
    main()
