"""Train head variants on the same collected data and compare them on the same held-out speech.

    python -m pipeline.compare_heads --base openai/whisper-tiny.en --data work_data/collect \\
        --eval-data work_data/collect_real --out work_data/compare [--variants medusa,path-speech] [--epochs 8]

Each variant is one ``pipeline.train`` run into ``OUT/<variant>`` (resumable like any run); afterwards the
held-out split of the training data gives per-head top-1/top-5 accuracy, and every ``--eval-data`` set
(e.g. real human speech, collected with the same base) gives the tokens per round of the chain and of the
trees, replayed exactly (``pipeline.acceptance``). Writes ``OUT/comparison.json`` and ``OUT/comparison.md``.
Variants trained elsewhere (e.g. by ``pipeline.train`` on a GPU) are tabulated from their own ``metrics.json``
without training: ``--runs path-speech=A/metrics.json path-speech-2l=B/metrics.json --out OUT``.
"""

from __future__ import annotations

import argparse
import os
import sys

from pipeline.collect import run_cli
from tools import cli_args
from tools.files import command_line, write_atomic, write_json_atomic
from tools.markdown import markdown_table

PATH_SPEECH = ["--head-kind", "path", "--speech-attention", "--soft-labels", "0.5", "--draft-vocab", "8192"]
# name -> pipeline.train options; "medusa" is the earliest recipe, "path-speech" the shipped heads'
VARIANTS = {
    "medusa": [],
    "medusa-soft": ["--soft-labels", "0.5", "--draft-vocab", "8192"],
    "path": ["--head-kind", "path", "--soft-labels", "0.5", "--draft-vocab", "8192"],
    "path-speech": PATH_SPEECH,
    "path-speech-2l": PATH_SPEECH + ["--layers", "2"],
    "path-speech-3l": PATH_SPEECH + ["--layers", "3"],
    "path-speech-prefix": PATH_SPEECH + ["--prefix-attention"],  # Hydra++'s prefix attention (replay only)
    "path-speech-teacher": PATH_SPEECH + ["--soft-labels", "1.0"],  # the base's distribution only
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.compare_heads", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", help="the base to train on (required unless --runs)")
    cli_args.add_trust_base_code(p)
    p.add_argument("--data", action="append", default=[],
                   help="collect folder to train on (with --speech for speech variants); repeatable")
    p.add_argument("--eval-data", action="append", default=[], help="collect folder(s) to replay on; repeatable")
    p.add_argument("--out", default="work_data/compare")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--epochs", type=cli_args.AsText(cli_args.positive_int), default="8")
    p.add_argument("--batch-size", type=cli_args.AsText(cli_args.positive_int), default="32")
    p.add_argument("--lr", type=cli_args.AsText(cli_args.positive_float), default="2e-3")
    p.add_argument("--init-heads", default=None,
                   help="fine-tune every variant from these trained heads (pipeline.train --init-heads)")
    p.add_argument("--draft-vocab", type=cli_args.AsText(cli_args.non_negative_int), default=None,
                   help="the draft vocabulary size instead of the variants' 8192 (added to --init-heads' own)")
    p.add_argument("--device", default=None)
    p.add_argument("--keep-going", action="store_true", help="report a failing variant and go on with the next")
    p.add_argument("--runs", nargs="+", default=[], metavar="VARIANT=METRICS",
                   help="tabulate runs already trained instead of training: each variant's metrics.json")
    return p


def train_args(args, name: str) -> list[str]:
    common = ["--base", args.base, *[x for d in args.data for x in ("--data", d)], "--out", os.path.join(args.out, name),
              "--epochs", args.epochs, "--batch-size", args.batch_size, "--lr", args.lr]
    common += [x for d in args.eval_data for x in ("--eval-data", d)]
    common += ["--trust-base-code"] if args.trust_base_code else []
    common += ["--device", args.device] if args.device else []
    own = (["--init-heads", args.init_heads] if args.init_heads else []) + (
        ["--draft-vocab", args.draft_vocab] if args.draft_vocab is not None else [])
    return common + VARIANTS[name] + own  # (the last of a repeated option counts)


COMPARISON_FIELDS = ("variant", "options", "head_kind", "layers", "speech_attention", "draft_vocab_size", "top1", "top5",
                     "held_out", "train_args")


