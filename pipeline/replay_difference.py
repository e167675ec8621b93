"""Tokens a verify pass of two heads on the same recorded transcripts, with a paired bootstrap interval.

    python -m pipeline.replay_difference --first heads/whisper-tiny.en --second ARTIFACT [ARTIFACT ...] \\
        --data work_data/heldout_english_tiny.en [COLLECT ...] --draft tree-32 --out benchmarks/heads_comparison/replay_difference.json

Each heads' draft is replayed exactly (``pipeline.acceptance``) on the recordings of ``pipeline.collect --speech``
(collected with the base both heads share), and the clips are resampled with replacement for the interval of the
second's difference (``tools.wer_difference --metric tokens_per_pass`` does the same for two benchmark runs). On
the 28 real recordings one round is about 1 %; a few hundred held-out clips tell a 2 % difference apart. Every
second heads is compared with the first on every data folder: one row each in OUT, and OUT's grid as Markdown
beside it (OUT with ``.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from pipeline.acceptance import tokens_per_round
from pipeline.train import collected_recordings
from tools import cli_args
from tools.files import command_line, write_atomic
from tools.markdown import markdown_table


def replayed_counts(model, draft: str, folder: str) -> np.ndarray:
    """[2, clips]: each recording's emitted tokens and rounds with the heads' ``draft``."""
    tree = model.draft_policy.resolve(draft)
    with torch.no_grad():
        replay = tokens_per_round(model.make_drafter(tree, "cpu"), tree, collected_recordings(model, folder))
    return np.array([replay["tokens_per_recording"], replay["rounds_per_recording"]], dtype=float)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.replay_difference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--first", required=True, help="the reference heads (an artifact)")
    p.add_argument("--second", required=True, nargs="+",
                   help="the heads compared with them (artifacts of the same base)")
    p.add_argument("--data", required=True, nargs="+", help="folders of `pipeline.collect --speech` with that base")
    p.add_argument("--draft", default="tree-32", help="each heads' own draft of this name (chain, tree, tree-N)")
    p.add_argument("--resamples", type=cli_args.positive_int, default=10_000)
    p.add_argument("--out", required=True, help="JSON list of rows; a row for the same heads, data and draft is replaced")
    return p


def difference_tables(rows: list[dict]) -> str:
    """One table for each first heads: data folders down, the first's tokens a pass, then each second's with its
    difference."""
    return "\n\n".join(difference_table([r for r in rows if r["first"] == first])
                       for first in dict.fromkeys(r["first"] for r in rows)) + "\n"


def difference_table(rows: list[dict]) -> str:
    seconds = list(dict.fromkeys(r["second"] for r in rows))
    cells = {(r["data"], r["second"]): r for r in rows}
    lines = []
    for data in dict.fromkeys(r["data"] for r in rows):
        first = next(r for r in rows if r["data"] == data)
        line = [data, first["clips"], f"{first['tokens_per_pass_first']:.2f}"]
        for second in seconds:
            r = cells.get((data, second))
            line.append("" if r is None else f"{r['tokens_per_pass_second']:.2f} ({r['difference_percent']:+.1f} % "
                                              f"[{r['interval_percent'][0]:+.1f}, {r['interval_percent'][1]:+.1f}])")
        lines.append(line)
    return markdown_table(["data", "clips", f"`{rows[0]['first']}`", *(f"`{s}`" for s in seconds)], lines)


def main(argv=None) -> list[dict]:
    from tools.benchmark_report import update_summary
    from tools.wer_difference import CONFIDENCE, pass_difference

    args = build_parser().parse_args(argv)
    from transformers import AutoModel

    models = {heads: AutoModel.from_pretrained(heads, trust_remote_code=True).eval()
              for heads in dict.fromkeys([args.first, *args.second])}
    rows = []
    for data in args.data:
        first = replayed_counts(models[args.first], args.draft, data)
        for second in args.second:
            counts = np.concatenate([first, replayed_counts(models[second], args.draft, data)])
            row = {"first": args.first, "second": second, "data": data, "draft": args.draft,
                   "metric": "replayed_tokens_per_pass", **pass_difference(counts, args.resamples),
                   "tokens": int(counts[0].sum()), "command": command_line("pipeline.replay_difference", argv)}
            update_summary(Path(args.out), row, key=("first", "second", "data", "draft"))
            rows.append(row)
            low, high = row["interval_percent"]
            print(f"{second} on {data}: {row['tokens_per_pass_first']:.3f} -> {row['tokens_per_pass_second']:.3f} "
                  f"tokens a pass on {row['clips']} clips ({row['tokens']} tokens): {row['difference_percent']:+.1f} %, "
                  f"{100 * CONFIDENCE:.0f} % interval [{low:+.1f}, {high:+.1f}]")
    out = Path(args.out)
    write_atomic(out.with_suffix(".md"), difference_tables(json.loads(out.read_text())))
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
