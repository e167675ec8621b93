"""How far apart two runs' word error rates are on the same clips, with a paired bootstrap interval: the clips are
resampled with replacement (each keeping both runs' transcripts), and the corpus WER difference is recomputed on
each resample. On a few hundred words a WER difference of a point or two is a handful of words, so the interval
says whether a bound such as "within 1 point" can be told apart from chance on these clips.

Reads two ``tools.benchmark`` results files (the same clips; ``--method`` picks whose transcripts: the base's own
``generate`` by default) and adds one row to ``--out`` (rows keyed by the two files):

    python -m tools.wer_difference benchmarks/quantised/cpu_tiny.en_fp32/results.json \\
        benchmarks/quantised/cpu_tiny.en_w4a16/results.json --out benchmarks/quantised/wer_difference.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from tools import cli_args
from tools.files import command_line

CONFIDENCE = 0.95
RESAMPLES = 10_000
METHODS = ("baseline", "greedy", "medusa")  # the base's own generate, our plain loop, ours with drafts


def clip_edits(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) of one clip after Whisper's normaliser."""
    import jiwer

    from tools.text_normalizer import normalize

    reference, hypothesis = normalize(reference), normalize(hypothesis)
    if not reference.split():
        return len(hypothesis.split()), 0
    out = jiwer.process_words(reference, hypothesis)
    return out.substitutions + out.deletions + out.insertions, len(reference.split())


def paired_clips(first: dict, second: dict, method: str) -> list[tuple[str, str, str]]:
    """(reference, first's text, second's text) for every clip both runs transcribed, matched by clip id."""
    texts = {clip["id"]: clip[method]["text"] for clip in second["clips"] if clip.get(method)}
    pairs = [(clip["reference"], clip[method]["text"], texts[clip["id"]]) for clip in first["clips"]
             if clip.get("reference") is not None and clip.get(method) and clip["id"] in texts]
    if len(pairs) < 2:
        raise SystemExit("the two results files share fewer than two clips with a reference (a bootstrap needs two): "
                         "are they runs on the same clips?")
    return pairs


def wer_difference(pairs: list[tuple[str, str, str]], resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Corpus WER of each run, their difference (second minus first, in points) and its paired bootstrap
    interval (percentile, ``CONFIDENCE``)."""
    from scipy.stats import bootstrap

    scored = [(*clip_edits(reference, a), clip_edits(reference, b)[0]) for reference, a, b in pairs]
    first, words, second = (np.array(column, dtype=float) for column in zip(*scored))

    def points(a, b, w, axis=-1):
        return 100 * (b.sum(axis=axis) - a.sum(axis=axis)) / w.sum(axis=axis)

    interval = bootstrap((first, second, words), points, paired=True, vectorized=True, n_resamples=resamples,
                         confidence_level=CONFIDENCE, method="percentile", random_state=seed).confidence_interval
    return {"clips": len(pairs), "words": int(words.sum()),
            "wer_first": float(first.sum() / words.sum()), "wer_second": float(second.sum() / words.sum()),
            "difference_points": float(points(first, second, words)),
            "interval_points": [float(interval.low), float(interval.high)], "confidence": CONFIDENCE,
            "resamples": resamples, "clips_transcribed_differently": int(sum(a != b for _, a, b in pairs)),
            "word_edits_first": int(first.sum()), "word_edits_second": int(second.sum())}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.wer_difference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", help="results.json of the reference run (e.g. the 16-bit base)")
    parser.add_argument("second", help="results.json of the run compared with it (e.g. the W4A16 base)")
    parser.add_argument("--method", choices=METHODS, default="baseline",
                        help="whose transcripts: the base's own generate (baseline), our plain loop or ours")
    parser.add_argument("--resamples", type=cli_args.positive_int, default=RESAMPLES)
    parser.add_argument("--out", required=True, help="JSON list of rows; a row for the same two files is replaced")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    from tools.benchmark_report import update_summary

    args = parse_args(argv)
    runs = [json.loads(Path(path).read_text()) for path in (args.first, args.second)]
    row = {"first": args.first, "second": args.second, "method": args.method,
           **wer_difference(paired_clips(*runs, args.method), args.resamples),
           "date": time.strftime("%Y-%m-%d"), "command": command_line("tools.wer_difference", argv)}
    update_summary(Path(args.out), row, key=("first", "second", "method"))
    print(f"WER {100 * row['wer_first']:.1f} % -> {100 * row['wer_second']:.1f} % on {row['words']} words: "
          f"{row['difference_points']:+.1f} points, {100 * CONFIDENCE:.0f} % interval "
          f"[{row['interval_points'][0]:+.1f}, {row['interval_points'][1]:+.1f}]")
    return row


if __name__ == "__main__":
    main()
