"""Render an artifact's model card, its results file and its speed-up plot from committed benchmark results.

    python -m pipeline.update_card heads/whisper-tiny.en --summary benchmarks/real_speech/summary.json
    python -m pipeline.update_card heads/whisper-base benchmarks/real_speech/gpu_base_auto/results.json
    python -m pipeline.update_card .        # the root: no trained heads, the shipped artifacts' rows

``--summary`` takes the summary's rows for this artifact (``draft="auto"``, without timestamps); each
``results.json`` (written by ``tools.benchmark``) adds its row or replaces the row it measured again. The rows,
each with the command that measured it, go to the artifact's ``results.json``; ``speedup.png`` is drawn from
them and ``README.md`` is rendered again. The fields that tell transformers how to load the artifact are written
as ``save_pretrained`` writes them today; heads, tree and training provenance are left as exported.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.collect import run_cli
from pipeline.model_card import compared_heads, render_model_card
from tools.files import replace_rows, write_atomic, write_json_atomic

ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE, PLOT_FILE = "results.json", "speedup.png"
RECIPE_COST = ROOT / "benchmarks" / "recipe" / "meralion2-3b_gpu.json"  # tools.recipe_cost at the 3B shape on a GPU
HEADS_COMPARED = ROOT / "benchmarks" / "heads_comparison" / "summary.json"  # tools.heads_summary: heads by base
HEADS_FILE = "medusa_heads.safetensors"


def read_rows(artifact: Path) -> list[dict]:
    path = artifact / RESULTS_FILE
    return json.loads(path.read_text(encoding="utf-8"))["rows"] if path.is_file() else []


def _heads_name(artifact: Path) -> str:
    """How the summary names this artifact: its path from the repository root (``heads/whisper-tiny.en``)."""
    resolved = artifact.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(artifact)


def summary_rows(summary: Path, heads: str) -> list[dict]:
    """The card's rows of a summary: this artifact's ``draft="auto"`` runs without timestamps."""
    rows = json.loads(summary.read_text(encoding="utf-8"))
    return [r for r in rows if r.get("heads") == heads and r.get("requested_draft") == "auto"
            and not r.get("timestamps")]


def merge_rows(rows: list[dict], new: list[dict]) -> list[dict]:
    """``rows`` with each of ``new`` added, replacing the row that measured the same thing."""
    from tools.benchmark_report import summary_key

    return sorted(replace_rows(rows, new, summary_key),
                  key=lambda r: (r["device"], str(r.get("gpu")), r.get("batch") or 1, r["date"]))


def result_row(path) -> dict:
    """A ``tools.benchmark`` results.json as one row, with the command that made it."""
    from tools.benchmark_report import summary_row

    results = json.loads(Path(path).read_text(encoding="utf-8"))
    return summary_row(results, results.get("settings", {}).get("command", ""))


def shipped_rows() -> list[dict]:
    """What the root card shows: of each base's own heads (``heads/<base>``, not the other folders such as
    ``heads/whisper-base-timestamps``), the newest batch-1 row on a CPU and on a GPU in each dtype (each artifact's
    own card keeps all of its rows)."""
    newest = {}
    for folder in sorted((ROOT / "heads").iterdir()):
        base = json.loads((folder / "config.json").read_text(encoding="utf-8"))["base_model_name_or_path"]
        if Path(base).name != folder.name:
            continue
        for r in read_rows(folder):
            key = (folder.name, r["device"], r["dtype"])
            if (r.get("batch") or 1) == 1 and (key not in newest or r["date"] >= newest[key]["date"]):
                newest[key] = r
    return list(newest.values())


def draw_speedup(rows: list[dict], path: Path) -> str | None:
    """Horizontal bars: each row's speed-up over the base's ``generate`` and over our own greedy loop; returns the
    plot's file name, or None where matplotlib is not installed (the MERaLiON-2 environment: a card without it)."""
    try:
        import matplotlib
    except ImportError:
        print(f"[update_card] no matplotlib: {path} not drawn (pip install matplotlib)", file=sys.stderr)
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.model_card import _device, row_name

    labels = [f"{row_name(r)}, {_device(r)}, {r['dtype']}" for r in rows]
    panels = (("speedup_vs_hf_generate", "× the base's generate (whole call)"),
              ("decode_speedup_vs_own_greedy", "× our own greedy loop (rounds)"))
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.45 * len(rows) + 1.2), sharey=True)
    for ax, (field, title) in zip(axes, panels):
        values = [r.get(field) or 0.0 for r in rows]
        ax.barh(range(len(rows)), values, color="#4c72b0")
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.2f}×", va="center", fontsize=8)
        ax.axvline(1.0, color="grey", linewidth=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlim(0, max(values) * 1.25)
        ax.tick_params(labelsize=8)
    axes[0].set_yticks(range(len(rows)), labels)
    axes[0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return Path(path).name


def write_results(folder: Path, rows: list[dict], command: str) -> None:
    """``folder``'s results.json (the rows and the command that gathered them) and the plot drawn from it."""
    write_json_atomic(Path(folder) / RESULTS_FILE, {"command": command, "rows": rows}, indent=1)


def recipe_cost() -> dict | None:
    """The committed GPU run of the head recipe at the 3B shape (the root card's cost sentence), if there is one."""
    return json.loads(RECIPE_COST.read_text(encoding="utf-8")) if RECIPE_COST.is_file() else None


def compared_section(artifact: Path, config: dict) -> str:
    """The card's comparison of the heads trained for its base, from the committed heads comparison ("" without)."""
    if not HEADS_COMPARED.is_file():
        return ""
    rows = json.loads(HEADS_COMPARED.read_text(encoding="utf-8"))["rows"]
    return compared_heads(rows, config.get("base_model_name_or_path", ""), _heads_name(artifact))


def update_card(artifact: Path, results: list[Path], summary: Path | None = None) -> list[dict]:
    """Write ``artifact``'s results.json, speedup.png and README.md; returns the card's rows."""
    config_path = artifact / "config.json"
    if not config_path.is_file():
        raise SystemExit(f"{artifact}: no config.json (pass an exported artifact folder)")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    trained = (artifact / HEADS_FILE).is_file()
    if trained:
        from modeling_medusa import loading_fields

        config.update(loading_fields(config["base_family"]))
        config.pop("benchmark", None)  # (the rows live in results.json)
        write_json_atomic(config_path, config, sort_keys=True)
        rows = summary_rows(summary, _heads_name(artifact)) if summary else read_rows(artifact)
        rows = merge_rows(rows, [result_row(p) for p in results])
        if rows and (results or summary):
            command = " ".join(["python -m pipeline.update_card", _heads_name(artifact)]
                               + [str(p) for p in results] + (["--summary", str(summary)] if summary else []))
            write_results(artifact, rows, command)
    else:
        rows = shipped_rows()
    plot = draw_speedup(rows, artifact / PLOT_FILE) if rows else None
    card = render_model_card(config, rows, plot, trained=trained, recipe_cost=None if trained else recipe_cost(),
                             compared=compared_section(artifact, config) if trained else "")
    write_atomic(artifact / "README.md", card)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.update_card", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", type=Path, help="artifact folder (holds config.json)")
    p.add_argument("results", nargs="*", type=Path, help="tools.benchmark results.json files")
    p.add_argument("--summary", type=Path, help="a summary.json whose rows for this artifact the card shows")
    args = p.parse_args(argv)
    rows = update_card(args.artifact, args.results, args.summary)
    print(f"[update_card] {args.artifact}: README.md with {len(rows)} benchmark rows")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
