"""Where a MERaLiON-2 prefill goes after the speech encoder: the speech encoder with the adapter, and the prompt's
pass through every decoder layer (``MERaLiON2Backbone.layers_over_prompt``), each timed alone as a CUDA graph, the
prompt pass's kernels by kind (torch.profiler), and the same pass compiled (``--compile``: ``torch.compile`` of it,
then captured; its output against the eager pass's: the largest difference of the last hidden state and whether the
first token agrees), the speech encoder too. Random weights of the full shape (speed only).

    python benchmarks/round_cost/prompt_pass.py --shape meralion2-3b --batches 1,16 --compile \
        --out benchmarks/round_cost/h200_meralion2-3b_prompt_pass.json

``--device cpu --text-layers 1`` runs it small on a CPU (no graphs, no kernel table): a check of the script itself.
"""

import argparse
import sys
import time

import torch

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks/round_cost")
from backbone import compile_fixed_shape, encoder_output  # noqa: E402
from backbone_meralion2 import MERaLiON2Backbone  # noqa: E402
from draft_timing import cuda_ms  # noqa: E402
from kv_cache import CachePool, DecodeState  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402
from tools.profile_rounds import as_graph, wall_ms  # noqa: E402
from tools.meralion2_shaped import build_model, make_prompt, prefill  # noqa: E402
from verify_pass_kernels import interleaved_ms, kernel_table  # noqa: E402


def batch_row(model, backbone, batch: int, compile: bool, top: int, repeats: int) -> dict:
    device = model.device
    inputs = make_prompt(model, batch, device)
    state, _ = prefill(backbone, inputs, 8, 8, cache_pool=CachePool())  # a cache, and the rotary table for it
    features = backbone.speech_features(inputs["input_features"])
    placeholders = int((inputs["input_ids"] == backbone.speech_token_index).sum())
    embeds = backbone.prompt_embeddings(inputs["input_ids"], features, placeholders)

    def layers(pass_fn=backbone.layers_over_prompt):
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        return pass_fn(DecodeState(state.cache, zeros, zeros.clone(), hidden=None, next_token=None), embeds)

    def speech(encoder_fn=encoder_output):
        return model.speech_audio_adapter(model.ln_speech(encoder_fn(model.speech_encoder, features)))

    calls = {"encoder_and_adapter": as_graph(speech, device), "prompt_pass": as_graph(layers, device)}
    eager = layers()
    row = {"batch": batch, "prompt_tokens": embeds.shape[1]}
    if compile:
        compiled_pass = compile_fixed_shape(backbone.layers_over_prompt)
        start = time.perf_counter()
        got = layers(compiled_pass)
        row["compile_s"] = round(time.perf_counter() - start, 1)
        calls["prompt_pass_compiled"] = as_graph(lambda: layers(compiled_pass), device)
        first = [backbone.logits(h[:, -1:]).argmax(-1) for h in (eager, got)]
        row.update({"compiled_max_abs_difference": (got.float() - eager.float()).abs().max().item(),
                    "compiled_first_token_agrees": bool(torch.equal(*first))})
        compiled_encoder = compile_fixed_shape(encoder_output)
        start = time.perf_counter()
        speech_got = speech(compiled_encoder)
        row["encoder_compile_s"] = round(time.perf_counter() - start, 1)
        row["encoder_compiled_max_abs_difference"] = (speech_got.float() - speech().float()).abs().max().item()
        calls["encoder_and_adapter_compiled"] = as_graph(lambda: speech(compiled_encoder), device)
    timer = cuda_ms if device.type == "cuda" else wall_ms
    row.update({f"{name}_ms": round(ms, 3) for name, ms in interleaved_ms(calls, repeats, timer=timer).items()})
    if device.type == "cuda":
        row["prompt_pass_kernels"] = kernel_table(calls["prompt_pass"], replays=5, top=top)
        if compile:
            row["prompt_pass_compiled_kernels"] = kernel_table(calls["prompt_pass_compiled"], replays=5, top=top)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="meralion2-3b")
    parser.add_argument("--text-layers", type=int, default=None, help="fewer decoder layers (a quick check)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--top", type=int, default=20, help="how many of the costliest kernels to list")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(device, dtype, args.shape, args.text_layers)
    backbone = MERaLiON2Backbone(model)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        rows.append(batch_row(model, backbone, batch, args.compile, args.top, args.repeats))
        print({k: v for k, v in rows[-1].items() if not k.endswith("_kernels")}, flush=True)
    write_json_atomic(args.out, {
        "shape": args.shape, "text_layers": model.config.text_config.num_hidden_layers, "dtype": str(dtype),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"), "command": command_line("benchmarks/round_cost/prompt_pass.py"),
        "rows": rows})


if __name__ == "__main__":
    with torch.no_grad():
        main()
