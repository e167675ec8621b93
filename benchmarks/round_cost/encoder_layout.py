"""The speech encoder as the library runs it against ``backbone.encoder_output`` (the same encoder, its residual
stream laid out contiguously): milliseconds a call (interleaved, medians; CUDA graphs on a GPU), whether the two
give the same values bit for bit, and on a GPU the kernels of ours by kind.

    python benchmarks/round_cost/encoder_layout.py --model heads/whisper-tiny.en --device cpu --batches 1 \
        --out benchmarks/round_cost/cpu_tiny.en_encoder_layout.json
    python benchmarks/round_cost/encoder_layout.py --shape meralion2-3b --device cuda --batches 1,16 --out OUT.json

``--model``: an artifact whose (real) Whisper base is loaded offline; ``--shape``: MERaLiON-2's Whisper-large-v3
encoder with random weights (speed only; a layout's cost does not depend on the weights' values).
"""

import argparse
import sys
import time

import torch

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks/round_cost")
from backbone import encoder_output  # noqa: E402
from draft_timing import cuda_ms  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402
from tools.profile_rounds import as_graph, wall_ms  # noqa: E402
from verify_pass_kernels import interleaved_ms, kernel_table  # noqa: E402


def speech_encoder(args):
    """(encoder, mel bins, dtype) of the base asked for."""
    dtype = getattr(torch, args.dtype)
    if args.shape:
        from tools.meralion2_shaped import build_model

        model = build_model(torch.device(args.device), dtype, args.shape, text_layers=1)
        return model.speech_encoder, 128, dtype
    from tools.runtime import base_to_load, load_medusa

    model = load_medusa(args.model, dtype, base_to_load(args.model)).to(args.device)
    encoder = model.backbone.base.model.encoder
    return encoder, encoder.config.num_mel_bins, dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="artifact folder whose Whisper base is timed")
    source.add_argument("--shape", help="meralion2-3b: its speech encoder, random weights")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batches", default="1")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    encoder, mel_bins, dtype = speech_encoder(args)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        features = torch.randn(batch, mel_bins, 3000, device=device, dtype=dtype)
        library = lambda: encoder(features).last_hidden_state  # noqa: E731
        ours = lambda: encoder_output(encoder, features)  # noqa: E731
        row = {"batch": batch, "same_values": torch.equal(library(), ours())}
        calls = {"library": as_graph(library, device), "contiguous": as_graph(ours, device)}
        ms = interleaved_ms(calls, args.repeats, timer=cuda_ms if device.type == "cuda" else wall_ms)
        row.update({"library_ms": round(ms["library"], 3), "contiguous_ms": round(ms["contiguous"], 3),
                    "speedup": round(ms["library"] / ms["contiguous"], 3)})
        if device.type == "cuda":
            row["contiguous_kernels"] = kernel_table(as_graph(ours, device), replays=5, top=8)
            row["library_kernels"] = kernel_table(as_graph(library, device), replays=5, top=8)
        print(row, flush=True)
        rows.append(row)
    write_json_atomic(args.out, {
        "source": args.model or args.shape, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": args.dtype, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"), "command": command_line("benchmarks/round_cost/encoder_layout.py"),
        "rows": rows})


if __name__ == "__main__":
    with torch.no_grad():
        main()
