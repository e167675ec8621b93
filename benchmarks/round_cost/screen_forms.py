"""The CPU's screened output projection (``cpu_kernels.ScreenedArgmax``) in other forms, on a real converted Whisper:
the screen's product timed on a bfloat16 copy of the weight (as it is, and in oneDNN's own layout, made once:
``ScreenedArgmax`` runs the faster of the two) against an int8 weight-only copy
(``aten._weight_int8pack_mm``, per-row scales: half the bytes again) and the float32 projection in full (``Projection``, as the CPU rounds run it); and, on the
decoder states of real speech (the base's own greedy continuation of each clip, teacher-forced), how many rows each
screen proves with 8, 16 or 32 candidates: the bf16 and int8 copies with the bound as ``ScreenedArgmax`` computes it
(the largest row error of the copy for every token), and the int8 copy with each token's own error. A row the bound
does not prove is projected in full, so a cheaper screen pays only where it still proves nearly every row.

    python benchmarks/round_cost/screen_forms.py --model openai/whisper-tiny.en \
        --audio ../shared/data/librispeech-test-clean-4 --out benchmarks/round_cost/cpu_tiny.en_screen_forms.json
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from cpu_kernels import (ROUNDING_BF16, Projection, ScreenedArgmax, cpu_linear, onednn_linear, onednn_packed,  # noqa: E402
                      screen_copy)
from medusa_heads import int8_drafting_supported, int8_rows  # noqa: E402
from tools.benchmark_environment import cpu_name  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402


def decoder_states(model_dir: Path, audio_dir: Path) -> torch.Tensor:
    """[rows, H]: the last decoder layer's states over each clip's greedy continuation (what the screen decides)."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    from tools.audio_io import load_audio

    base = WhisperForConditionalGeneration.from_pretrained(str(model_dir)).eval()
    features = WhisperFeatureExtractor.from_pretrained(str(model_dir))
    states = []
    for path in sorted(p for p in audio_dir.iterdir() if p.suffix in (".flac", ".wav")):
        inputs = features(load_audio(path), sampling_rate=16000, return_tensors="pt").input_features
        with torch.no_grad():
            tokens = base.generate(inputs, max_new_tokens=200)
            out = base(input_features=inputs, decoder_input_ids=tokens, output_hidden_states=True)
        states.append(out.decoder_hidden_states[-1][0])
    return torch.cat(states), base.proj_out.weight.detach().float()


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def product_times(weight: torch.Tensor, rows: list[int], repeats: int) -> list[dict]:
    low = screen_copy(weight)[0]
    forms = {"float32_full": Projection(lambda: weight), "bf16_screen": lambda x: cpu_linear(x.bfloat16(), low)}
    packed = onednn_packed(low)
    if packed is not None:  # the bf16 copy in oneDNN's own layout, as ScreenedArgmax runs it where it is faster
        forms["bf16_screen_packed"] = lambda x: onednn_linear(x.bfloat16(), packed)
    if int8_drafting_supported("cpu"):
        q, scales = int8_rows(weight)
        forms["int8_screen"] = lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), q, scales.bfloat16())
    out = []
    for n in rows:
        x = torch.randn(n, weight.shape[1])
        out.append({"rows": n, **{name: round(median_ms(lambda: form(x), repeats), 3) for name, form in forms.items()}})
        print(out[-1], flush=True)
    return out


def rows_proved(h: torch.Tensor, weight: torch.Tensor, copy: torch.Tensor, m: int, per_token: bool) -> int:
    """Rows whose best of the m best screened tokens (scored exactly) beats every other token's bound."""
    exact = h @ weight.T
    x = h.bfloat16()
    screened = F.linear(x.float(), copy).bfloat16().float()  # (the copy's scores, rounded as the screen's bf16 output)
    top = screened.topk(m + 1, dim=-1)
    candidates = top.indices[:, :m]
    best = exact.gather(1, candidates).amax(dim=-1)
    norm_w = float(copy.norm(dim=1).max()) * (1 + 1e-6)
    errors = (weight - copy).norm(dim=1) * (1 + 1e-6)  # each token's |W_j - copy_j|
    if per_token:
        upper = screened + ROUNDING_BF16 * (1 + 2 * ROUNDING_BF16) * screened.abs() + errors[None, :] * h.norm(dim=-1)[:, None]
        input_error, exact_rounding = ScreenedArgmax.arithmetic_errors(h, x, norm_w)
        outside = upper.scatter(1, candidates, float("-inf")).amax(dim=-1) + input_error + exact_rounding
    else:
        outside = ScreenedArgmax._largest_outside(top.values[:, m], h, x, None, float(errors.max()), norm_w)
    return int((best > outside + 1e-6 * best.abs()).sum())


def proof_rates(h: torch.Tensor, weight: torch.Tensor, candidates: list[int]) -> list[dict]:
    q, scales = int8_rows(weight)
    copies = {"bf16": (weight.bfloat16().float(), False), "int8": (q.float() * scales.bfloat16().float()[:, None], False),
              "int8_per_token": (q.float() * scales.bfloat16().float()[:, None], True)}
    out = [{"screen": name, "candidates": m, "rows": h.shape[0], "proved": rows_proved(h, weight, copy, m, per_token),
            "largest_row_error": round(float((weight - copy).norm(dim=1).max()), 5)}
           for name, (copy, per_token) in copies.items() for m in candidates]
    for row in out:
        print(row, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="openai/whisper-tiny.en")
    parser.add_argument("--audio", required=True, help="a folder of clips (flac / wav)")
    parser.add_argument("--rows", default="1,5")
    parser.add_argument("--candidates", default="8,16,32")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from tools.real_whisper import ensure_converted

    torch.set_num_threads(args.threads)
    states, weight = decoder_states(ensure_converted(args.model), Path(args.audio))
    result = {"command": command_line("benchmarks/round_cost/screen_forms.py"), "model": args.model,
              "cpu": cpu_name(), "torch": torch.__version__, "threads": args.threads,
              "products_ms": product_times(weight, [int(r) for r in args.rows.split(",")], args.repeats),
              "proof": proof_rates(states, weight, [int(m) for m in args.candidates.split(",")])}
    write_json_atomic(args.out, result)


if __name__ == "__main__":
    with torch.no_grad():  # (as generate runs: with autograd on, ``Projection`` takes the plain F.linear route)
        main()
