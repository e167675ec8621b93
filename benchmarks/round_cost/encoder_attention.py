"""The Whisper-large-v3 speech encoder (MERaLiON-2's) with eager and with SDPA self-attention, timed as CUDA graphs
at batch 1 and 16, random weights (speed only). MERaLiON-2's code hands the attention asked for at load time to both
sub-models and the decoder must be eager, so the encoder ran eager until ``speech_attention_as_sdpa``.
``--backends`` also times SDPA with one kernel family allowed (flash, cudnn, efficient), ``--compiled`` torch's own
choice compiled as ``generate(compile=True)`` runs it, ``--profile`` the kernels by kind of each at the largest batch.

    python benchmarks/round_cost/encoder_attention.py --out benchmarks/round_cost/h200_encoder_attention.json
    python benchmarks/round_cost/encoder_attention.py --attention sdpa --backends default,flash,cudnn,efficient \
        --compiled --profile --out benchmarks/round_cost/h200_encoder_sdpa_backends.json
"""

import argparse
import contextlib
import sys
import time

import torch

sys.path.insert(0, ".")
from backbone import compile_fixed_shape, encoder_output  # noqa: E402
from benchmarks.round_cost.verify_pass_kernels import kernel_table  # noqa: E402
from draft_timing import cuda_ms  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402
from tools.meralion2_shaped import speech_encoder_config  # noqa: E402
from tools.profile_rounds import as_graph  # noqa: E402


def large_v3_encoder(attention: str, device):
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    return WhisperEncoder(speech_encoder_config(attention)).to(device, torch.bfloat16).eval()


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def sdpa_backend(name: str):
    """A context allowing only one SDPA kernel family (``default``: torch's own choice among all)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return contextlib.nullcontext() if name == "default" else sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name]))


def timed_rows(encoder, attention: str, batches, repeats: int, device, backend: str = "default",
               compiled: bool = False, profile: bool = False) -> list[dict]:
    rows = []
    torch._dynamo.reset()  # (each compiled row traces the encoder afresh)
    encode = compile_fixed_shape(encoder_output) if compiled else encoder_output
    for batch in batches:
        features = torch.randn(batch, 128, 3000, device=device, dtype=torch.bfloat16)
        with sdpa_backend(backend):
            started = time.perf_counter()
            encode(encoder, features)  # (traced and compiled here when compiled)
            first_s = time.perf_counter() - started
            replay = as_graph(lambda: encode(encoder, features), device)
        times = sorted(cuda_ms(replay) for _ in range(repeats))
        row = {"attention": attention, "backend": backend, "compiled": compiled, "batch": batch,
               "ms": round(times[len(times) // 2], 3), "first_call_s": round(first_s, 1)}
        if profile and batch == max(batches):
            row["kernels"] = kernel_table(replay, replays=5, top=12)
        rows.append(row)
        print({k: v for k, v in row.items() if k != "kernels"}, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--attention", default="eager,sdpa")
    parser.add_argument("--backends", default="default", help=f"SDPA kernels: default,{','.join(SDPA_BACKENDS)}")
    parser.add_argument("--compiled", action="store_true", help="also torch's own choice compiled (as compile=True runs)")
    parser.add_argument("--profile", action="store_true", help="kernels by kind at the largest batch")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device, batches = torch.device("cuda"), [int(b) for b in args.batches.split(",")]
    rows = []
    for attention in args.attention.split(","):
        encoder = large_v3_encoder(attention, device)
        for backend in (args.backends.split(",") if attention == "sdpa" else ["default"]):
            # compiled code ran cuDNN's kernel whatever the backend allowed (the first run's kernel tables):
            # only torch's own choice is compiled
            for compiled in (False, True) if args.compiled and backend == "default" else (False,):
                rows += timed_rows(encoder, attention, batches, args.repeats, device, backend, compiled, args.profile)
    write_json_atomic(args.out, {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                 "date": time.strftime("%Y-%m-%d"),
                                 "command": command_line("benchmarks/round_cost/encoder_attention.py"), "rows": rows})


if __name__ == "__main__":
    with torch.no_grad():
        main()
