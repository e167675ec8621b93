"""Hierarchical drafting for a 4-bit target (SpecMQuant's scheme, ``tools.hierarchical``) against Medusa on the
target itself, at MERaLiON-2's full sizes with random weights: speed only, acceptance replayed.

The target: the MERaLiON-2-10B shape with 4-bit weights (``tools.weight_only``). The intermediate: the
MERaLiON-2-3B shape in bf16 (the family's natural pair: one Gemma tokenizer, one speech encoder) with Medusa
heads and a tree. Random weights cannot draft nor agree, so both are replayed:
- the intermediate's heads against the intermediate, with the seed model card's per-head accuracy;
- the intermediate against the target, as the probability that it picks the target's next token given the
  target's tokens before it (``--agreements``: not measured anywhere here; a sweep).
The target's verification is real: every output is checked token for token against the target's own greedy
continuation. In the same run: the target's own greedy loop and Medusa on the target (the seed profile's
heads, chain and trees), each one measurement of whole calls, rounds as CUDA graphs (``--compile``: compiled).

    python -m tools.benchmark_hierarchical_gpu

Writes ``OUT/results-hierarchical-TARGET-PRECISION.json`` (+ ``.md``) and one row per agreement to
``OUT/summary.json``.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import torch

from backbone_meralion2 import MERaLiON2Backbone
from draft_trees import DraftTree
from kv_cache import CachePool
from medusa_fast import CapturedCalls, CapturedRounds
from medusa_heads import MedusaDrafter
from tools import cli_args
from tools.benchmark_gpu import DecodeBench, draft_trees, meralion2_of
from tools.benchmark_report import QUANTISED_SUMMARY_KEY, ratio, update_summary
from tools import runtime
from tools.files import command_line, write_atomic, write_json_atomic
from tools.hierarchical import (ChainFromBuffer, HierarchicalStats, IntermediateRounds, run_hierarchical,
                                slots_past_max_new)
from tools.markdown import markdown_table, number_cell
from tools.meralion2_shaped import (SEED_PROFILE, SEED_TOP1, SHAPES, ReplayDrafter, ReplayedVerdicts, build_model,
                                    own_continuation, prefill, rank_profile)
from tools.weight_only import PRECISIONS, QUANTISED, quantise_linears


class HierarchicalRunner:
    """Both models' captured prefills and rounds for one intermediate tree and one chain length ``gamma``,
    reused by every timed call (as ``ReplayedRunner`` is): a call = both prefills + ``run_hierarchical``. The
    agreement can change between calls (``agree``): it only rewrites the replayed choices in place."""

    def __init__(self, target, intermediate, inputs, continuation, profile, tree, gamma, max_new, compile):
        self.target_backbone, self.intermediate_backbone = target, intermediate
        self.tree, self.gamma, self.max_new = tree, gamma, max_new
        self.extra_slots = slots_past_max_new(gamma, tree)
        self.pool, self.calls = CachePool(), CapturedCalls()  # both models' caches and captured prefills
        self.continuation = continuation
        self.own = own_continuation(continuation, 1.0, max_new + self.extra_slots[1] + 1, target.vocab_size)
        (target_state, target_rules), (intermediate_state, intermediate_rules) = self._prefill(inputs)
        replay = ReplayDrafter(intermediate, self.own, profile, seed=1)
        start = time.perf_counter()
        self.target = CapturedRounds(target, ChainFromBuffer(1, gamma, continuation.device), target_rules,
                                     target_state, DraftTree.chain(gamma), compile=compile)
        self.intermediate = IntermediateRounds(ReplayedVerdicts(intermediate, self.own),
                                               MedusaDrafter(tree, continuation.device, replay), intermediate_rules,
                                               intermediate_state, tree, max_new + self.extra_slots[1], compile=compile,
                                               num_generated=replay.num_generated)
        torch.cuda.synchronize()
        self.setup_seconds = time.perf_counter() - start

    def agree(self, agreement: float, seed: int = 0):
        self.own.copy_(own_continuation(self.continuation, agreement, self.own.shape[1],
                                        self.target_backbone.vocab_size, seed))

    def _prefill(self, inputs):
        """(state, rules) of the target, then of the intermediate, each in its cache of the pool."""
        return tuple(prefill(backbone, inputs, self.max_new, extra, min_new=self.max_new, cache_pool=self.pool,
                             capture=self.calls)
                     for backbone, extra in zip((self.target_backbone, self.intermediate_backbone), self.extra_slots))

    @property
    def prefill_captured(self) -> bool:
        return bool(self.calls.graphs) and all(entry is not None for entry in self.calls.graphs.values())

    def __call__(self, inputs, new_tokens=None):
        torch.cuda.synchronize()
        start = time.perf_counter()
        (target_state, _), (intermediate_state, _) = self._prefill(inputs)
        self.target.load(target_state)
        self.intermediate.load(intermediate_state)
        first = target_state.next_token.tolist()
        stats = HierarchicalStats()
        stats.prefill_seconds = time.perf_counter() - start
        start = time.perf_counter()
        out = run_hierarchical(self.target, self.intermediate, first, new_tokens or self.max_new,
                               self.target_backbone.eos_token_ids, stats)
        torch.cuda.synchronize()
        stats.loop_seconds = time.perf_counter() - start
        self.last_stats = stats
        return out, stats

    def release(self):
        self.target.release()
        self.intermediate.release()
        self.calls.release()
        self.pool.caches.clear()


def target_model(shape, precision, text_layers=None):
    model = build_model(torch.device("cuda"), torch.bfloat16, shape, text_layers)
    quantise_linears(model.text_decoder.model, precision)
    gc.collect()
    torch.cuda.empty_cache()
    return model


def hierarchical_rows(bench, intermediate, trees, gammas, agreements, compile) -> None:
    """One runner per (intermediate tree, gamma); every agreement on it; rows added to ``bench``."""
    profile = rank_profile(SEED_TOP1)
    for tree_name, tree in trees.items():
        for gamma in gammas:
            runner = HierarchicalRunner(bench.backbone, intermediate, bench.inputs1, bench.continuation, profile, tree,
                                        gamma, bench.max_new, compile)
            for agreement in agreements:
                runner.agree(agreement)
                runner(bench.inputs1)  # warm-up call
                row = bench.call_row(runner, bench.inputs1, bench.max_new, 1)
                bench.add({"method": "hierarchical", "draft": f"{tree_name} -> chain-{gamma}",
                           "intermediate_draft": tree_name, "gamma": gamma, "agreement": agreement,
                           "profile": SEED_PROFILE, "batch": 1, "rounds_mode": "compiled" if compile else "graph", **row,
                           "intermediate_rounds_per_target_pass":
                               runner.last_stats.as_dict()["intermediate_rounds_per_target_pass"]})
            runner.release()
            del runner
            gc.collect()
            torch.cuda.empty_cache()


def comparison(rows: list[dict]) -> dict:
    """Per agreement: the best hierarchical configuration against the best Medusa draft on the target and the
    target's own greedy loop (loop tokens per second: the rounds alone; call: whole calls)."""
    greedy = next(r for r in rows if r["method"] == "ours_greedy")
    medusa = max((r for r in rows if r["method"] == "ours" and r.get("exact")), key=lambda r: r["loop_tok_per_s"])
    table = {}
    for agreement in sorted({r["agreement"] for r in rows if r["method"] == "hierarchical"}):
        best = max((r for r in rows if r.get("agreement") == agreement and r.get("exact")),
                   key=lambda r: r["loop_tok_per_s"])
        table[str(agreement)] = {
            "best": best["draft"], "tokens_per_target_pass": best["tokens_per_round"],
            "loop_tok_per_s": best["loop_tok_per_s"], "call_tok_per_s": best["call_tok_per_s"],
            "vs_own_greedy_loop": ratio(best["loop_tok_per_s"], greedy["loop_tok_per_s"]),
            "vs_medusa_on_target_loop": ratio(best["loop_tok_per_s"], medusa["loop_tok_per_s"]),
            "vs_medusa_on_target_call": ratio(best["call_tok_per_s"], medusa["call_tok_per_s"]),
            "medusa_on_target": medusa["draft"]}
    return table


