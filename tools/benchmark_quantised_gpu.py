"""Verify cost by weight precision on MERaLiON-2-shaped decoders (random weights: speed only), and the draft
``auto``'s rule picks from it: bf16, int8 and int4 weight-only (``tools.weight_only``: PyTorch's own kernels, and
GemLite's Triton kernels as ``int8-gemlite`` / ``int4-gemlite`` where the gemlite package is installed).

For each precision, on the same random model quantised in place (``lm_head`` kept in bf16):
- the weight GEMMs of a verify pass alone (every layer's seven projections, one CUDA graph) and the whole pass
  (ours, one CUDA graph, uncompiled), for 1..64 tokens, against the precision's own bandwidth floor;
- whole calls at batch 1 with the replayed seed acceptance profile, for plain greedy and each draft (rounds as
  uncompiled CUDA graphs), each checked token for token against this precision's own greedy continuation, and the
  library's own eager ``generate`` on the same quantised decoder as the lossless cross-check;
- the draft ``auto``'s rule picks: the most predicted tokens per round (the profile's) per measured round time.

Writes ``OUT/results-SHAPE.json`` (+ ``.md``) and adds one row per precision to ``OUT/summary.json``.

    python -m tools.benchmark_quantised_gpu --shape meralion2-3b
    python -m tools.benchmark_quantised_gpu --shape meralion2-3b --precisions bf16,int8-gemlite,int4,int4-gemlite
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from pathlib import Path

import torch

from backbone_meralion2 import MERaLiON2Backbone
from draft_trees import expected_tokens_per_round
from tools import cli_args
from tools.benchmark_gpu import (DecodeBench, draft_trees, graph_ms, measure_copy_bandwidth, meralion2_of,
                                 verify_pass)
from tools.benchmark_report import QUANTISED_SUMMARY_KEY, ratio, update_summary
from tools import runtime
from tools.files import command_line, write_atomic, write_json_atomic
from tools.markdown import markdown_table, number_cell
from tools.meralion2_shaped import SEED_PROFILE, SEED_TOP1, SHAPES, build_model, make_prompt, rank_profile
from tools.weight_only import PRECISIONS, QUANTISED, bits, module_bytes, quantise_linears

SUMMARY_SIZES = (1, 5, 16, 64)  # verify_ms_by_tokens in the summary rows


def linear_layers(decoder) -> list:
    """Every projection of every decoder layer, in order (what a verify pass multiplies its weights by)."""
    return [m for layer in decoder.model.layers for m in layer.modules()
            if isinstance(m, (torch.nn.Linear, *QUANTISED.values()))]


def linears_ms(decoder, tokens: int) -> float:
    """The weight GEMMs of one verify pass of ``tokens`` tokens: each projection once, as one CUDA graph."""
    layers = linear_layers(decoder)
    device = next(decoder.parameters()).device
    inputs = {width: torch.randn(tokens, width, device=device, dtype=torch.bfloat16)
              for width in {m.in_features for m in layers}}
    return graph_ms(lambda: [m(inputs[m.in_features]) for m in layers])


def precision_rows(shape, precision, sizes, drafts, new_tokens, repeats, bandwidth, text_layers, compile) -> dict:
    device = torch.device("cuda")
    model = build_model(device, torch.bfloat16, shape, text_layers)
    replaced = quantise_linears(model.text_decoder.model, precision)
    gc.collect()
    torch.cuda.empty_cache()
    backbone = MERaLiON2Backbone(model)
    weight_bytes = module_bytes(model.text_decoder)
    result = {"precision": precision, "kernel": QUANTISED[precision].kernel if precision in QUANTISED else "cuBLAS bf16",
              "quantised_layers": replaced, "compiled": compile, "decoder_weight_GB": weight_bytes / 1e9,
              "floor_ms": weight_bytes / bandwidth * 1000, "linears_ms": {}, "verify_ms": {}}
    inputs = make_prompt(model, 1, device)
    for n in sizes:
        result["linears_ms"][str(n)] = linears_ms(model.text_decoder, n)
        result["verify_ms"][str(n)] = graph_ms(verify_pass(backbone, inputs, n))
        print(precision, n, result["linears_ms"][str(n)], result["verify_ms"][str(n)], flush=True)
    profile = rank_profile(SEED_TOP1)
    bench = DecodeBench(meralion2_of(model, backbone), shape, new_tokens, repeats)
    bench.start_section(lambda rows: print(rows[-1], flush=True))
    trees = draft_trees(profile, drafts)
    for name, tree in trees.items():
        method = "ours_greedy" if name == "none" else "ours"
        bench.ours(method, name, tree, "none" if name == "none" else SEED_PROFILE, profile, 1, [new_tokens], compile)
    bench.hf("hf_dynamic", 1, [new_tokens])
    result["decode"] = bench.rows
    add_picks(result)
    del bench, backbone, model
    gc.collect()
    torch.cuda.empty_cache()
    return result


def add_picks(result: dict) -> None:
    """The draft auto's rule takes from this precision's measured rounds, once it has observed them (``auto_pick``)
    and at first, from the profile's prediction alone (``auto_first_pick``)."""
    profile = rank_profile(SEED_TOP1)
    trees = draft_trees(profile, {row["draft"] for row in result["decode"] if "draft" in row})
    result["auto_pick"] = best_draft(trees, result["decode"], observed=True)
    result["auto_first_pick"] = best_draft(trees, result["decode"], observed=False, profile=profile)


