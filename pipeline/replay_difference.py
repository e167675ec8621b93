"""Tokens a verify pass of two heads on the same recorded transcripts, with a paired bootstrap interval.

    python -m pipeline.replay_difference --first heads/whisper-tiny.en --second ARTIFACT \\
        --data work_data/heldout_english_tiny.en --draft tree-32 --out benchmarks/heads_comparison/replay_difference.json

Each heads' draft is replayed exactly (``pipeline.acceptance``) on the recordings of ``pipeline.collect --speech``
(collected with the base both heads share), and the clips are resampled with replacement for the interval of the
second's difference (``tools.wer_difference --metric tokens_per_pass`` does the same for two benchmark runs). On
the 28 real recordings one round is about 1 %; a few hundred held-out clips tell a 2 % difference apart.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from pipeline.acceptance import tokens_per_round
from pipeline.train import Collected
from tools import cli_args
from tools.files import command_line


def replayed_counts(model, draft: str, folder: str) -> np.ndarray:
    """[2, clips]: each recording's emitted tokens and rounds with the heads' ``draft``."""
    memory = model.backbone.speech_memory_of if model.config.speech_attention else None
    data = Collected([folder], with_speech=memory is not None)
    tree = model.draft_policy.resolve(draft)
    with torch.no_grad():
        replay = tokens_per_round(model.make_drafter(tree, "cpu"), tree, data.recordings(range(len(data.ids)), memory))
    return np.array([replay["tokens_per_recording"], replay["rounds_per_recording"]], dtype=float)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.replay_difference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--first", required=True, help="the reference heads (an artifact)")
    p.add_argument("--second", required=True, help="the heads compared with them (an artifact of the same base)")
    p.add_argument("--data", required=True, help="a folder of `pipeline.collect --speech` with that base")
    p.add_argument("--draft", default="tree-32", help="each heads' own draft of this name (chain, tree, tree-N)")
    p.add_argument("--resamples", type=cli_args.positive_int, default=10_000)
    p.add_argument("--out", required=True, help="JSON list of rows; a row for the same heads, data and draft is replaced")
    return p


def main(argv=None) -> dict:
    from tools.benchmark_report import update_summary
    from tools.wer_difference import CONFIDENCE, pass_difference

    args = build_parser().parse_args(argv)
    from transformers import AutoModel

    counts = np.concatenate([replayed_counts(AutoModel.from_pretrained(heads, trust_remote_code=True).eval(), args.draft,
                                             args.data) for heads in (args.first, args.second)])
    row = {"first": args.first, "second": args.second, "data": args.data, "draft": args.draft,
           "metric": "replayed_tokens_per_pass", **pass_difference(counts, args.resamples),
           "tokens": int(counts[0].sum()), "command": command_line("pipeline.replay_difference", argv)}
    update_summary(Path(args.out), row, key=("first", "second", "data", "draft"))
    low, high = row["interval_percent"]
    print(f"{row['tokens_per_pass_first']:.3f} -> {row['tokens_per_pass_second']:.3f} tokens a pass on {row['clips']} "
          f"clips ({row['tokens']} tokens): {row['difference_percent']:+.1f} %, {100 * CONFIDENCE:.0f} % interval "
          f"[{low:+.1f}, {high:+.1f}]")
    return row


if __name__ == "__main__":
    sys.exit(main() and 0)
