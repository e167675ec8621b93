"""docs/RESULTS.md: every committed benchmark summary as tables, each row with its date, and the commands.

    python -m tools.results_tables --out docs/RESULTS.md

Reads only committed result files (``benchmarks/**/summary.json`` and the other result JSON that record their
command), so every figure in the page comes from a file and the command that wrote it. The history of the
measurements and of their discussion lives in git.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tools.benchmark_report import device_label as _device, gap_cell
from tools.compare_segments import recording_kind
from tools.heads_summary import base_name, heads_folder, latest_rows
from tools.files import write_atomic
from tools.markdown import markdown_table, number_cell

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

INTRO = """# Results

Rendered from the committed result files (`python -m tools.results_tables`); each records its command.
*Tokens per round*: tokens one draft-and-verify round emits.
*× own greedy*: against our loop decoding one token per pass (*rounds*: the decoding loop only). *× `generate`*:
the whole call against the base's greedy `generate`. *Exact*: rows whose ids equal the base's greedy ids; in
bfloat16 the others part at a base near-tie (its two best scores within bfloat16's rounding)."""


def _ratio(value) -> str:
    return number_cell(value, 2, "×")


def _with_rounds(call, rounds) -> str:
    """A whole call's speed-up with, in brackets, the decoding loop's."""
    return " ".join(filter(None, (_ratio(call), f"({_ratio(rounds)})" if rounds is not None else "")))


def _rate(value) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


def real_speech(rows: list[dict]) -> str:
    """The real-speech rows; an ``auto`` row run beside fixed drafts says how much slower it ran than the fastest
    of them, and those drafts' rows follow in one line per run (``side_by_side``)."""
    beside = [r for r in rows if _beside_auto(r, rows)]
    header = ["model", "device", "dtype", "draft (ran; auto: vs the fastest fixed)", "rounds", "batch", "tokens per round",
              "× `generate`", "× own greedy (rounds)", "exact", "WER", "date"]
    body = [[r["model"], _device(r), r["dtype"],
             f"{r['requested_draft']} ({r['draft']})" + (", timestamps" if r.get("timestamps") else "")
             + (f"; {gap_cell(r)}" if gap_cell(r) else ""),
             r["rounds_mode"], r.get("batch") or 1, number_cell(r["mean_accepted_per_round"]),
             _ratio(r.get("speedup_vs_hf_generate")),
             _with_rounds(r.get("e2e_speedup_vs_own_greedy"), r.get("decode_speedup_vs_own_greedy")),
             _rate(r["exact_match_rate"]), _rate(r.get("wer_ours")),
             r["date"]] for r in rows if r not in beside]
    return markdown_table(header, body) + (side_by_side(rows, beside) if beside else "")


def _beside_auto(row: dict, rows: list[dict]) -> bool:
    """Whether ``row`` is a fixed draft measured in the same run as an ``auto`` row that compares itself with it."""
    return row["requested_draft"] != "auto" and any(
        r.get("best_fixed_draft") and r["command"] == row["command"] and r["requested_draft"] == "auto" for r in rows)


def side_by_side(rows: list[dict], beside: list[dict]) -> str:
    """One line per run of several drafts: each fixed draft's × ``generate`` (its own row is in summary.json)."""
    runs = [a for a in rows if a["requested_draft"] == "auto" and any(r["command"] == a["command"] for r in beside)]
    body = [[a["model"], _device(a), a["dtype"], a["rounds_mode"], a.get("batch") or 1, ", ".join(
        f"{r['requested_draft']} {_ratio(r.get('speedup_vs_hf_generate'))}" for r in beside
        if r["command"] == a["command"])] for a in runs]
    return ("\n\nThe fixed drafts timed beside `auto` in the same run (× `generate`):\n\n"
            + markdown_table(["model", "device", "dtype", "rounds", "batch", "fixed drafts"], body))


def quantised(rows: list[dict]) -> str:
    header = ["model", "precision", "kernel", "device", "batch", "draft (ran)", "rounds", "tokens per round",
              "× own greedy (rounds)", "tok/s", "exact", "WER"]
    body = [[r["model"], r["precision"], _short(r["kernel"]), _device(r), r.get("batch") or 1,
             f"{r['requested_draft']} ({r['draft']})", r.get("rounds_mode") or "",
             number_cell(r.get("mean_accepted_per_round")),
             _with_rounds(r.get("speedup_vs_own_greedy"), r.get("decode_speedup_vs_own_greedy")),
             number_cell(r.get("tokens_per_s"), 0),
             _rate(r.get("exact_match_rate")), _rate(r.get("wer"))] for r in rows]
    return markdown_table(header, body)


def _short(kernel: str) -> str:
    """A kernel's name without its notes ("aten._weight_int4pack_mm (tinygemm), group 128" -> its first part)."""
    return kernel.split(" (")[0].split(",")[0].split(" on ")[0]


SHOWN_METHODS = ("ours", "ours_greedy", "hf_static")  # (the library's dynamic-cache rows stay in the JSON)


def gpu_decode(summary: dict) -> str:
    """A row per shown measurement; the exact column only where some row is not (or not known to be) exact."""
    rows = shown_decode_rows(summary["decode"])
    header = ["shape", "batch", "method", "draft", "new tokens", "tok/s a call", "tok/s in the rounds",
              "tokens per round"]
    body = [[r["shape"], r.get("batch", 1), ", ".join(filter(None, (r["method"], r.get("rounds_mode")))),
             r.get("draft", ""),
             r.get("new_tokens", ""), number_cell(r.get("call_tok_per_s"), 0), number_cell(r.get("loop_tok_per_s"), 0),
             number_cell(r.get("tokens_per_round"))] for r in rows]
    if not _all_exact(summary):
        header.append("exact")
        for line, r in zip(body, rows):
            line.append({True: "yes", False: "no"}.get(_exact(r), ""))
    return markdown_table(header, body)


def _exact(row: dict):
    return row.get("exact", row.get("matches_our_greedy"))


def _all_exact(summary: dict) -> bool:
    return all(_exact(r) is True for r in shown_decode_rows(summary["decode"]))


def shown_decode_rows(rows: list[dict]) -> list[dict]:
    """The rows of ``SHOWN_METHODS``, less those run as CUDA graphs where the same measurement was also compiled
    (they stay in the JSON)."""
    def measurement(r):
        return r["shape"], r.get("batch", 1), r["method"], r.get("draft"), r.get("new_tokens")

    compiled = {measurement(r) for r in rows if r.get("rounds_mode") == "compiled"}
    return [r for r in rows if r["method"] in SHOWN_METHODS
            and not (r.get("rounds_mode") == "graph" and measurement(r) in compiled)]


def _hides_graph_rows(summary: dict) -> bool:
    shown = shown_decode_rows(summary["decode"])
    return any(r["method"] in SHOWN_METHODS and r not in shown for r in summary["decode"])


def gpu_verify(summary: dict) -> str:
    """Milliseconds of one verify pass: a row per shape and tokens verified, a column per method."""
    methods = list(dict.fromkeys(r["method"] for r in summary["verify"]))
    cells = {(r["shape"], r["tokens"], r["method"]): r["ms"] for r in summary["verify"]}
    keys = list(dict.fromkeys((r["shape"], r["tokens"]) for r in summary["verify"]))
    floor = summary.get("floor_ms", {})
    return markdown_table(["shape", "tokens verified", "floor ms", *methods],
                          [[shape, tokens, number_cell(floor.get(shape)),
                            *(number_cell(cells.get((shape, tokens, m))) for m in methods)] for shape, tokens in keys])


def cpu_peers(rows: list[dict]) -> str:
    """A row per system, for each model its speed-up over ``generate``, WER and share of ``generate``'s texts."""
    models = list(dict.fromkeys((r["model"], r.get("language")) for r in rows))  # (a run told the language)
    cells = {(r["model"], r.get("language"), r["system"]): r for r in rows}

    def same_text(row) -> str:
        bfloat16 = row.get("exact_vs_bfloat16_base")
        return _rate(row["exact_vs_float32_base"]) + ("" if bfloat16 is None else f" ({_rate(bfloat16)} of bf16's)")

    def of(model, system) -> list:
        row = cells.get((*model, system))
        return ["", "", ""] if row is None else [_ratio(row["speedup_vs_hf_generate"]), _rate(row["wer"]),
                                                 same_text(row)]

    def name(model) -> str:
        short = model[0].rsplit('/', 1)[-1].removeprefix('whisper-')
        return f"{short} ({model[1]})" if model[1] else short

    header = ["system"] + [f"{name(m)} {column}" for m in models for column in ("× `generate`", "WER", "same text")]
    systems = dict.fromkeys(r["system"] for r in rows)
    return markdown_table(header, [[system] + [c for m in models for c in of(m, system)] for system in systems])


def heads_by_language(rows: list[dict], device: str = "cpu") -> str:
    """A table per base, a row per language and timestamp setting, a column per heads: tokens per verify pass
    (speed-up over our own greedy on ``device``) (rows of the other device left out; a cell names an exact match
    below 100 % and the bf16 near-ties among the divergences; the section's text names the drafts). Where the base's
    shipped heads (``heads/<base>``) are among them, a last row gives each other heads' English against theirs."""
    rows = [r for r in rows if bool(r.get("gpu")) == (device == "gpu")]
    bases = dict.fromkeys(base_name(r) for r in rows)
    return "\n\n".join(_language_table([r for r in rows if base_name(r) == base], device, f"heads/{base}")
                       for base in bases)


def _language_table(rows: list[dict], device: str, shipped: str) -> str:
    field = f"{device}_speedup_vs_own_greedy"
    heads = list(dict.fromkeys(heads_folder(r) for r in rows))
    cases = list(dict.fromkeys((r["language"], r["timestamps"], r["clips"]) for r in rows))
    found = {(heads_folder(r), r["language"], r["timestamps"]): r for r in rows}

    def exact(r):
        if r["exact_match_rate"] == 1:
            return []
        ties = r.get("divergent_rows_at_base_near_ties")
        return [_rate(r["exact_match_rate"]) + (" exact, others near-ties" if ties and ties == _divergent(r) else " exact")]

    def cell(head, case):
        r = found.get((head, case[0], case[1]))
        if r is None:
            return ""
        notes = ([_ratio(r[field])] if r[field] else []) + exact(r)
        return f"{r['tokens_per_pass']:.2f}" + (f" ({'; '.join(notes)})" if notes else "")

    body = [[case[0] + (", timestamps" if case[1] else ""), case[2]] + [cell(h, case) for h in heads]
            for case in cases]
    english = {h: found[(h, "en", False)]["tokens_per_pass"] for h in heads if (h, "en", False) in found}
    if shipped in english and len(english) > 1:
        body.append([f"English against `{shipped}`", ""] + [
            f"{english[h] / english[shipped] - 1:+.1%}" if h in english and h != shipped else "" for h in heads])
    return markdown_table(["language", "clips"] + [f"`{h}`" for h in heads], body)


def long_form(runs: list[dict]) -> str:
    """A row per recording and condition: seconds for ours, the base's long-form ``generate`` and faster-whisper,
    ours against the base (× and whether the ids are equal), our tokens per round."""
    body, all_equal = [], _all_equal_ids(runs)
    for run in runs:
        for condition, rows in run["conditions"].items():
            ours, base, peer = rows["ours"], rows["base"], rows.get("faster-whisper", {})
            seconds = " / ".join(number_cell(r.get("seconds")) for r in (ours, base, peer))
            equal = "" if all_equal else (", same ids" if ours.get("ids_equal_base") else ", other ids")
            body.append([run["model"].rsplit("/", 1)[-1].removeprefix("whisper-"),
                         f"{run['seconds_of_audio']:.0f} s, {condition}", seconds,
                         f"{_ratio(base['seconds'] / ours['seconds'])}{equal}",
                         number_cell(ours.get("mean_accepted_per_round"))])
    return markdown_table(["model", "recording", "seconds: ours / `generate` / faster-whisper", "× `generate`",
                           "tokens per round"], body)


def _all_equal_ids(runs: list[dict]) -> bool:
    return all(rows["ours"].get("ids_equal_base") for run in runs for rows in run["conditions"].values())


def _sentence(text: str) -> str:
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if not text or text.endswith(".") else ".")


