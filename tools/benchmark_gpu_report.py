"""Tables and the summary of ``benchmark_gpu.py``'s results (one ``results-SHAPE.json`` per shape):
Markdown per shape and ``summary.json`` over every shape in the folder. Rerun alone to rewrite them:

    python -m tools.benchmark_gpu_report --out benchmarks/gpu
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from tools.files import command_line, write_atomic, write_json_atomic
from tools.markdown import markdown_table

VERIFY_METHODS = {"hf_eager_ms": "hf_eager", "ours_eager_ms": "ours_eager", "ours_graph_ms": "ours_graph",
                  "fused_graph_ms": "ours_fused_graph", "fused_compiled_graph_ms": "ours_fused_compiled_graph"}
DECODE_FIELDS = ("shape", "profile", "batch", "method", "draft", "rounds_mode", "new_tokens", "call_tok_per_s",
                 "loop_tok_per_s", "decode_tok_per_s", "encoder_ms", "outside_rounds_ms", "time_to_first_token_ms",
                 "tokens_per_round", "exact", "matches_our_greedy", "peak_memory_allocated_GB", "speed_only",
                 "weights", "acceptance", "command")


def read_results(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def decode_rows(result: dict) -> list[dict]:
    return [r for section in ("lengths", "batching") for r in result.get(section, []) if "error" not in r]


def best_ours(rows: list[dict], batch: int, new_tokens: int, profile: str) -> dict | None:
    """The fastest draft we measured for a batch size and length (what a tuned ``auto`` would pick)."""
    ours = [r for r in rows if r["method"] == "ours" and r["batch"] == batch and r["new_tokens"] == new_tokens
            and r["profile"] == profile]
    return max(ours, key=lambda r: r["call_tok_per_s"], default=None)


def fastest(rows, method, batch, new_tokens) -> dict | None:
    same = [r for r in rows if r["method"] == method and r["batch"] == batch and r["new_tokens"] == new_tokens]
    return max(same, key=lambda r: r["call_tok_per_s"], default=None)


def render_markdown(result: dict) -> str:
    floor, rows = result["floor_ms"], decode_rows(result)
    whisper = result["shape"].startswith("whisper")
    lines = [f"# GPU benchmark: {result['shape']} shape ({result['text_layers']} decoder layers), random weights, "
             f"{result.get('dtype', 'bfloat16')}", "",
             f"{result['device']}, torch {result['torch']}, transformers {result['transformers']}, {result['date']}. "
             + _floor_note(result)
             + "Decode rows replay an acceptance profile on random weights: speed only, never quality. "
             + (_whisper_note(result) if whisper else
                f"Speech encoder + adapter alone (one 30 s window, CUDA graph): "
                f"{result.get('speech_encoder_graph_ms', 0):.2f} ms.")
             + _drafter_cost_note(rows), ""]
    lines += _verify_lines(result.get("verify", []), floor)
    if whisper:
        lines += _whisper_lines(rows, result["profile"])
    else:
        lines += _lengths_lines([r for r in rows if r["batch"] == 1])
        lines += _batching_lines(rows)
    lines += _all_rows_lines(result)
    lines += ["", "Commands:", ""] + [f"- {name}: `{cmd}`" for name, cmd in section_commands(result)]
    return "\n".join(lines) + "\n"


def _floor_note(result) -> str:
    floor = result.get("floor_ms")
    if floor is None:
        return ""
    return (f"Floor (one read of the decoder's {result['decoder_weight_GB']:.2f} GB at the measured "
            f"{result['copy_bandwidth_GBps']:.0f} GB/s copy bandwidth): {floor:.2f} ms = {1000 / floor:.0f} tok/s. ")


def _whisper_note(result) -> str:
    encoder = ", ".join(f"batch {b}: {ms:.1f} ms" for b, ms in (result.get("encoder_graph_ms_by_batch") or {}).items())
    return ("The library's own WhisperForConditionalGeneration with the real config (random weights); drafts replay "
            f"the shipped whisper-base heads' measured per-head top-k (profile `{result['profile']}`). Encoder + "
            f"cross-attention keys and values of one 30 s window per row ({encoder or 'not measured'}): "
            "`decode tok/s` is the call without it (the library's generate given the encoder's output; ours: the call "
            "less that time). Compare rows of one run only." + _measured_rounds_note(result))


def _measured_rounds_note(result) -> str:
    """The real heads' tokens per round beside the replay's: the replay draws each head's rank on its own, so it
    accepts more than the real heads do (their misses come together)."""
    measured = (result.get("replayed_profile") or {}).get("heads_measured_tokens_per_round") or []
    if not measured:
        return ""
    cells = ", ".join(f"{m['nodes']} nodes {m['held_out']:.2f} / {m['real_speech']:.2f}" for m in measured
                      if m.get("real_speech") is not None)
    return (" The replay draws each head's rank independently, so its tokens/round run above the real heads' "
            f"(whisper-base, held-out / real speech: {cells}): the drafted rows are an upper estimate.")


def _whisper_lines(rows, profile) -> list[str]:
    """Per batch and length: our best draft against our greedy and the library's generate, whole calls (encoder
    included) and decode alone, then where the drafts stop paying."""
    body, losing = [], []
    for batch in sorted({r["batch"] for r in rows}):
        for n in sorted({r["new_tokens"] for r in rows if r["batch"] == batch and r["method"] == "ours"}):
            ours, greedy = best_ours(rows, batch, n, profile), fastest(rows, "ours_greedy", batch, n)
            static, dynamic = fastest(rows, "hf_static", batch, n), fastest(rows, "hf_dynamic", batch, n)
            body.append([batch, n, ours["draft"], ours["tokens_per_round"], ours["call_tok_per_s"],
                         _get(greedy, "call_tok_per_s"), _get(static, "call_tok_per_s"),
                         _get(dynamic, "call_tok_per_s"), ours.get("decode_tok_per_s"),
                         _get(greedy, "decode_tok_per_s"), _get(static, "decode_tok_per_s"),
                         _get(dynamic, "decode_tok_per_s"), _ratio(ours, greedy), _ratio(ours, static),
                         ours.get("encoder_ms"), ours["exact"]])
            if greedy is not None and _ratio(ours, greedy) < 1.0:
                losing.append(f"batch {batch} at {n} tokens ({_ratio(ours, greedy):.2f}x)")
    if not body:
        return []
    verdict = ("Drafts lose to our greedy (whole calls) at " + "; ".join(losing) + ".") if losing else \
        "Our best draft beats our greedy (whole calls) at every batch and length measured."
    return ["## Whole calls and decode alone (tok/s; replayed whisper-base profile)", "", _table(
        ["batch", "new tokens", "best draft", "tokens/round", "ours", "ours greedy", "HF static", "HF dynamic",
         "ours decode", "ours greedy decode", "HF static decode", "HF dynamic decode", "x ours greedy",
         "x HF static", "encoder ms", "exact"], body), "", verdict, ""]


def _drafter_cost_note(rows) -> str:
    if not any(r.get("drafter_cost") == "heads" for r in rows):
        return ""
    return (" Rows with drafter cost `heads` run, each round, what trained heads compute (four residual heads and"
            " their projection onto an 8 192-token draft vocabulary) and draft the replayed ranks from it.")


def section_commands(result: dict) -> list[tuple[str, str]]:
    """(section, command) for every run whose rows a section holds, in order (a section measured in parts has
    several), else the section's last command."""
    pairs = []
    for name, last in result.get("commands", {}).items():
        commands = list(dict.fromkeys(r["command"] for r in result.get(name, []) if r.get("command"))) or [last]
        pairs += [(name, command) for command in commands]
    return pairs


