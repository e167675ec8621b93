"""The CPU's rounds with the screen's bf16 product on the copy as it is against the copy in oneDNN's own layout
(``cpu_kernels.SCREEN_PRODUCT``'s two forms, each forced in turn), on real speech: ms per round of plain greedy and of
a draft, interleaved across repeats so the machine's drift falls on both, every output checked equal to plain
greedy's.

    python benchmarks/round_cost/screen_packing.py --model heads/whisper-tiny.en \
        --audio work_data/eval_speech/manifest.jsonl --out benchmarks/round_cost/cpu_tiny.en_screen_packing.json
"""

import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
import cpu_kernels  # noqa: E402
from tools import runtime  # noqa: E402
from tools.benchmark_environment import cpu_name  # noqa: E402
from tools.audio_io import load_audio  # noqa: E402
from tools.benchmark_inputs import read_manifest  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402

FORMS = ("unpacked", "packed")


def use_form(form: str) -> None:
    """Every screen product in ``form`` from now on (as if timed fastest)."""
    cpu_kernels.SCREEN_PRODUCT.chosen.clear()
    cpu_kernels.SCREEN_PRODUCT._fastest = lambda operands, without=(): form


def ms_per_round(model, inputs, draft: str, expected) -> float:
    seconds = rounds = 0
    for features, want in zip(inputs, expected):
        out, stats = model.generate(**features, max_new_tokens=224, draft=draft, return_stats=True)
        if not torch.equal(out, want):
            raise SystemExit(f"draft {draft}: output differs from plain greedy")
        seconds, rounds = seconds + stats["rounds_seconds"], rounds + stats["rounds"]
    return 1000 * seconds / rounds


def rounds_arguments(doc: str, drafts: str) -> argparse.Namespace:
    """The options of a script that times whole CPU rounds on real speech (this one, ``float32_packing.py``), parsed;
    the torch threads set."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="heads/whisper-tiny.en")
    parser.add_argument("--audio", default="work_data/eval_speech/manifest.jsonl")
    parser.add_argument("--drafts", default=drafts)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def main() -> None:
    args = rounds_arguments(__doc__, "none,chain")
    if cpu_kernels.onednn_packed(torch.zeros(8, 8, dtype=torch.bfloat16)) is None:
        raise SystemExit("this torch build has no oneDNN linear for bf16: nothing to compare")
    model = runtime.load_medusa(args.model, torch.float32, runtime.base_to_load(args.model, None)).eval()
    inputs = [model.prepare_audio_inputs([load_audio(row["audio"])]) for row in read_manifest(args.audio)]
    expected = [model.generate(**features, max_new_tokens=224, draft="none") for features in inputs]
    drafts = args.drafts.split(",")
    times = {(form, draft): [] for form in FORMS for draft in drafts}
    for repeat in range(args.repeats):
        for form in FORMS if repeat % 2 == 0 else FORMS[::-1]:
            use_form(form)
            for draft in drafts:
                ms_per_round(model, inputs[:2], draft, expected[:2])  # (warm: the form's first products)
                times[form, draft].append(ms_per_round(model, inputs, draft, expected))
                print(form, draft, round(times[form, draft][-1], 2), flush=True)
    rows = [{"form": form, "draft": draft, "ms_per_round": round(statistics.median(v), 3), "runs": [round(x, 3) for x in v]}
            for (form, draft), v in times.items()]
    write_json_atomic(args.out, {"command": command_line("benchmarks/round_cost/screen_packing.py"), "cpu": cpu_name(),
                                 "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "model": args.model,
                                 "clips": len(inputs), "rows": rows})


if __name__ == "__main__":
    main()