def _divergent(row: dict) -> int:
    return round((1 - row["exact_match_rate"]) * row["clips"])


def _dates_and_cpus(rows: list[dict]) -> str:
    return ", ".join([*dict.fromkeys(r["cpu"] for r in rows), *sorted({r["date"] for r in rows})])


LENT_HOST_PATH = re.compile(r"(^| )/(tmp|root)/")  # a command run on a lent GPU host, its files in its /tmp


def _commands(commands) -> str:
    """The commands that ran in this repository; a lent GPU host's (its files in its /tmp) stay in their rows."""
    unique = list(dict.fromkeys(c for c in commands if c and not LENT_HOST_PATH.search(c)))
    return "```bash\n" + "\n".join(unique) + "\n```" if unique else ""


def _load(relative: str):
    return json.loads((BENCHMARKS / relative).read_text(encoding="utf-8"))


def _command_of(data) -> str | None:
    if isinstance(data, dict):
        for holder in (data, data.get("settings"), data.get("environment")):
            if isinstance(holder, dict) and isinstance(holder.get("command"), str):
                return holder["command"]
    return None


def other_files(shown: set[Path]) -> str:
    """Every other committed result file that records its command, counted by folder (under ``benchmarks/``),
    with the dates they say; the program and full command are in each file."""
    folders = {}
    for path in sorted(BENCHMARKS.rglob("*.json")):
        if (path in shown or BENCHMARKS / "real_speech" in path.parents[1:]
                or path.parent.parent == BENCHMARKS / "cpu_peers" or "quantised" in path.parts[-2:-1]):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if _command_of(data):
            date = str(data.get("date") or (data.get("environment") or {}).get("date") or "")[:10]
            folder = folders.setdefault(path.relative_to(BENCHMARKS).parts[0], [0, set()])
            folder[0] += 1
            folder[1].update([date] if date else [])
    return ", ".join(f"`{name}/` {count}" + (f" ({_date_range(dates)})" if dates else "")
                     for name, (count, dates) in folders.items()) + "."


