"""The CPU's rounds with the self-attention's q/k/v as one product and the speech scores in the form timed fastest
(``cpu_kernels.SPEECH_SCORES``), against three products and ``query @ keys^T`` as before, on a real Whisper base and real
speech: ms per round of plain greedy and of each draft, interleaved across repeats so the machine's drift falls on
both, each chosen again from scratch, every output checked equal to plain greedy's.

    python benchmarks/round_cost/fused_projections_cpu.py --model heads/whisper-tiny.en \
        --audio work_data/eval_speech/manifest.jsonl --out benchmarks/round_cost/cpu_tiny.en_fused_projections.json
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

SCORE_FORMS = dict(cpu_kernels.SPEECH_SCORES.forms)
VARIANTS = {"before": (False, ("keys_right",)), "fused_and_scores": (True, tuple(SCORE_FORMS))}  # fused, forms


def use_variant(model, variant: str, fuse_projections) -> None:
    """The rounds run as ``variant`` says from now on, the score forms timed again."""
    fused, forms = VARIANTS[variant]
    model.backbone.fuse_projections = fuse_projections if fused else (lambda: False)
    model.backbone.fused = None
    model.round_cache.signature = None  # (the next call fuses again, or not)
    scores = cpu_kernels.SPEECH_SCORES
    scores.forms = {name: SCORE_FORMS[name] for name in forms}
    scores.chosen.clear()
    scores._timings.clear()


def main() -> None:
    args = rounds_arguments(__doc__, "none,chain")
    runtime.time_drafts_afresh()
    model = runtime.load_medusa(args.model, torch.float32, runtime.base_to_load(args.model, None)).eval()
    fuse_projections = model.backbone.fuse_projections
    inputs = [model.prepare_audio_inputs([load_audio(row["audio"])]) for row in read_manifest(args.audio)]
    expected = [model.generate(**features, max_new_tokens=224, draft="none") for features in inputs]
    drafts = args.drafts.split(",")
    times = {(variant, draft): [] for variant in VARIANTS for draft in drafts}
    for repeat in range(args.repeats):
        for variant in VARIANTS if repeat % 2 == 0 else list(VARIANTS)[::-1]:
            use_variant(model, variant, fuse_projections)
            for draft in drafts:
                ms_per_round(model, inputs[:2], draft, expected[:2])  # (warm, and the forms timed in use)
                times[variant, draft].append(ms_per_round(model, inputs, draft, expected))
                print(variant, draft, round(times[variant, draft][-1], 2), flush=True)
    rows = [{"variant": variant, "draft": draft, "ms_per_round": round(statistics.median(v), 3),
             "runs": [round(x, 3) for x in v]} for (variant, draft), v in times.items()]
    write_json_atomic(args.out, {"command": command_line("benchmarks/round_cost/fused_projections_cpu.py"),
                                 "cpu": cpu_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                                 "model": args.model, "clips": len(inputs), "rounds": rows,
                                 "score_forms_chosen": {str(k): v for k, v in cpu_kernels.SPEECH_SCORES.chosen.items()}})


if __name__ == "__main__":
    main()