def _table(header: list[str], rows: list[list]) -> str:
    return markdown_table(header, [[_cell(v) for v in row] for row in rows])


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}" if value < 100 else f"{value:.0f}"
    return str(value)


def _verify_lines(rows, floor) -> list[str]:
    if not rows:
        return []
    keys = [k for k in VERIFY_METHODS if any(k in r for r in rows)]
    body = [[r["tokens"]] + [None if r.get(k) is None else f"{r[k]:.2f} ({r[k] / floor:.2f}x)" for k in keys] for r in rows]
    return ["## One verify pass (ms; x floor)", "", _table(["tokens"] + [VERIFY_METHODS[k] for k in keys], body), ""]


def _lengths_lines(rows) -> list[str]:
    lengths = sorted({r["new_tokens"] for r in rows if r["method"] == "ours"})
    if not lengths:
        return []
    body = []
    for n in lengths:
        ours, greedy = best_ours(rows, 1, n, "seed_76_47_35_27"), fastest(rows, "ours_greedy", 1, n)
        static, dynamic = fastest(rows, "hf_static", 1, n), fastest(rows, "hf_dynamic", 1, n)
        if ours is None:
            continue
        body.append([n, ours["draft"], ours["call_tok_per_s"], ours["loop_tok_per_s"], ours["outside_rounds_ms"],
                     ours["time_to_first_token_ms"], ours["tokens_per_round"], _get(greedy, "call_tok_per_s"),
                     _get(static, "call_tok_per_s"), _get(dynamic, "call_tok_per_s"),
                     _ratio(ours, greedy), _ratio(ours, static), ours["exact"]])
    return ["## Whole calls at ASR lengths, batch 1 (replayed seed profile)", "", _table(
        ["new tokens", "best draft", "call tok/s", "loop tok/s", "outside rounds ms", "first token ms",
         "tokens/round", "ours greedy tok/s", "HF static tok/s", "HF dynamic tok/s", "x ours greedy", "x HF static",
         "exact"], body), ""]


