"""Where a whole MERaLiON-2 round goes on the GPU, beside the verify pass alone: the benchmark's captured, compiled
round (``tools.benchmark_gpu``'s replayed drafts, random weights of the full shape, batch 1 or ``--batch``) for each draft, timed
back to back as a graph replay, then as ``run_rounds`` drives it (the host reading each round's tokens), with its
kernels grouped by kind and the costliest listed (torch.profiler). Writes one JSON with the command. ``--device cpu --text-layers 1`` runs it small on a CPU (no graphs, no kernel
table): a check of the script itself.

    python -m tools.round_kernels --shape meralion2-3b --drafts none,chain,tree-32 \
        --out benchmarks/round_cost/h200_meralion2-3b_round_kernels.json
"""

import argparse
import statistics
import time

import torch

from backbone_meralion2 import MERaLiON2Backbone  # noqa: E402
from draft_timing import cuda_ms  # noqa: E402
from kv_cache import CachePool  # noqa: E402
from medusa_decoding import MedusaStats, run_rounds  # noqa: E402
from medusa_fast import CapturedRounds  # noqa: E402
from medusa_heads import MedusaDrafter  # noqa: E402
from tools.verify_pass_kernels import kernel_table  # noqa: E402
from tools.benchmark_gpu import draft_trees  # noqa: E402
from tools.profile_rounds import wall_ms  # noqa: E402
from tools import cli_args  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402
from tools.meralion2_shaped import (DRAFTER_COSTS, SEED_TOP1, build_model, make_prompt, plain_continuation,  # noqa: E402
                                    prefill, rank_profile, replay_drafter)


def round_runner(backbone, inputs, continuation, profile, tree, max_new, drafter_cost):
    """A compiled, captured round over a prefilled state (the prefill itself eager: only the rounds are timed)."""
    state, process = prefill(backbone, inputs, max_new, 2 * tree.num_nodes, min_new=max_new, cache_pool=CachePool())
    replay = replay_drafter(drafter_cost, backbone, continuation, profile, seed=1)
    drafter = MedusaDrafter(tree, continuation.device, replay, replay.token_ids) if tree.num_nodes > 1 else None
    start = time.perf_counter()
    runner = CapturedRounds(backbone, drafter, process, state, tree, compile=True, num_generated=replay.num_generated)
    if inputs["input_ids"].is_cuda:
        torch.cuda.synchronize()
    return runner, time.perf_counter() - start


def back_to_back_ms(runner, start, rounds: int) -> float:
    """Median device time of one round's replay over ``rounds`` consecutive rounds from ``start`` (a snapshot)."""
    timer = cuda_ms if runner.graph is not None else wall_ms
    start()
    times = [timer(runner.replay) for _ in range(rounds)]
    start()
    return statistics.median(times)


def driven_ms(runner, start, new_tokens: int) -> tuple[float, int]:
    """Wall time per round as ``run_rounds`` drives it (a replay, then the host reads the round's tokens), from
    ``start`` (a snapshot) until ``new_tokens`` are emitted; and how many rounds that took."""
    start()
    stats = MedusaStats()
    began = time.perf_counter()
    run_rounds(runner, runner.state.next_token.tolist(), new_tokens, eos_token_ids=[], stats=stats)
    elapsed = time.perf_counter() - began
    start()
    return elapsed * 1000 / stats.rounds, stats.rounds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.round_kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="meralion2-3b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--text-layers", type=cli_args.positive_int, default=None, help="fewer decoder layers (a check of the script)")
    parser.add_argument("--drafts", default="none,chain,tree-32")
    parser.add_argument("--rounds", type=cli_args.positive_int, default=16, help="rounds timed (and profiled) back to back")
    parser.add_argument("--batch", type=cli_args.positive_int, default=1, help="rows of every round (the same prompt repeated)")
    parser.add_argument("--top", type=cli_args.positive_int, default=25)
    parser.add_argument("--drafter-cost", choices=DRAFTER_COSTS, default="replay",
                        help="heads: the replayed drafts at trained heads' cost (tools.meralion2_shaped.HeadsCostDrafter)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    model = build_model(device, torch.bfloat16 if device.type == "cuda" else torch.float32, args.shape, args.text_layers)
    backbone = MERaLiON2Backbone(model)
    backbone.fuse_projections()
    one = make_prompt(model, 1, model.device)
    max_new = 4 * args.rounds + 16
    continuation = plain_continuation(backbone, one, max_new).expand(args.batch, -1).contiguous()
    inputs = {name: value.expand(args.batch, *value.shape[1:]).contiguous() for name, value in one.items()}
    profile, rows = rank_profile(SEED_TOP1), []

    def write():
        write_json_atomic(args.out, {"command": command_line("tools.round_kernels"),
                                     "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                                     "torch": torch.__version__, "text_layers": args.text_layers,
                                     "shape": args.shape, "batch": args.batch, "drafter_cost": args.drafter_cost,
                                     "rows": rows})

    for name, tree in draft_trees(profile, args.drafts.split(",")).items():
        runner, setup = round_runner(backbone, inputs, continuation, profile, tree, max_new, args.drafter_cost)
        start = runner.snapshot()
        row = {"draft": name, "nodes": tree.num_nodes, "setup_seconds": setup,
               "round_ms_back_to_back": back_to_back_ms(runner, start, args.rounds)}
        row["round_ms_driven"], row["rounds_driven"] = driven_ms(runner, start, 3 * args.rounds)
        if device.type == "cuda":
            row.update(kernel_table(runner.replay, replays=args.rounds, top=args.top))
            start()
        rows.append(row)
        print({k: v for k, v in row.items() if k != "top_kernels_us"}, flush=True)
        write()
        runner.release()
        del runner
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    with torch.no_grad():
        main()
