#!/usr/bin/env python
"""Would a chain that stops drafting when its heads are unsure pay on a CPU? Measured, then simulated.

    python -m tools.chain_confidence --model heads/whisper-tiny.en \
        --audio work_data/eval_speech/manifest.jsonl --out benchmarks/round_cost/cpu_chain_confidence.json

1. Decodes every clip with the full chain and records, per round, each depth's draft probability (the softmax
   maximum of the head's draft logits) and how many drafts the base accepted.
2. Times rounds of chains of 0..K drafts on the same clips, or the first N (the call's rounds seconds over its
   rounds, medians of repeats).
3. Replays the rounds under "draft depth d only while the product of the depths' probabilities so far is at least
   t" (the depth where it falls below is drafted and verified, the ones after it are not): a round then emits
   min(accepted, d) + 1 tokens (none past an EOS) at the cost of a d-draft round, so the rounds' speed-up over
   plain greedy per threshold t follows. ``MedusaOptions.cpu_chain_stop`` is that t.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from draft_trees import DraftTree
from medusa_heads import draft_probability
from tools import cli_args
from tools.benchmark_inputs import load_clips, load_model, read_manifest, resolve_artifact
from tools.files import command_line, write_json_atomic


class RecordingProjection:
    """Delegates to the drafter's projection and keeps each call's top draft probability (batch 1)."""

    def __init__(self, projection):
        self.projection, self.probabilities = projection, []

    def logits(self, states):
        logits = self.projection.logits(states)
        self.probabilities.append(float(draft_probability(logits).max()))
        return logits

    def __getattr__(self, name):
        return getattr(self.projection, name)


def record_rounds(model, clips, depth: int) -> list[dict]:
    """Per round of the full chain: the depths' draft probabilities and the accepted drafts."""
    tree = DraftTree.chain(depth)
    drafter = model.make_drafter(tree, "cpu")
    recorder = RecordingProjection(drafter.projection)
    drafter.projection = recorder
    rounds_of, eos = model._rounds, set(model.backbone.eos_token_ids)
    records = []

    def recording_rounds(*args, **kwargs):
        rounds = rounds_of(*args, **kwargs)
        step = rounds.step

        def recorded_step(active):
            recorder.probabilities.clear()
            result = step(active)
            emitted = result.emitted[0]  # accepted drafts, then the base's own token: tokens past an EOS are not kept
            usable = next((i + 1 for i, token in enumerate(emitted) if token in eos), len(emitted))
            records.append({"probabilities": list(recorder.probabilities), "accepted": result.accepted[0],
                            "usable": usable})
            return result

        rounds.step = recorded_step
        return rounds

    model._rounds = recording_rounds
    try:
        for clip in clips:
            model.generate(**clip.inputs, draft="chain")
    finally:
        model._rounds = rounds_of
        drafter.projection = recorder.projection
    return records


def round_ms(model, clips, drafts: int, repeats: int) -> float:
    """Median over repeats of the rounds' seconds per round, summed over the clips (chain of ``drafts``)."""
    paths = [[0] * d for d in range(1, drafts + 1)]
    per_round = []
    for _ in range(repeats):
        seconds = rounds = 0
        for clip in clips:
            _, stats = model.generate(**clip.inputs, draft=paths, return_stats=True)
            seconds, rounds = seconds + stats["rounds_seconds"], rounds + stats["rounds"]
        per_round.append(1000.0 * seconds / rounds)
    return statistics.median(per_round)


def replay(records: list[dict], costs: list[float], threshold: float) -> dict:
    """Tokens per round, mean drafts and the rounds' speed-up over plain greedy under the stopping rule."""
    tokens = drafted = ms = 0.0
    for record in records:
        depth, product = 0, 1.0
        for probability in record["probabilities"]:
            product, depth = product * probability, depth + 1
            if product < threshold:
                break
        tokens += min(min(record["accepted"], depth) + 1, record["usable"])
        drafted += depth
        ms += costs[depth]
    n = len(records)
    return {"threshold": threshold, "tokens_per_round": tokens / n, "mean_drafts": drafted / n,
            "round_ms": ms / n, "speedup_vs_plain": (tokens / ms) * costs[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.chain_confidence", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="heads/whisper-tiny.en")
    p.add_argument("--audio", default="work_data/eval_speech/manifest.jsonl")
    p.add_argument("--repeats", type=cli_args.positive_int, default=3)
    p.add_argument("--cost-clips", type=cli_args.positive_int, default=None, help="time the rounds on the first N clips (default: all)")
    p.add_argument("--thresholds", type=cli_args.fractions_text, default="0,0.1,0.2,0.3,0.4,0.45,0.5,0.55,0.6,0.65,0.7,0.8,0.9")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model, _, _ = load_model(resolve_artifact(args.model), "cpu", torch.float32)
    model.set_options(cpu_chain_stop=0.0)  # the full chain: what the replay cuts
    clips = load_clips(model, read_manifest(args.audio), progress=False)
    depth = model.config.medusa_num_heads
    records = record_rounds(model, clips, depth)
    round_ms(model, clips[:2], depth, 1)  # warm-up
    timed = clips[: args.cost_clips] if args.cost_clips else clips
    costs = [round_ms(model, timed, drafts, args.repeats) for drafts in range(depth + 1)]
    rows = [replay(records, costs, float(t)) for t in args.thresholds.split(",")]
    result = {"command": command_line("tools.chain_confidence", argv), "model": args.model,
              "audio": args.audio, "clips": len(clips), "timed_clips": len(timed), "rounds": len(records),
              "round_ms_by_drafts": costs, "replayed": rows, "records": records}
    write_json_atomic(args.out, result)
    print("drafts: round ms " + " / ".join(f"{c:.2f}" for c in costs))
    for row in rows:
        print(f"t={row['threshold']:.2f}: {row['tokens_per_round']:.2f} tokens/round, {row['mean_drafts']:.2f} drafts, "
              f"{row['round_ms']:.2f} ms, {row['speedup_vs_plain']:.3f}x plain")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