def _batching_lines(rows) -> list[str]:
    batches = sorted({r["batch"] for r in rows})
    body = []
    for batch in batches:
        n = max((r["new_tokens"] for r in rows if r["batch"] == batch and r["method"] == "ours"), default=None)
        if batch == 1:
            n = 64 if any(r["new_tokens"] == 64 for r in rows if r["batch"] == 1) else n
        ours = best_ours(rows, batch, n, "seed_76_47_35_27")
        if ours is None:
            continue
        greedy, static = fastest(rows, "ours_greedy", batch, n), fastest(rows, "hf_static", batch, n)
        dynamic = fastest(rows, "hf_dynamic", batch, n)
        body.append([batch, n, ours["draft"], ours["rounds_mode"], ours["call_tok_per_s"], ours["call_seconds"] * 1000,
                     _get(greedy, "call_tok_per_s"), _get(static, "call_tok_per_s"), _get(dynamic, "call_tok_per_s"),
                     _ratio(ours, greedy), _ratio(ours, static), ours["exact"]])
    if not body:
        return []
    return ["## Batching against batched greedy (replayed seed profile)", "", _table(
        ["batch", "new tokens", "best draft", "rounds", "call tok/s", "latency per call ms", "ours greedy tok/s",
         "HF static tok/s", "HF dynamic tok/s", "x ours greedy", "x HF static", "exact"], body), ""]


def _all_rows_lines(result) -> list[str]:
    rows = [r for s in ("lengths", "batching") for r in result.get(s, [])]
    if not rows:
        return []
    fields = ["method", "draft", "profile", "rounds_mode", "batch", "new_tokens", "call_tok_per_s", "loop_tok_per_s",
              "outside_rounds_ms", "time_to_first_token_ms", "tokens_per_round", "exact", "prefill_captured",
              "setup_seconds", "peak_memory_allocated_GB", "error"]
    if any("drafter_cost" in r for r in rows):
        fields.insert(4, "drafter_cost")
    if any("decode_tok_per_s" in r for r in rows):
        fields[fields.index("loop_tok_per_s") + 1:fields.index("loop_tok_per_s") + 1] = ["decode_tok_per_s", "encoder_ms",
                                                                                     "matches_our_greedy"]
    return ["## Every decode row", "", _table(fields, [[r.get(f) for f in fields] for r in rows])]


def _get(row, key):
    return None if row is None else row.get(key)


def _ratio(ours, other):
    return None if other is None else ours["call_tok_per_s"] / other["call_tok_per_s"]


def write_summary(out: Path, command: str | None = None) -> dict:
    """``summary.json`` over every ``results-*.json`` in ``out``: the rows the issue asks for, each from
    the run (command) that measured it."""
    results = [read_results(p) for p in sorted(out.glob("results-*.json"))]
    results = [r for r in results if "shape" in r]
    if not results:
        return {}
    summary = {
        "gpu": results[0]["device"], "torch": results[0]["torch"], "transformers": results[0]["transformers"],
        "date": max(r["date"] for r in results),
        "command": command or shlex.join(["python", "-m", "tools.benchmark_gpu_report", "--out", str(out)]),
        "runs": [{"shape": r["shape"], "section": name, "command": cmd} for r in results
                 for name, cmd in r.get("commands", {}).items()],
        "floor_ms": {r["shape"]: r["floor_ms"] for r in results},
        "devices": {r["shape"]: r["device"] for r in results},
        "speech_encoder_graph_ms": {r["shape"]: r.get("speech_encoder_graph_ms") for r in results},
        "verify": [{"shape": r["shape"], "method": VERIFY_METHODS[key], "tokens": row["tokens"], "ms": row[key],
                    "x_floor": row[key] / r["floor_ms"]}
                   for r in results for row in r.get("verify", []) for key in VERIFY_METHODS if row.get(key) is not None],
        "encoder_graph_ms_by_batch": {r["shape"]: r["encoder_graph_ms_by_batch"] for r in results
                                      if r.get("encoder_graph_ms_by_batch")},
        "decode": [{f: row.get(f) for f in DECODE_FIELDS if f in row} for r in results for row in decode_rows(r)],
        "replayed": True,
        "note": "random weights; decode rows replay an acceptance profile (speed only, never quality)",
    }
    write_json_atomic(out / "summary.json", summary)
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark_gpu_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/gpu")
    args = parser.parse_args(argv)
    out = Path(args.out)
    for path in sorted(out.glob("results-*.json")):
        write_atomic(path.with_suffix(".md"), render_markdown(read_results(path)))
    write_summary(out, command_line("tools.benchmark_gpu_report", argv))


if __name__ == "__main__":
    main()