def comparison_row(name: str, metrics: dict) -> dict:
    acc = metrics["head_accuracy"]
    row = {"variant": name, "options": " ".join(VARIANTS[name]) or "(today's recipe)",
           "head_kind": metrics.get("head_kind", "medusa"), "layers": metrics.get("layers"),
           "speech_attention": metrics.get("speech_attention", False),
           "draft_vocab_size": metrics.get("draft_vocab_size"),
           "top1": acc["top1"], "top5": acc["top5"],
           "held_out": {c["name"]: c["tokens_per_round"] for c in metrics.get("draft_candidates", [])},
           "train_args": metrics.get("train_args")}
    for eval_name, rows in (metrics.get("eval_replay") or {}).items():
        row[eval_name] = {c["name"]: c["tokens_per_round"] for c in rows}
    return row


def render(rows: list[dict], eval_names: list[str]) -> str:
    header = (["variant", "training", "top-1 per head (held out)", "top-5 per head"]
              + [f"tokens/round on {n}: chain / 32 nodes / best tree" for n in ["held out"] + eval_names])
    return markdown_table(header, [_comparison_cells(row, eval_names) for row in rows]) + "\n"


def _comparison_cells(row: dict, eval_names: list[str]) -> list[str]:
    cells = [row["variant"], _training_cell(row.get("train_args") or {}),
             " / ".join(f"{a:.3f}" for a in row["top1"]), " / ".join(f"{a:.3f}" for a in row["top5"])]
    for key in ["held_out"] + eval_names:
        found = row.get(key) or {}
        chain = next((v for k, v in found.items() if k.startswith("chain")), None)
        tree_32 = found.get("tree of 32 nodes")
        best = max(((v, k) for k, v in found.items()), default=(None, None))
        cells.append(f"{chain:.3f} / {'n/a' if tree_32 is None else f'{tree_32:.3f}'} / {best[0]:.3f} ({best[1]})"
                     if chain is not None else "n/a")
    return cells


def _training_cell(train_args: dict) -> str:
    """What tells runs of one variant apart: learning rate, epochs, layers and the heads they started from."""
    parts = [f"lr {train_args['lr']:g}" if "lr" in train_args else "",
             f"{train_args['epochs']} epochs" if "epochs" in train_args else "",
             f"{train_args['layers']} layers" if train_args.get("layers", 1) != 1 else "",
             "from given heads" if train_args.get("init_heads") else ""]
    return ", ".join(p for p in parts if p)


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    from pipeline import train

    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    if args.runs:
        return tabulate_runs(args, argv)
    if not args.base or not args.data:
        raise SystemExit("--base and --data are required to train variants (or tabulate trained ones with --runs)")
    rows = []
    for name in names:
        print(f"[compare] {name}: pipeline.train {' '.join(train_args(args, name))}", flush=True)
        try:
            metrics = train.main(train_args(args, name))
        except (SystemExit, RuntimeError, ValueError) as err:
            if not args.keep_going:
                raise
            print(f"[compare] {name} failed: {err}", file=sys.stderr)
            continue
        rows.append(comparison_row(name, metrics))
        write_comparison(args.out, argv, rows)  # (after each variant: a stopped run keeps the finished ones)
    write_comparison(args.out, argv, rows, [os.path.basename(os.path.normpath(d)) for d in args.eval_data])
    return {"rows": rows}


def write_comparison(out: str, argv, rows: list[dict], eval_names: list[str] | None = None) -> None:
    """OUT/comparison.json, and with ``eval_names`` the table OUT/comparison.md (also printed)."""
    write_json_atomic(os.path.join(out, "comparison.json"), {"command": command_line("pipeline.compare_heads", argv),
                                                             "rows": rows})
    if eval_names is not None:
        write_atomic(os.path.join(out, "comparison.md"), render(rows, eval_names))
        print(render(rows, eval_names))


def tabulate_runs(args, argv) -> dict:
    """The comparison of variants ``pipeline.train`` already trained: VARIANT=METRICS pairs."""
    import json

    rows = []
    for spec in args.runs:
        name, _, path = spec.partition("=")
        if name not in VARIANTS or not path:
            raise SystemExit(f"--runs {spec!r}: give VARIANT=METRICS_JSON with VARIANT from {', '.join(VARIANTS)}")
        with open(path) as f:
            metrics = json.load(f)
        rows.append(comparison_row(name, metrics))
    write_comparison(args.out, argv, rows,
                     list(dict.fromkeys(name for row in rows for name in row if name not in COMPARISON_FIELDS)))
    return {"rows": rows}


if __name__ == "__main__":
    sys.exit(run_cli(main))