def summary_rows(results: dict) -> list[dict]:
    rows = results["decode"]
    greedy = next(r for r in rows if r["method"] == "ours_greedy")
    out = []
    for agreement, best in results["comparison"].items():
        row = next(r for r in rows if r.get("agreement") == float(agreement) and r["draft"] == best["best"])
        out.append({"model": results["target"], "precision": results["precision"], "kernel": results["kernel"],
                    "device": "cuda", "gpu": results["device"], "dtype": "bfloat16", "batch": 1,
                    "draft": f"hierarchical: {results['intermediate']} bf16 {best['best']}",
                    "requested_draft": f"hierarchical, agreement {agreement}", "intermediate": results["intermediate"],
                    "agreement": float(agreement), "rounds_mode": row["rounds_mode"], "new_tokens": row["new_tokens"],
                    "tokens_per_s": row["call_tok_per_s"], "own_greedy_tokens_per_s": greedy["call_tok_per_s"],
                    "speedup_vs_own_greedy": ratio(row["call_tok_per_s"], greedy["call_tok_per_s"]),
                    "decode_speedup_vs_own_greedy": best["vs_own_greedy_loop"],
                    "vs_medusa_on_target_loop": best["vs_medusa_on_target_loop"],
                    "mean_accepted_per_round": row["tokens_per_round"], "exact_match_rate": 1.0 if row["exact"] else 0.0,
                    "wer": None, "verify_ms_by_tokens": None, "replayed": True, "date": results["date"],
                    "torch": results["torch"], "transformers": results["transformers"], "command": results["command"]})
    return out