def best_draft(trees: dict, rows: list[dict], observed: bool, profile=None) -> str | None:
    """The draft ``auto``'s rule takes from the measured round times: most tokens per round per round time. Tokens
    per round as observed in these rounds (``observed``: what auto's estimate converges to as it counts the rounds
    each draft emitted), else as the profile's per-head accuracy predicts (its first pick, before it has seen any)."""
    topk = profile and [[sum(p[: r + 1]) for r in range(len(p))] for p in profile]
    rate = {}
    for row in rows:
        if row.get("method") in ("ours", "ours_greedy") and row.get("loop_tok_per_s"):
            tree = trees[row["draft"]]
            round_seconds = row["tokens_per_round"] / row["loop_tok_per_s"]
            tokens = row["tokens_per_round"] if observed or tree.num_nodes == 1 else expected_tokens_per_round(tree, topk)
            rate[row["draft"]] = tokens / round_seconds
    return max(rate, key=rate.get) if rate else None


def summary_row(shape, result, env, command) -> dict:
    decode = {row["draft"]: row for row in result["decode"] if row.get("method") in ("ours", "ours_greedy")}
    pick, greedy = decode.get(result["auto_pick"], {}), decode.get("none", {})
    ours = [row for row in decode.values() if "exact" in row]
    return {"model": shape, "precision": bits(result["precision"]), "kernel": result["kernel"], "device": "cuda",
            "gpu": env["device"], "dtype": "bfloat16", "batch": 1, "draft": result["auto_pick"],
            "auto_first_pick": result["auto_first_pick"], "requested_draft": "auto",
            "rounds_mode": "compiled" if result.get("compiled") else "graph", "new_tokens": greedy.get("new_tokens"),
            "tokens_per_s": pick.get("call_tok_per_s"), "own_greedy_tokens_per_s": greedy.get("call_tok_per_s"),
            "speedup_vs_own_greedy": ratio(pick.get("call_tok_per_s"), greedy.get("call_tok_per_s")),
            "decode_speedup_vs_own_greedy": ratio(pick.get("loop_tok_per_s"), greedy.get("loop_tok_per_s")),
            "mean_accepted_per_round": pick.get("tokens_per_round"),
            "exact_match_rate": sum(bool(row["exact"]) for row in ours) / len(ours) if ours else None,
            "wer": None, "verify_ms_by_tokens": {str(n): result["verify_ms"].get(str(n)) for n in SUMMARY_SIZES},
            "floor_ms": result["floor_ms"], "replayed": True, "date": env["date"], "torch": env["torch"],
            "transformers": env["transformers"], "command": command}


def render_markdown(results: dict) -> str:
    sizes = sorted({int(n) for r in results["precisions"] for n in r["verify_ms"]})
    lines = [f"# Verify cost by weight precision, {results['shape']} shape (random weights: speed only)", "",
             f"{results['device']}, torch {results['torch']}, transformers {results['transformers']}; "
             f"`{results['command']}`", "",
             "Whole verify pass (ours, one CUDA graph, uncompiled) / weight GEMMs alone, ms, and the pass against "
             "the precision's bandwidth floor:", ""]
    header = ["precision", "kernel", "weights GB", "floor ms"] + [f"{n} tok" for n in sizes]
    rows = [[r["precision"], r["kernel"], f"{r['decoder_weight_GB']:.2f}", f"{r['floor_ms']:.2f}"]
            + [f"{r['verify_ms'][str(n)]:.2f} / {r['linears_ms'][str(n)]:.2f} ({r['verify_ms'][str(n)] / r['floor_ms']:.2f}x)"
               for n in sizes] for r in results["precisions"]]
    lines += [markdown_table(header, rows), "",
              f"Decode at batch 1, {results['new_tokens']} new tokens, replayed seed acceptance, rounds as CUDA graphs "
             f"({'compiled' if results.get('compiled') else 'uncompiled'}); auto picks: from the measured round times, "
             "with the tokens per round it observed (its first pick, from the profile's prediction, in brackets "
             "where it differs):", ""]
    header = ["precision", "method", "draft", "tokens/round", "loop tok/s", "call tok/s", "vs own greedy (loop)",
              "exact", "auto picks"]
    rows = []
    for r in results["precisions"]:
        greedy = next((d for d in r["decode"] if d.get("draft") == "none" and d.get("method") == "ours_greedy"), {})
        for d in r["decode"]:
            loop = d.get("loop_tok_per_s")
            rows.append([r["precision"], d.get("method"), d.get("draft"), number_cell(d.get("tokens_per_round")), number_cell(loop, 0),
                         number_cell(d.get("call_tok_per_s"), 0), number_cell(ratio(loop, greedy.get("loop_tok_per_s")), 2, "x"),
                         d.get("exact", d.get("matches_our_greedy")), _picked(r, d)])
    return "\n".join(lines + [markdown_table(header, rows), ""])


