"""The CPU's few-row float32 products through the decoder's weights with and without oneDNN's packed form
(``cpu_kernels.FEW_ROWS_PRODUCT``), on a real Whisper base:

- each form alone, for 1 / 5 / 17 rows, timed through every decoder weight of a shape in turn (so each comes from
  memory, as in the loop: one weight timed back to back stays in cache);
- whole rounds on real speech, the products as before (rows or columns, timed back to back on first use, up to
  16 rows), the same two forms timed in use (up to 64 rows), and the three forms timed in use (the default now),
  each chosen again from scratch, interleaved across repeats so the machine's drift falls on all; ms per round of
  plain greedy and of each draft, every output checked equal to plain greedy's.

    python benchmarks/round_cost/float32_packing.py --model heads/whisper-tiny.en \
        --audio work_data/eval_speech/manifest.jsonl --out benchmarks/round_cost/cpu_tiny.en_float32_packing.json
"""

import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
import cpu_kernels  # noqa: E402
from benchmarks.round_cost.screen_packing import ms_per_round, rounds_arguments  # noqa: E402
from tools import runtime  # noqa: E402
from tools.audio_io import load_audio  # noqa: E402
from tools.benchmark_environment import cpu_name  # noqa: E402
from tools.benchmark_inputs import read_manifest  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402

ALL_FORMS = dict(cpu_kernels.FEW_ROWS_PRODUCT.forms)
VARIANTS = {  # forms, timed in use, rows up to
    "before": (("rows", "columns"), False, 16),
    "in_use": (("rows", "columns"), True, 64),
    "in_use_packed": (("rows", "columns", "packed"), True, 64),
}


def use_variant(variant: str) -> None:
    """The loop chooses as ``variant`` says from now on, timing its forms again."""
    names, in_use, few_rows = VARIANTS[variant]
    product = cpu_kernels.FEW_ROWS_PRODUCT
    product.forms, product.in_use = {name: ALL_FORMS[name] for name in names}, in_use
    product.chosen.clear()
    product._timings.clear()
    cpu_kernels.CPU_FEW_ROWS = few_rows


def decoder_weights(model) -> dict:
    """The decoder layers' float32 weights and biases by shape (what a round multiplies a few rows by)."""
    by_shape = {}
    for layer in model.backbone.decoder.layers:
        for module in layer.modules():
            if type(module) is torch.nn.Linear:
                by_shape.setdefault(tuple(module.weight.shape), []).append((module.weight, module.bias))
    return by_shape


def forms_alone(model, rows_counts, turns: int = 9) -> list[dict]:
    out = []
    for shape, weights in decoder_weights(model).items():
        packed = [cpu_kernels.onednn_packed(w) for w, _ in weights]
        for rows in rows_counts:
            x = torch.randn(rows, shape[1])
            us = {}
            for name, form in ALL_FORMS.items():
                times = []
                for _ in range(turns):
                    start = time.perf_counter()
                    for (w, b), p in zip(weights, packed):
                        form(x, w, b, p)
                    times.append((time.perf_counter() - start) / len(weights))
                us[name] = round(statistics.median(times[1:]) * 1e6, 1)
            out.append({"shape": list(shape), "weights": len(weights), "rows": rows, "us": us})
            print(out[-1], flush=True)
    return out


def main() -> None:
    args = rounds_arguments(__doc__, "none,chain,tree")
    if not cpu_kernels.packs_float32():
        raise SystemExit("this torch build has no oneDNN linear for float32: nothing to compare")
    model = runtime.load_medusa(args.model, torch.float32, runtime.base_to_load(args.model, None)).eval()
    with torch.no_grad():
        alone = forms_alone(model, (1, 5, 17))
    inputs = [model.prepare_audio_inputs([load_audio(row["audio"])]) for row in read_manifest(args.audio)]
    expected = [model.generate(**features, max_new_tokens=224, draft="none") for features in inputs]
    drafts = args.drafts.split(",")
    times = {(variant, draft): [] for variant in VARIANTS for draft in drafts}
    chosen = {}
    for repeat in range(args.repeats):
        for variant in VARIANTS if repeat % 2 == 0 else list(VARIANTS)[::-1]:
            use_variant(variant)
            for draft in drafts:
                ms_per_round(model, inputs[:2], draft, expected[:2])  # (warm, and the forms timed in use)
                times[variant, draft].append(ms_per_round(model, inputs, draft, expected))
                print(variant, draft, round(times[variant, draft][-1], 2), flush=True)
            chosen[variant] = {str(key): name for key, name in cpu_kernels.FEW_ROWS_PRODUCT.chosen.items()}
    rows = [{"variant": variant, "draft": draft, "ms_per_round": round(statistics.median(v), 3),
             "runs": [round(x, 3) for x in v]} for (variant, draft), v in times.items()]
    write_json_atomic(args.out, {"command": command_line("benchmarks/round_cost/float32_packing.py"),
                                 "cpu": cpu_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                                 "model": args.model, "clips": len(inputs), "forms_alone_us": alone, "rounds": rows,
                                 "chosen_in_the_last_repeat": chosen})


if __name__ == "__main__":
    main()
