"""Attention of a few queries over the speech (Whisper's 1 500 frames) at the batch sizes bulk transcription runs,
in each form the rounds could use: the form ``attend_memory`` picks now, SDPA's FlashAttention, queries folded into
heads (cuDNN's one-query kernel), and batched matrix products with float32 scores. Each form is captured as a CUDA
graph and timed alone (median of replays); its error is against a float64 reference. Writes one JSON with the command.

    python -m tools.memory_attention --batches 1,16,64 --heads 6,8 --queries 1,5,17 \
        --out benchmarks/round_cost/h100_memory_attention_batches.json
"""

import argparse
import platform

import torch

from cpu_kernels import attend_flash, attend_folded, attend_memory
from medusa_fast import capture_cuda_graph
from tools import cli_args
from tools.files import command_line, write_json_atomic
from tools.profile_rounds import timed


def products(query, keys, values):
    """Two batched products, the scores kept in float32 (as SDPA's kernels keep them), the probabilities rounded to
    the values' dtype for the second (as FlashAttention rounds them)."""
    batch, heads, n, width = query.shape
    length = keys.shape[-2]
    scores = torch.bmm(query.reshape(-1, n, width), keys.reshape(-1, length, width).transpose(1, 2),
                       out_dtype=torch.float32)
    probs = torch.softmax(scores * width ** -0.5, dim=-1).to(values.dtype)
    return torch.bmm(probs, values.reshape(-1, length, width)).view(batch, heads, n, width)


FORMS = {"attend_memory": attend_memory, "flash": attend_flash, "folded": attend_folded, "products": products}


def reference(query, keys, values):
    q, k, v = (t.double() for t in (query, keys, values))
    probs = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
    return probs @ v


def measure(form, batch, heads, n, length, width, dtype, device) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    query = torch.randn(batch, heads, n, width, device=device, dtype=dtype, generator=gen)
    keys, values = (torch.randn(batch, heads, length, width, device=device, dtype=dtype, generator=gen)
                    for _ in range(2))
    fn = FORMS[form]
    try:
        out = fn(query, keys, values)
        graph = capture_cuda_graph(lambda: fn(query, keys, values))
    except RuntimeError as error:
        return {"error": str(error).splitlines()[0][:200]}
    error = (out.double() - reference(query, keys, values)).abs().max().item()
    return {"us": round(1000 * timed(graph.replay, device, repeats=100), 2), "max_abs_error": error}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tools.memory_attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=cli_args.positive_ints, default="1,16,64")
    p.add_argument("--heads", type=cli_args.positive_ints, default="6,8", help="attention heads (tiny.en 6, base 8)")
    p.add_argument("--queries", type=cli_args.positive_ints, default="1,5,17",
                   help="queries a row (1: greedy; chain of 4: 5; tree of 16: 17)")
    p.add_argument("--length", type=cli_args.Number(int, 1, 100_000), default=1500)
    p.add_argument("--width", type=cli_args.Number(int, 8, 256), default=64)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    unknown = set(args.forms.split(",")) - set(FORMS)
    if unknown:
        p.error(f"--forms: unknown {', '.join(sorted(unknown))} (choose from {', '.join(FORMS)})")
    if not torch.cuda.is_available():
        raise SystemExit("tools.memory_attention times CUDA kernels: run it on a machine with a GPU")
    device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    rows = []
    with torch.no_grad():
        for batch in args.batches:
            for heads in args.heads:
                for n in args.queries:
                    row = {"batch": batch, "heads": heads, "queries": n, "length": args.length, "width": args.width}
                    for form in args.forms.split(","):
                        row[form] = measure(form, batch, heads, n, args.length, args.width, dtype, device)
                    rows.append(row)
                    print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    write_json_atomic(args.out, {"command": command_line("tools.memory_attention", argv), "device": torch.cuda.get_device_name(),
                                 "torch": torch.__version__, "python": platform.python_version(),
                                 "dtype": args.dtype, "rows": rows})


if __name__ == "__main__":
    main()
