"""Rows of ``benchmarks/heads_comparison/summary.json``: what a set of heads buys, per language, from
``tools.benchmark`` runs (one row per results.json).

    python -m tools.heads_summary --results benchmarks/heads_comparison/whisper-base/multilingual/*/results.json \\
        --summary benchmarks/heads_comparison/summary.json

Each row: ``{variant, base, language, language_forced, timestamps, draft, eval_set, clips, tokens_per_pass,
exact_match_rate, divergent_rows_at_base_near_ties (bfloat16: rows that part from the base only where its top two
were within bf16 resolution), gpu_speedup_vs_own_greedy, cpu_speedup_vs_own_greedy, training_gpu_minutes, wer, command,
results}``. ``language`` is the clips' language: the run's ``--language`` where it forced one, else the manifest
rows' ``language`` field, else ``--default-language``; a run over a manifest of several languages (language
detected per clip) gives one row per language, aggregated from its clips. The speed-up is end to end
(prefill included) against our own loop without drafts, on the run's device (the other device's field is null);
``command`` is the benchmark's command. A row replaces an earlier one with the same key (variant, base,
language, language_forced, timestamps, draft, eval_set).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools import cli_args
from tools.files import command_line, write_json_atomic

KEY = ("variant", "base", "language", "language_forced", "timestamps", "draft", "eval_set")
SOURCE_KEY = ("results", "language", "timestamps")  # one results file holds one row a language


class SummaryError(ValueError):
    pass


def manifest_languages(path: Path) -> dict[str, str | None]:
    """Clip id -> the ``language`` its manifest row names (None where it names none); {} without the file."""
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {str(row["id"]): row.get("language") for row in rows}


def clip_group_summary(clips: list[dict]) -> dict:
    """The summary fields a row reads, over some clips of a run: tokens per pass = emitted tokens / verify
    passes, the speed-up = our greedy's summed latency / Medusa's (as tools.benchmark sums them)."""
    from tools.benchmark_report import corpus_wer

    stats = [c["medusa"]["stats"] for c in clips]
    passes = sum(st["row_rounds"] or 0 for st in stats)
    medusa = sum(c["medusa"]["latency_ms_median"] for c in clips)
    greedy = sum(c["greedy"]["latency_ms_median"] for c in clips)
    return {"clips": len(clips), "mean_accepted_per_round": sum(st["emitted_tokens"] for st in stats) / passes if passes else None,
            "exact_match_rate": sum(bool(c["exact_match"]) for c in clips) / len(clips),
            "e2e_speedup_vs_own_greedy": greedy / medusa if medusa else None, "draft_ran": clips[0].get("draft_ran"),
            "baseline_wer": corpus_wer([c.get("reference") for c in clips], [c["baseline"]["text"] for c in clips])}


def rows_of_run(results: dict, results_path: str, languages: dict[str, str | None], default_language: str | None,
                config: dict | None = None, training_gpu_minutes: float | None = None) -> list[dict]:
    """One row for a run over one language; one per language for a run over several (never forced)."""
    found = sorted({lang for lang in languages.values() if lang})
    if len(found) <= 1:
        return [summary_row(results, results_path, found[0] if found else None, default_language, config,
                            training_gpu_minutes)]
    if results["settings"].get("language"):
        raise SummaryError(f"{results_path}: one --language forced on clips of {found}")
    rows = []
    for language in found:
        clips = [c for c in results["clips"] if languages.get(str(c["id"])) == language]
        if clips:
            part = {**results, "summary": clip_group_summary(clips)}
            rows.append(summary_row(part, results_path, language, None, config, training_gpu_minutes))
    return rows


def variant_name(settings: dict, config: dict | None) -> str:
    """The heads' folder and recipe, e.g. ``heads/whisper-base (path-speech, 1 layer)``."""
    config = config or {}
    kind = config.get("head_kind", "medusa") + ("-speech" if config.get("speech_attention") else "")
    layers = config.get("medusa_num_layers", settings.get("medusa_num_layers"))
    return f"{settings['model']} ({kind}, {layers} layer{'s' if layers != 1 else ''})"


def heads_folder(row: dict) -> str:
    """A row's heads without their recipe (``variant_name``'s folder), e.g. ``heads/whisper-base``."""
    return row["variant"].split(" (")[0]


def base_name(row: dict) -> str:
    """A row's base by its last name, whether it was given as a Hub id or a local folder (``whisper-base``)."""
    return Path(row["base"]).name