def _date_range(dates) -> str:
    """"first to last", or the one date."""
    return " to ".join(dict.fromkeys([min(dates), max(dates)]))


def render() -> str:
    sections = [INTRO]
    speech = _load("real_speech/summary.json")
    sections.append("## Whisper tiny.en and base on 28 real recordings\n\n"
                    "`benchmarks/real_speech/summary.json`: each row's folder holds its per-clip `results.json` and "
                    "command; below, those run here.\n\n"
                    + real_speech(speech)
                    + "\n\n" + _commands(r["command"] for r in speech))
    quant = _load("quantised/summary.json")
    sections.append("## By weight precision (4-bit, 8-bit, 16-bit verifiers)\n\n"
                    f"`benchmarks/quantised/summary.json` ({_date_range([r['date'] for r in quant])}). "
                    "The MERaLiON-2 rows run its shapes on random weights with "
                    "replayed acceptance: speed only, never quality.\n\n"
                    + quantised(quant) + "\n\n" + _commands(r["command"] for r in quant))
    peers = _load("cpu_peers/summary.json")
    sections.append("## Whisper on a CPU against faster-whisper\n\n"
                    f"`benchmarks/cpu_peers/summary.json` ({_dates_and_cpus(peers)}): 28 recordings, audio to text; "
                    "*same text*: as the float32 `generate`'s.\n\n"
                    + cpu_peers(peers) + "\n\n" + _commands(r["command"] for r in peers))
    shown = {BENCHMARKS / "real_speech/summary.json", BENCHMARKS / "quantised/summary.json",
             BENCHMARKS / "cpu_peers/summary.json"}
    heads = _load("heads_comparison/summary.json") if (BENCHMARKS / "heads_comparison/summary.json").is_file() else None
    if heads:
        # the shipped heads; the experiments' rows stay in the summary (and each heads card compares them)
        heads["rows"] = [r for r in latest_rows(heads["rows"]) if heads_folder(r).startswith("heads/")]
        sections.append("## Heads by language\n\n`benchmarks/heads_comparison/summary.json` (the shipped heads; "
                        "experiments there and in `docs/DEVELOPING.md`): "
                        "English on 28 real recordings, other languages on espeak-ng speech; drafts "
                        + ", ".join(sorted({r["draft"] for r in heads["rows"]}))
                        + "; cells: tokens per verify pass (× own greedy), exact 100 % unless noted; "
                        "CPU, one repeat. Last rows: English against the shipped heads (a replacement may lose 2 % "
                        "at most; intervals: `replay_difference.json`).\n\n"
                        + heads_by_language(heads["rows"]))
        gpus = sorted({_device(r) for r in heads["rows"] if r.get("gpu")})
        if gpus:
            sections[-1] += ("\n\nOn the GPU (bfloat16, CUDA graphs, one timed repeat; " + ", ".join(gpus)
                             + "):\n\n" + heads_by_language(heads["rows"], "gpu"))
        shown |= {BENCHMARKS / "heads_comparison/summary.json"} | {ROOT / r["results"] for r in heads["rows"]}
    # real speech only: the flite-voice recordings stay listed under the other result files
    runs = {path: json.loads(path.read_text(encoding="utf-8"))
            for path in sorted((BENCHMARKS / "segments").glob("*/results.json"))}
    paths = [path for path, run in runs.items() if recording_kind(run) == "recorded clips joined"]
    segments = [runs[path] for path in paths]
    if segments:
        settings = ", ".join(sorted({f"{run['device']}, {run['dtype']}, {run['threads']} threads, medians of "
                                     f"{run['repeats']}" for run in segments}))
        sections.append("## Long recordings, timestamped\n\n`benchmarks/segments/` (`tools.compare_segments`; "
                        f"{settings}): the real recordings joined with pauses; Whisper's long-form "
                        "`generate`; faster-whisper float32, beam 1; our draft: "
                        + ", ".join(sorted({rows["ours"].get("draft", "?") for run in segments
                                            for rows in run["conditions"].values()}))
                        + (". Every row's ids equal the base's." if _all_equal_ids(segments) else ".")
                        + "\n\n" + long_form(segments)
                        + "\n\n" + _commands(run["command"] for run in segments))
        shown |= set(paths)
    for relative, title in (("gpu/summary.json", "MERaLiON-2 shapes on an H200"),
                            ("gpu/h100/summary.json", "MERaLiON-2 shapes on an H100"),
                            ("gpu/drafter_cost_heads/summary.json", "MERaLiON-2-3B, drafts at trained heads' cost")):
        summary = _load(relative)
        shown.add(BENCHMARKS / relative)
        text = (f"## {title}\n\n`benchmarks/{relative}` ({summary['gpu']}, torch {summary['torch']}, "
                f"transformers {summary['transformers']}, {summary['date']}). {_sentence(summary.get('note', ''))}".rstrip()
                + (" Rows run as CUDA graphs and also compiled are shown compiled." if _hides_graph_rows(summary)
                   else "") + (" Every row's ids equal the base's." if _all_exact(summary) else "")
                + "\n\n" + gpu_decode(summary))
        if summary["verify"]:
            text += ("\n\nMilliseconds of one verify pass by tokens verified (floor: the weights' bytes at the "
                     "measured copy bandwidth):\n\n" + gpu_verify(summary))
        sections.append(text + "\n\n" + _commands([summary["command"]] + [r["command"] for r in summary["runs"]]))
    sections.append("## Other result files\n\nBy folder; each file holds its command.\n\n" + other_files(shown))
    return "\n\n".join(sections) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.results_tables", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "RESULTS.md", help="the page to write")
    args = p.parse_args(argv)
    write_atomic(args.out, render())
    print(f"[results_tables] {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