def _picked(result: dict, row: dict) -> str:
    if row.get("method") == "hf_dynamic":
        return ""
    marks = ["yes" if row.get("draft") == result["auto_pick"] else "",
             "(first pick)" if row.get("draft") == result.get("auto_first_pick") != result["auto_pick"] else ""]
    return " ".join(m for m in marks if m)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark_quantised_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/quantised")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="meralion2-3b")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--sizes", type=cli_args.positive_ints_text, default="1,2,4,5,8,16,32,64", help="tokens per verify pass")
    parser.add_argument("--drafts", default="none,chain,tree-8,tree-16,tree-32,tree-64")
    parser.add_argument("--new-tokens", type=cli_args.positive_int, default=64)
    parser.add_argument("--repeats", type=cli_args.positive_int, default=3)
    parser.add_argument("--from-results", nargs="+", default=None, metavar="RESULTS_JSON",
                        help="no measuring: re-derive the picks, the Markdown and the summary rows from results files "
                             "this command wrote (each keeps the command that measured it)")
    parser.add_argument("--compile", action="store_true", help="decode rounds compiled (about a minute each at 3B)")
    parser.add_argument("--text-layers", type=cli_args.positive_int, default=None, help="fewer decoder layers, for a smoke test")
    parser.add_argument("--tag", default="", help="added to the results file's name (results-SHAPE[-compiled]-TAG), so "
                                                  "a run of other precisions keeps the earlier files")
    args = parser.parse_args(argv)
    args.precisions = [p for p in args.precisions.split(",") if p]
    if unknown := set(args.precisions) - set(PRECISIONS):
        parser.error(f"--precisions: unknown {sorted(unknown)}; use any of {', '.join(PRECISIONS)}")
    return args


def report_from_results(paths: list[str], summary: Path) -> None:
    for path in map(Path, paths):
        results = json.loads(path.read_text())
        env = {key: results[key] for key in ("device", "torch", "transformers", "date")}
        for result in results["precisions"]:
            add_picks(result)
            update_summary(summary, summary_row(results["shape"], result, env, results["command"]),
                           QUANTISED_SUMMARY_KEY)
        write_json_atomic(path, results)
        write_atomic(path.with_suffix(".md"), render_markdown(results))


def main(argv=None):
    args = parse_args(argv)
    runtime.time_drafts_afresh()
    if args.from_results:
        return report_from_results(args.from_results, Path(args.out) / "summary.json")
    if not torch.cuda.is_available():
        raise SystemExit("tools.benchmark_quantised_gpu needs a CUDA GPU (the int4 kernel is CUDA-only).")
    import transformers

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = command_line("tools.benchmark_quantised_gpu", argv)
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "transformers": transformers.__version__, "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d")}
    bandwidth = measure_copy_bandwidth(torch.device("cuda"))
    results = {"shape": args.shape, **env, "command": command, "copy_bandwidth_GBps": bandwidth / 1e9,
               "profile": SEED_PROFILE, "new_tokens": args.new_tokens, "compiled": args.compile,
               "precisions": []}
    path = out / f"results-{args.shape}{'-compiled' if args.compile else ''}{'-' + args.tag if args.tag else ''}.json"
    for precision in args.precisions:
        result = precision_rows(args.shape, precision, [int(n) for n in args.sizes.split(",")],
                                args.drafts.split(","), args.new_tokens, args.repeats, bandwidth, args.text_layers,
                                args.compile)
        results["precisions"].append(result)
        write_json_atomic(path, results)  # a run cut short keeps every finished precision
        if args.text_layers is None:
            update_summary(out / "summary.json", summary_row(args.shape, result, env, command), QUANTISED_SUMMARY_KEY)
    markdown = render_markdown(results)
    write_atomic(path.with_suffix(".md"), markdown)
    print(markdown)


if __name__ == "__main__":
    with torch.no_grad():
        main()