def summary_row(results: dict, results_path: str, manifest_lang: str | None, default_language: str | None,
                config: dict | None = None, training_gpu_minutes: float | None = None) -> dict:
    settings, stats = results["settings"], results["summary"]
    forced = settings.get("language")
    language = forced or manifest_lang or default_language
    if language is None:
        raise SummaryError(f"{results_path}: no --language, no language in its manifest; pass --default-language")
    speedup = stats.get("e2e_speedup_vs_own_greedy")
    on_gpu = str(results.get("environment", {}).get("device", settings.get("device", "cpu"))).startswith("cuda")
    return {"variant": variant_name(settings, config), "base": settings.get("base_model_declared") or settings["base_model"],
            "language": language, "language_forced": forced is not None, "timestamps": bool(settings.get("timestamps")),
            "draft": stats.get("draft_ran") or settings.get("draft"), "eval_set": settings["manifest"],
            "clips": stats["clips"], "tokens_per_pass": _rounded(stats.get("mean_accepted_per_round")),
            "exact_match_rate": stats.get("exact_match_rate"),
            "divergent_rows_at_base_near_ties": stats.get("divergent_rows_at_base_near_ties"),
            "gpu": results.get("environment", {}).get("device_name") if on_gpu else None,
            "gpu_speedup_vs_own_greedy": _rounded(speedup) if on_gpu else None,
            "cpu_speedup_vs_own_greedy": None if on_gpu else _rounded(speedup),
            "training_gpu_minutes": training_gpu_minutes, "wer": _rounded(stats.get("baseline_wer")),
            "command": settings["command"], "results": results_path}


def latest_rows(rows: list[dict]) -> list[dict]:
    """One row per heads, base, language, timestamp setting and device kind: the last added (a heads measured again
    with another draft shows that measurement only), in the order the first of each came. Heads are told apart by
    their folder's name, as the tables name them: heads shipped as ``heads/X`` supersede the ``.../X`` they were
    exported to before."""
    latest = {}
    for row in rows:
        heads = Path(heads_folder(row)).name
        latest[(heads, base_name(row), row["language"], row["timestamps"], bool(row.get("gpu")))] = row
    return list(latest.values())


def _rounded(value, digits: int = 4):
    return None if value is None else round(float(value), digits)


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with each ``new`` row replacing the one of the same key, or the one read from the same results file
    (measured again, e.g. from the heads' new folder), or appended; order kept."""
    rows = list(old)
    for row in new:
        key, source = tuple(row.get(k) for k in KEY), tuple(row.get(k) for k in SOURCE_KEY)
        at = next((i for i, r in enumerate(rows)
                   if tuple(r.get(k) for k in KEY) == key or tuple(r.get(k) for k in SOURCE_KEY) == source), None)
        if at is None:
            rows.append(row)
        else:
            rows[at] = row
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.heads_summary", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", nargs="+", required=True, type=Path, help="tools.benchmark results.json files")
    p.add_argument("--summary", type=Path, default=Path("benchmarks/heads_comparison/summary.json"))
    p.add_argument("--default-language", default=None,
                   help="the clips' language where neither the run nor the manifest names one (e.g. en)")
    p.add_argument("--training-gpu-minutes", type=cli_args.non_negative_float, default=None,
                   help="GPU minutes the heads took to train, where recorded (default: null)")
    p.add_argument("--heads", type=Path, default=None,
                   help="the heads' folder here, where the runs named another (a lent machine's copy): its path names "
                        "the variant and its config.json the recipe")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    new = []
    try:
        for path in args.results:
            results = json.loads(path.read_text(encoding="utf-8"))
            if args.heads:
                results["settings"].update(model=str(args.heads), model_folder=str(args.heads))
            settings = results["settings"]
            config_path = Path(settings.get("model_folder", settings["model"])) / "config.json"
            config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else None
            new += rows_of_run(results, str(path), manifest_languages(Path(settings["manifest"])),
                               args.default_language, config, args.training_gpu_minutes)
    except (SummaryError, KeyError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    old = json.loads(args.summary.read_text(encoding="utf-8"))["rows"] if args.summary.is_file() else []
    rows = merge_rows(old, new)
    write_json_atomic(args.summary, {"command": command_line("tools.heads_summary", argv), "rows": rows},
                      ensure_ascii=False)
    for row in new:
        print(f"{row['language']:>3} forced={row['language_forced']!s:5} ts={row['timestamps']!s:5} "
              f"{row['draft']:>8} clips={row['clips']:3d} tokens/pass={row['tokens_per_pass']} "
              f"exact={row['exact_match_rate']} cpu_speedup={row['cpu_speedup_vs_own_greedy']}")
    print(f"{len(rows)} rows -> {args.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
