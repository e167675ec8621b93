"""The Whisper-large-v3 speech encoder (MERaLiON-2's) with eager and with SDPA self-attention, timed as CUDA graphs
at batch 1 and 16, random weights (speed only). MERaLiON-2's code hands the attention asked for at load time to both
sub-models and the decoder must be eager, so the encoder ran eager until ``speech_attention_as_sdpa``.

    python benchmarks/round_cost/encoder_attention.py --out benchmarks/round_cost/h200_encoder_attention.json
"""

import argparse
import sys
import time

import torch

sys.path.insert(0, ".")
from backbone import encoder_output  # noqa: E402
from draft_policy import cuda_ms  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402
from tools.meralion2_shaped import speech_encoder_config  # noqa: E402
from tools.profile_rounds import as_graph  # noqa: E402


def large_v3_encoder(attention: str, device):
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    return WhisperEncoder(speech_encoder_config(attention)).to(device, torch.bfloat16).eval()


def timed_rows(attention: str, batches, repeats: int, device) -> list[dict]:
    encoder, rows = large_v3_encoder(attention, device), []
    for batch in batches:
        features = torch.randn(batch, 128, 3000, device=device, dtype=torch.bfloat16)
        replay = as_graph(lambda: encoder_output(encoder, features), device)
        times = sorted(cuda_ms(replay) for _ in range(repeats))
        rows.append({"attention": attention, "batch": batch, "ms": round(times[len(times) // 2], 3)})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device, batches = torch.device("cuda"), [int(b) for b in args.batches.split(",")]
    rows = [row for attention in ("eager", "sdpa") for row in timed_rows(attention, batches, args.repeats, device)]
    write_json_atomic(args.out, {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                 "date": time.strftime("%Y-%m-%d"),
                                 "command": command_line("benchmarks/round_cost/encoder_attention.py"), "rows": rows})


if __name__ == "__main__":
    with torch.no_grad():
        main()
