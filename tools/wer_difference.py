"""How far apart two runs' word error rates are on the same clips, with a paired bootstrap interval: the clips are
resampled with replacement (each keeping both runs' transcripts), and the corpus WER difference is recomputed on
each resample. On a few hundred words a WER difference of a point or two is a handful of words, so the interval
says whether a bound such as "within 1 point" can be told apart from chance on these clips. ``--metric
tokens_per_pass`` does the same for the tokens a verify pass of two heads' runs (all clips' tokens over all their
rounds; the difference in per cent of the first): on 28 clips one round is about 1 %.

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


def paired_rounds(first: dict, second: dict) -> np.ndarray:
    """[4, clips]: each clip's emitted tokens and rounds in the first run, then in the second, matched by clip id."""
    stats = {clip["id"]: clip["medusa"]["stats"] for clip in second["clips"] if (clip.get("medusa") or {}).get("stats")}
    pairs = [(clip["medusa"]["stats"], stats[clip["id"]]) for clip in first["clips"]
             if (clip.get("medusa") or {}).get("stats") and clip["id"] in stats]
    if len(pairs) < 2:
        raise SystemExit("the two results files share fewer than two clips decoded with drafts (a bootstrap needs "
                         "two): are they runs of heads on the same clips?")
    return np.array([[pair[run][name] for pair in pairs] for run in (0, 1) for name in ("emitted_tokens", "row_rounds")],
                    dtype=float)


def pass_difference(counts: np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Tokens a pass of each run, the second's relative difference (%) and its paired bootstrap interval."""
    from scipy.stats import bootstrap

    def percent(tokens_a, rounds_a, tokens_b, rounds_b, axis=-1):
        per_pass_a = tokens_a.sum(axis=axis) / rounds_a.sum(axis=axis)
        return 100 * (tokens_b.sum(axis=axis) / rounds_b.sum(axis=axis) / per_pass_a - 1)

    interval = bootstrap(tuple(counts), percent, paired=True, vectorized=True, n_resamples=resamples,
                         confidence_level=CONFIDENCE, method="percentile", random_state=seed).confidence_interval
    return {"clips": counts.shape[1], "tokens_per_pass_first": float(counts[0].sum() / counts[1].sum()),
            "tokens_per_pass_second": float(counts[2].sum() / counts[3].sum()),
            "difference_percent": float(percent(*counts)), "interval_percent": [float(interval.low), float(interval.high)],
            "confidence": CONFIDENCE, "resamples": resamples, "rounds_first": int(counts[1].sum()),
            "rounds_second": int(counts[3].sum())}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.wer_difference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", help="results.json of the reference run (e.g. the 16-bit base)")
    parser.add_argument("second", help="results.json of the run compared with it (e.g. the W4A16 base)")
    parser.add_argument("--metric", choices=("wer", "tokens_per_pass"), default="wer",
                        help="the word error rate, or the tokens a verify pass of two heads' runs")
    parser.add_argument("--method", choices=METHODS, default="baseline",
                        help="whose transcripts for --metric wer: the base's own generate (baseline), our plain "
                             "loop or ours")
    parser.add_argument("--resamples", type=cli_args.positive_int, default=RESAMPLES)
    parser.add_argument("--out", required=True, help="JSON list of rows; a row for the same two files is replaced")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    from tools.benchmark_report import update_summary

    args = parse_args(argv)
    runs = [json.loads(Path(path).read_text()) for path in (args.first, args.second)]
    if args.metric == "tokens_per_pass":
        row = {"first": args.first, "second": args.second, "metric": args.metric,
               **pass_difference(paired_rounds(*runs), args.resamples)}
        low, high = row["interval_percent"]
        summary = (f"{row['tokens_per_pass_first']:.2f} -> {row['tokens_per_pass_second']:.2f} tokens a pass on "
                   f"{row['clips']} clips: {row['difference_percent']:+.1f} %, {100 * CONFIDENCE:.0f} % interval "
                   f"[{low:+.1f}, {high:+.1f}]")
    else:
        row = {"first": args.first, "second": args.second, "method": args.method,
               **wer_difference(paired_clips(*runs, args.method), args.resamples)}
        low, high = row["interval_points"]
        summary = (f"WER {100 * row['wer_first']:.1f} % -> {100 * row['wer_second']:.1f} % on {row['words']} words: "
                   f"{row['difference_points']:+.1f} points, {100 * CONFIDENCE:.0f} % interval [{low:+.1f}, {high:+.1f}]")
    row.update(date=time.strftime("%Y-%m-%d"), command=command_line("tools.wer_difference", argv))
    update_summary(Path(args.out), row, key=("first", "second", "method", "metric"))
    print(summary)
    return row


if __name__ == "__main__":
    main()
