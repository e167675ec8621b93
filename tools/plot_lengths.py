#!/usr/bin/env python
"""Speed-up per clip against its output length, from benchmark results (``tools.benchmark``'s results.json).

    python -m tools.plot_lengths benchmarks/real_speech/gpu_tiny.en_auto/results.json \
        benchmarks/real_speech/cpu_tiny.en_auto/results.json --out benchmarks/real_speech/speedup_vs_length.png

Two panels, one point per clip and a colour per run: the rounds alone against our own plain-greedy loop (what the
drafts buy) and the whole call against the base's own ``generate`` (what a user sees). Writes the PNG and, beside
it, a JSON with the command and the runs drawn. ``tools.benchmark`` draws each run's own figure the same way.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

from tools.files import command_line, write_atomic, write_json_atomic

PANELS = (("decode_speedup_vs_own_greedy", "rounds vs our own greedy loop"),
          ("speedup", "whole call vs the base's generate"))


def run_label(results: dict) -> str:
    settings, environment = results.get("settings") or {}, results.get("environment") or {}
    model = Path(str(settings.get("model", "model"))).name
    device = "GPU" if str(environment.get("device", "")).startswith("cuda") else "CPU"
    drafts = sorted({c.get("draft_ran") for c in results["clips"] if c.get("draft_ran")})
    dtype = settings.get("dtype") or environment.get("dtype", "")
    return f"{model}, {device}, {dtype}, {'/'.join(drafts) or settings.get('draft')}"


def draw(runs: list[dict], path: Path) -> str | None:
    """Both panels for ``runs`` (results dicts) into ``path``; returns why it was skipped, or None when written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "matplotlib is not installed"
    fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 4.2), sharex=True)
    for ax, (key, title) in zip(axes, PANELS):
        for results in runs:
            clips = [c for c in results["clips"] if c.get(key) is not None]
            ax.scatter([c["tokens"] for c in clips], [c[key] for c in clips], s=18, alpha=0.75,
                       label=run_label(results))
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        times = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}x")
        ax.yaxis.set_major_formatter(times)
        ax.yaxis.set_minor_formatter(times)
        ax.set_xlabel("output tokens of the clip (incl. EOS)")
        ax.set_ylabel("speed-up")
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle("Speed-up per clip against output length (batch size 1)", fontsize=11)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.plot_lengths", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="results.json files written by tools.benchmark")
    p.add_argument("--out", required=True, help="the PNG to write (its JSON record goes beside it)")
    args = p.parse_args(argv)
    runs = []
    for name in args.results:
        try:
            runs.append(json.loads(Path(name).read_text()))
        except (OSError, ValueError) as err:
            raise SystemExit(f"{name}: not a readable results.json ({err})") from None
    out = Path(args.out)
    skipped = draw(runs, out)
    if skipped:
        raise SystemExit(f"no figure: {skipped} (pip install matplotlib)")
    write_json_atomic(out.with_suffix(".json"), {"command": command_line("tools.plot_lengths", argv),
                                                 "figure": out.name, "runs": [
        {"results": name, "label": run_label(results), "clips": len(results["clips"])}
        for name, results in zip(args.results, runs)]}, indent=1)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