def render_markdown(results: dict) -> str:
    lines = [f"# Hierarchical drafting on a {results['precision']} {results['target']} target (random weights: speed "
             "only, acceptance replayed)", "",
             f"{results['device']}, torch {results['torch']}, transformers {results['transformers']}; "
             f"`{results['command']}`", "",
             f"Intermediate: {results['intermediate']} bf16 with Medusa heads (seed profile {SEED_PROFILE}); its "
             "agreement with the target is an assumption, swept. Batch 1, "
             f"{results['new_tokens']} new tokens, rounds {results['rounds_mode']}; every row checked against the "
             "target's own greedy continuation.", ""]
    header = ["method", "draft", "agreement", "tokens / target pass", "intermediate rounds / pass", "loop tok/s",
              "call tok/s", "exact"]
    rows = [[r["method"], r["draft"], r.get("agreement", ""), number_cell(r.get("tokens_per_round")),
             number_cell(r.get("intermediate_rounds_per_target_pass")), number_cell(r.get("loop_tok_per_s"), 0),
             number_cell(r.get("call_tok_per_s"), 0), r.get("exact", r.get("matches_our_greedy", ""))]
            for r in results["decode"]]
    lines += [markdown_table(header, rows), "", "Best hierarchical configuration per agreement:", ""]
    header = ["agreement", "best", "tokens / target pass", "vs own greedy (loop)", "vs Medusa on the target (loop)",
              "vs Medusa on the target (call)"]
    rows = [[a, c["best"], number_cell(c["tokens_per_target_pass"]), number_cell(c["vs_own_greedy_loop"], 2, "x"),
             f"{number_cell(c['vs_medusa_on_target_loop'], 2, 'x')} ({c['medusa_on_target']})",
             number_cell(c["vs_medusa_on_target_call"], 2, "x")] for a, c in results["comparison"].items()]
    return "\n".join(lines + [markdown_table(header, rows), ""])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark_hierarchical_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/quantised")
    parser.add_argument("--target", choices=sorted(SHAPES), default="meralion2-10b")
    parser.add_argument("--precision", choices=[p for p in PRECISIONS if p != "bf16"], default="int4")
    parser.add_argument("--intermediate", choices=sorted(SHAPES), default="meralion2-3b")
    parser.add_argument("--intermediate-drafts", default="tree-16", help="the intermediate's Medusa drafts")
    parser.add_argument("--gammas", type=cli_args.positive_ints_text, default="3,5,7", help="chain lengths the target verifies")
    parser.add_argument("--agreements", type=cli_args.fractions_text, default="0.8,0.9,0.95",
                        help="probability that the intermediate picks the target's next token (an assumption)")
    parser.add_argument("--target-drafts", default="none,chain,tree-16", help="Medusa on the target, for comparison")
    parser.add_argument("--new-tokens", type=cli_args.positive_int, default=64)
    parser.add_argument("--repeats", type=cli_args.positive_int, default=3)
    parser.add_argument("--compile", action="store_true", help="rounds compiled (about a minute per runner)")
    parser.add_argument("--text-layers", type=cli_args.positive_int, default=None, help="fewer decoder layers, for a smoke test")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    runtime.time_drafts_afresh()
    if not torch.cuda.is_available():
        raise SystemExit("tools.benchmark_hierarchical_gpu needs a CUDA GPU (the int4 kernel is CUDA-only).")
    import transformers

    command = command_line("tools.benchmark_hierarchical_gpu", argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"results-hierarchical-{args.target}-{args.precision}{'-compiled' if args.compile else ''}.json"
    results = {"target": args.target, "precision": args.precision, "kernel": QUANTISED[args.precision].kernel,
               "intermediate": args.intermediate, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d"), "command": command,
               "new_tokens": args.new_tokens, "rounds_mode": "compiled" if args.compile else "graph", "decode": []}

    def report(rows):
        results["decode"] = rows
        print(rows[-1], flush=True)
        write_json_atomic(path, results)  # a run cut short keeps every finished row

    model = target_model(args.target, args.precision, args.text_layers)
    bench = DecodeBench(meralion2_of(model), args.target, args.new_tokens, args.repeats)
    bench.start_section(report)
    profile = rank_profile(SEED_TOP1)
    for name, tree in draft_trees(profile, args.target_drafts.split(",")).items():
        bench.ours("ours_greedy" if name == "none" else "ours", name, tree, "none" if name == "none" else SEED_PROFILE,
                   profile, 1, [args.new_tokens], args.compile)
    intermediate = build_model(torch.device("cuda"), torch.bfloat16, args.intermediate, args.text_layers)
    hierarchical_rows(bench, MERaLiON2Backbone(intermediate), draft_trees(profile, args.intermediate_drafts.split(",")),
                      [int(g) for g in args.gammas.split(",")], [float(a) for a in args.agreements.split(",")],
                      args.compile)
    results["comparison"] = comparison(results["decode"])
    write_json_atomic(path, results)
    for row in summary_rows(results) if args.text_layers is None else []:
        update_summary(out / "summary.json", row, QUANTISED_SUMMARY_KEY)
    markdown = render_markdown(results)
    write_atomic(path.with_suffix(".md"), markdown)
    print(markdown)


if __name__ == "__main__":
    with torch.no_grad():
        main()
