"""The reporting half of ``tools.benchmark``: from the measured groups (one clip, or one batch, timed with every
decoder) to the per-clip records and the summaries of results.json, the notes on a run, its Markdown tables and
plot, and the summary list across runs (``benchmarks/real_speech/summary.json``).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from pathlib import Path

from tools.files import replace_rows, write_atomic, write_json_atomic
from tools.markdown import markdown_table

PLOT_NAME = "speedup_vs_length.png"


def ratio(numerator, denominator):
    return numerator / denominator if numerator is not None and denominator else None


def median(values):
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------- word error rates


def clip_wer(reference: str | None, hypothesis: str | None) -> float | None:
    """One clip's WER (normalised text); None without a reference, a hypothesis or any reference words."""
    if reference is None or hypothesis is None:
        return None
    from tools.text_normalizer import normalize, wer

    if not normalize(reference).split():
        return None
    return float(wer([reference], [hypothesis]))


def corpus_wer(references: list, hypotheses: list) -> float | None:
    """WER over every clip that has a reference with words and a hypothesis."""
    from tools.text_normalizer import normalize, wer

    pairs = [(r, h) for r, h in zip(references, hypotheses) if r is not None and h is not None]
    pairs = [(r, h) for r, h in pairs if normalize(r).split()]
    if not pairs:
        return None
    return float(wer([r for r, _ in pairs], [h for _, h in pairs]))


# --------------------------------------------------------------------------- summaries of the measured groups


def summarise(groups: list[dict], references: list, clips_count: int, rows_count: int) -> dict:
    """The summary of a section (batch size 1, or batched): totals, speed-ups, acceptance, exactness, WER."""
    base_ms, medusa_ms = _latency_total(groups, "baseline"), _latency_total(groups, "medusa")
    speedups = [g["speedup"] for g in groups if g["speedup"] is not None]
    tokens = {name: sum(g[name]["tokens"] for g in groups) for name in ("baseline", "medusa")}
    tokens_excl = {name: sum(g[name]["tokens_excl_eos"] for g in groups) for name in ("baseline", "medusa")}
    mean_acc, rate = _accepted_per_round([g["medusa"]["stats"] for g in groups])
    exact_rows = [e for g in groups for e in g["exact_rows"]]
    return {
        "clips": clips_count,
        "rows": rows_count,
        "baseline_latency_ms_total": base_ms,
        "medusa_latency_ms_total": medusa_ms,
        "speedup_sum_latency": ratio(base_ms, medusa_ms),
        "speedup_median": median(speedups),
        "speedup_min": min(speedups) if speedups else None,
        "speedup_max": max(speedups) if speedups else None,
        "speedup_geomean": math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None,
        "baseline_tokens": tokens["baseline"],
        "medusa_tokens": tokens["medusa"],
        "baseline_tokens_excl_eos": tokens_excl["baseline"],
        "medusa_tokens_excl_eos": tokens_excl["medusa"],
        "baseline_tokens_per_s": ratio(tokens["baseline"], base_ms / 1000.0),
        "medusa_tokens_per_s": ratio(tokens["medusa"], medusa_ms / 1000.0),
        "baseline_tokens_per_s_excl_eos": ratio(tokens_excl["baseline"], base_ms / 1000.0),
        "medusa_tokens_per_s_excl_eos": ratio(tokens_excl["medusa"], medusa_ms / 1000.0),
        "mean_accepted_per_round": mean_acc,
        "acceptance_rate": rate,
        "exact_match_rate": ratio(sum(exact_rows), len(exact_rows)),
        "exact_matches": sum(exact_rows),
        "baseline_wer": corpus_wer(references, _texts(groups, "baseline")),
        "medusa_wer": corpus_wer(references, _texts(groups, "medusa")),
        "references": sum(r is not None for r in references),
        "timing_spread_median": _spread(groups),
        "medusa_fallbacks": sum(g["medusa"]["fell_back_to_base"] for g in groups),
        "nondeterministic_groups": sum(not (g["baseline"]["repeats_identical"] and g["medusa"]["repeats_identical"])
                                       for g in groups),
        **_own_greedy_summary(groups),
        **_divergence_summary(groups),
    }


def draft_comparison(summaries: dict) -> dict:
    """The drafts measured side by side in one run (label -> that draft's summary of one section): each one's total
    latency (ms, the sum of its per-clip medians) and, where ``auto`` ran beside fixed drafts (every other draft
    listed, ``none`` included), the fastest of those and ``auto_gap_vs_best_fixed``."""
    totals = {label: summary["medusa_latency_ms_total"] for label, summary in summaries.items()}
    fixed = {label: ms for label, ms in totals.items() if label != "auto"}
    comparison = {"latency_ms_total": totals}
    if "auto" in totals and fixed:
        best = min(fixed, key=fixed.get)
        comparison.update(best_fixed_draft=best, auto_gap_vs_best_fixed=auto_gap(totals["auto"], fixed[best]))
    return comparison


def auto_gap(auto_ms: float, best_fixed_ms: float) -> float:
    """How much slower ``auto`` ran than the fastest fixed draft: 0.0 where it was as fast, 0.05 for 5 % slower
    (negative where it beat every fixed draft, e.g. by choosing per clip)."""
    return auto_ms / best_fixed_ms - 1.0


def _latency_total(groups: list[dict], name: str) -> float:
    return sum(g[name]["latency_ms_median"] for g in groups)


def _texts(groups: list[dict], name: str) -> list:
    """One decoder's text per row over all groups (None per row where it had no tokenizer)."""
    texts = []
    for g in groups:
        texts += g[name]["texts"] if g[name]["texts"] is not None else [None] * len(g["exact_rows"])
    return texts


def _accepted_per_round(stats_list) -> tuple[float | None, float | None]:
    """(tokens the rounds emitted / rows served per round, accepted drafts / drafted tokens)."""
    accepted = sum(s["accepted_tokens"] or 0 for s in stats_list)
    drafted = sum(s["drafted_tokens"] or 0 for s in stats_list)
    emitted = sum(s["emitted_tokens"] or 0 for s in stats_list)
    row_rounds = sum(s["row_rounds"] or 0 for s in stats_list)
    return ratio(emitted, row_rounds), ratio(accepted, drafted)


def _phase_total(groups: list[dict], name: str, phase: str) -> float | None:
    values = [(g[name].get("phases_ms_median") or {}).get(phase) for g in groups]
    return sum(values) if values and all(v is not None for v in values) else None


def _divergence_summary(groups: list[dict]) -> dict:
    """Half precision: how many rows left the base's output, and how many of those at a base near-tie."""
    found = [d for g in groups for d in (g.get("bf16_divergences") or [])]
    return {"divergent_rows": len(found), "divergent_rows_at_base_near_ties": sum(d["base_near_tie"] for d in found)}


def _own_greedy_summary(groups: list[dict]) -> dict:
    """Ours with the draft against our own loop without drafts: end to end, the rounds alone, and the
    cost of one round relative to a plain one."""
    greedy_ms, medusa_ms = _latency_total(groups, "greedy"), _latency_total(groups, "medusa")
    greedy_rounds = _phase_total(groups, "greedy", "rounds_ms")
    medusa_rounds = _phase_total(groups, "medusa", "rounds_ms")
    greedy_passes = sum(g["greedy"]["stats"]["row_rounds"] for g in groups)
    medusa_passes = sum(g["medusa"]["stats"]["row_rounds"] for g in groups)
    ran = sorted({g["medusa"]["stats"]["draft_ran"] for g in groups})
    per_round = lambda ms, n: ratio(ms, n) if ms is not None else None  # noqa: E731
    return {
        "greedy_latency_ms_total": greedy_ms,
        "greedy_tokens_per_s": ratio(sum(g["greedy"]["tokens"] for g in groups), greedy_ms / 1000.0),
        "greedy_rounds_ms_total": greedy_rounds,
        "medusa_rounds_ms_total": medusa_rounds,
        "greedy_prefill_ms_total": _phase_total(groups, "greedy", "prefill_ms"),
        "medusa_prefill_ms_total": _phase_total(groups, "medusa", "prefill_ms"),
        "e2e_speedup_vs_own_greedy": ratio(greedy_ms, medusa_ms),
        "decode_speedup_vs_own_greedy": ratio(greedy_rounds, medusa_rounds) if medusa_rounds is not None else None,
        "round_cost_vs_plain": ratio(per_round(medusa_rounds, medusa_passes), per_round(greedy_rounds, greedy_passes)),
        "draft_ran": ran[0] if len(ran) == 1 else "per clip: " + ", ".join(ran),
    }


def _spread(groups: list[dict]) -> float | None:
    """Median over groups and decoders of (max - min) / median latency: 0 = perfectly repeatable."""
    spreads = [(g[n]["latency_ms_max"] - g[n]["latency_ms_min"]) / g[n]["latency_ms_median"]
               for g in groups for n in ("baseline", "medusa") if g[n]["latency_ms_median"]]
    return median(spreads)


def add_totals(summary: dict, clips: list, feature_ms: list) -> None:
    """Feature-extraction time, audio duration and real-time factors."""
    feature_ms = [f for f in feature_ms if f is not None]
    summary["feature_ms_total"] = sum(feature_ms) if feature_ms else None
    summary["feature_ms_median"] = median(feature_ms)
    durations = [c.duration_s for c in clips if c.duration_s is not None]
    summary["audio_seconds_total"] = sum(durations) if durations else None
    complete = bool(durations) and len(durations) == len(clips)
    for name in ("baseline", "medusa"):
        summary[f"{name}_rtf"] = (summary[f"{name}_latency_ms_total"] / 1000.0 / summary["audio_seconds_total"]
                                  if complete else None)


CLIP_METHOD_KEYS = ("latency_ms_median", "latency_ms_min", "latency_ms_max", "latency_ms_all", "process_cpu_ms_median",
                    "process_cpu_ms_all", "tokens", "tokens_excl_eos", "tokens_per_s", "tokens_per_s_excl_eos",
                    "repeats_identical")


def _clip_method(record: dict, with_stats: bool = False) -> dict:
    """One decoder's part of a clip's record (its only row's text and WER)."""
    out = {k: record[k] for k in CLIP_METHOD_KEYS}
    out["text"] = record["texts"][0] if record["texts"] is not None else None
    out["wer"] = record["wer"][0]
    if with_stats:
        out.update(stats=record["stats"], phases_ms_median=record["phases_ms_median"],
                   fell_back_to_base=record["fell_back_to_base"],
                   stats_new_tokens_match=record["stats_new_tokens_match"])
    return out


def clip_record(clip, group: dict, max_audio) -> dict:
    """A clip's entry in results.json (batch size 1): each decoder's figures and how ours compares."""
    base, greedy, med = group["baseline"], group["greedy"], group["medusa"]
    rounds = lambda rec: rec["phases_ms_median"].get("rounds_ms")  # noqa: E731
    return {
        "id": clip.id,
        "duration_s": clip.duration_s,
        "truncated_to_model_window": bool(clip.duration_s and max_audio and clip.duration_s > max_audio),
        "reference": clip.reference,
        "feature_ms": clip.feature_ms,
        "tokens": base["tokens"],
        "tokens_excl_eos": base["tokens_excl_eos"],
        "baseline": _clip_method(base),
        "greedy": _clip_method(greedy, with_stats=True),
        "medusa": _clip_method(med, with_stats=True),
        "draft_ran": med["stats"]["draft_ran"],
        "speedup": group["speedup"],
        "e2e_speedup_vs_own_greedy": ratio(greedy["latency_ms_median"], med["latency_ms_median"]),
        "decode_speedup_vs_own_greedy": ratio(rounds(greedy), rounds(med)) if rounds(med) else None,
        "mean_accepted_per_round": med["stats"]["mean_accepted_per_round"],
        "acceptance_rate": med["stats"]["acceptance_rate"],
        "exact_match": group["exact_match"],
        "bf16_divergences": group["bf16_divergences"],
    }


def batch_record(index: int, chunk: list, group: dict, feature_ms: float | None) -> dict:
    """A batch's entry in results.json (the batched section)."""
    return {
        "index": index, "ids": [c.id for c in chunk], "rows": len(chunk), "feature_ms": feature_ms,
        "tokens": group["baseline"]["tokens"], "tokens_excl_eos": group["baseline"]["tokens_excl_eos"],
        "baseline": {k: v for k, v in group["baseline"].items() if k != "token_counts_per_row"},
        "medusa": {k: v for k, v in group["medusa"].items() if k != "token_counts_per_row"},
        "speedup": group["speedup"], "exact_rows": group["exact_rows"], "exact_match": group["exact_match"],
        "mean_accepted_per_round": group["medusa"]["stats"]["mean_accepted_per_round"],
    }


# --------------------------------------------------------------------------- notes on a run


def add_notes(results: dict, threads: int, max_audio_seconds: float | None) -> None:
    """What a reader of the tables should know: the definitions, inexact clips, noisy timings, truncation."""
    notes = results.setdefault("notes", [])
    notes.append("tokens/s = new tokens (incl. the EOS) / median generate latency; excl. EOS figures drop it.")
    notes.append("accepted/round = tokens emitted per verify pass (accepted drafts + the base's own token); "
                 "drafted tokens accepted = accepted drafts / drafted (draft depth per row per pass).")
    summary, environment = results["summary"], results["environment"]
    if summary["exact_match_rate"] is not None and summary["exact_match_rate"] < 1.0:
        notes.append(f"Medusa output differed from the baseline on {summary['rows'] - summary['exact_matches']} "
                     "clip(s): see exact_match in results.json.")
    if _timings_noisy(summary, environment):
        notes.append(_noise_note(summary, environment, threads))
    if any(c["truncated_to_model_window"] for c in results["clips"]):
        notes.append(f"Some clips are longer than the model's {max_audio_seconds:.0f} s window; "
                     "their features were truncated.")


def _on_cuda(environment: dict) -> bool:
    return str(environment["device"]).startswith("cuda")


def _timings_noisy(summary: dict, environment: dict) -> bool:
    spread, load = summary.get("timing_spread_median"), environment.get("load_average_at_start")
    cpus = environment.get("cpus_usable") or environment.get("cpu_count") or 1
    others = environment.get("other_processes_cpus")
    if others is not None:  # CPU time other processes took while this run decoded
        busy = others > 0.25 * cpus
    else:  # (runs before that was measured) 1-minute load average before decoding began
        busy = bool(load) and load[0] > cpus * 0.5
    return (spread is not None and spread > 0.2) or (busy and not _on_cuda(environment))


def _noise_note(summary: dict, environment: dict, threads: int) -> str:
    suggest_one_thread = threads > 1 and not _on_cuda(environment)
    return (f"Timings are noisy (median spread {percent(summary.get('timing_spread_median'))} between repeats; "
            f"load average {environment.get('load_average_at_start')} -> {environment.get('load_average_at_end')}, "
            f"other processes {environment.get('other_processes_cpus', 'unmeasured')} CPUs while decoding, "
            f"on {environment.get('cpus_usable')} CPUs): other processes shared the CPU. Rerun on an idle machine"
            + (", or with --threads 1," if suggest_one_thread else "")
            + " with more --repeats before trusting the speed-ups.")


# --------------------------------------------------------------------------- rendering


def _fmt(value, spec=".1f", suffix=""):
    if value is None:
        return "n/a"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    return f"{value:{spec}}{suffix}"


def percent(value):
    return "n/a" if value is None else f"{100 * value:.1f}%"


def render_markdown(results: dict) -> str:
    env, settings, summary = results.get("environment") or {}, results.get("settings") or {}, results["summary"]
    lines = ["# Medusa vs baseline greedy decoding", ""]
    if settings:
        base = settings.get("base_model")
        declared = settings.get("base_model_declared")
        base_text = f"`{declared}` -> `{base}`" if declared and declared != base else f"`{base}`"
        lines += [f"Model: `{settings.get('model')}` (base {base_text}), draft requested: "
                  f"{results['draft_tree']['requested']}, **draft that ran: {summary.get('draft_ran', 'n/a')}**, "
                  f"max new tokens {settings.get('max_new_tokens')}, "
                  f"{settings.get('warmup')} warm-up + {settings.get('repeats')} timed repeats per decoder "
                  "(interleaved, order rotated each repeat; medians). Decoders: the base's own `generate`, our "
                  "loop without drafts (own greedy), ours with the draft.", ""]
    lines += ["## Per clip (batch size 1)", "", _clips_table(results["clips"])]
    lines += ["", "## Summary (batch size 1)", "", _summary_table(summary, results.get("memory"))]
    batched = results.get("batched")
    if batched:
        bs = batched["summary"]
        lines += ["", f"## Batched (batch size {bs['batch_size']})", "", _batches_table(batched["batches"])]
        peaks = batched.get("cuda_peak_bytes")
        memory = ({"method": "torch.cuda.max_memory_allocated, reset before every timed generate; max over batches",
                   "baseline_peak_bytes": peaks["baseline"], "medusa_peak_bytes": peaks["medusa"]} if peaks else None)
        lines += ["", f"### Batched summary (batch size {bs['batch_size']})", "", _summary_table(bs, memory)]
    if env:
        lines += ["", "## Environment", "", _environment_table(env)]
    notes = results.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _clips_table(clips: list[dict]) -> str:
    rows = [[c["id"], _fmt(c["duration_s"], ".2f"), c["tokens"], _fmt(c["baseline"]["latency_ms_median"]),
             _fmt(c["greedy"]["latency_ms_median"]), _fmt(c["medusa"]["latency_ms_median"]), c["draft_ran"],
             _fmt(c["speedup"], ".2f", "x"), _fmt(c["decode_speedup_vs_own_greedy"], ".2f", "x"),
             _fmt(c["mean_accepted_per_round"], ".2f"), "yes" if c["exact_match"] else "**NO**"] for c in clips]
    return markdown_table(["id", "duration (s)", "tokens", "HF generate ms", "own greedy ms", "ours ms", "draft ran",
                           "vs HF", "rounds vs own greedy", "accepted/round", "exact"], rows)


def _batches_table(batches: list[dict]) -> str:
    rows = [[b["index"], b["rows"], b["tokens"], _fmt(b["baseline"]["latency_ms_median"]),
             _fmt(b["medusa"]["latency_ms_median"]), _fmt(b["speedup"], ".2f", "x"),
             _fmt(b["mean_accepted_per_round"], ".2f"), f"{sum(b['exact_rows'])}/{len(b['exact_rows'])}"]
            for b in batches]
    return markdown_table(["batch", "clips", "tokens", "baseline ms", "medusa ms", "speed-up", "accepted/round",
                           "exact rows"], rows)


def _environment_table(env: dict) -> str:
    git = env.get("git") or {}
    commit = (git.get("commit", "")[:12] + (" (uncommitted changes)" if git.get("dirty") else "")) if git else "n/a"
    rows = [("date (UTC)", env.get("date")), ("device", f"{env.get('device')}: {env.get('device_name')}"),
            ("CPUs (count / usable)", f"{env.get('cpu_count')} / {env.get('cpus_usable')}"),
            ("torch threads", env.get("torch_threads")), ("load average at start", env.get("load_average_at_start")),
            ("other processes' CPUs while decoding", env.get("other_processes_cpus")),
            ("torch", env.get("torch_version")), ("transformers", env.get("transformers_version")),
            ("python", env.get("python_version")), ("dtype", env.get("dtype")), ("git commit", commit)]
    return markdown_table(["", ""], rows)


def _summary_table(s: dict, memory: dict | None) -> str:
    rows = [
        ("clips", s["clips"]),
        ("audio (s)", _fmt(s.get("audio_seconds_total"), ".1f")),
        ("speed-up (sum of latencies)", _fmt(s["speedup_sum_latency"], ".2f", "x")),
        ("speed-up per clip (per batch when batched): median (min-max)",
         f"{_fmt(s['speedup_median'], '.2f', 'x')} ({_fmt(s['speedup_min'], '.2f')}-{_fmt(s['speedup_max'], '.2f')})"),
        ("latency total: baseline / medusa (ms)",
         f"{_fmt(s['baseline_latency_ms_total'])} / {_fmt(s['medusa_latency_ms_total'])}"),
        ("tokens/s: baseline / medusa", f"{_fmt(s['baseline_tokens_per_s'])} / {_fmt(s['medusa_tokens_per_s'])}"),
        ("draft that ran", s.get("draft_ran", "n/a")),
        ("own greedy (our loop, no drafts): latency total (ms) / tokens/s",
         f"{_fmt(s.get('greedy_latency_ms_total'))} / {_fmt(s.get('greedy_tokens_per_s'))}"),
        ("vs own greedy: end to end / the rounds alone",
         f"{_fmt(s.get('e2e_speedup_vs_own_greedy'), '.2f', 'x')} / {_fmt(s.get('decode_speedup_vs_own_greedy'), '.2f', 'x')}"),
        ("rounds total: own greedy / ours (ms); one round vs a plain one",
         f"{_fmt(s.get('greedy_rounds_ms_total'))} / {_fmt(s.get('medusa_rounds_ms_total'))}; "
         f"{_fmt(s.get('round_cost_vs_plain'), '.2f', 'x')}"),
        ("tokens/s excl. EOS: baseline / medusa",
         f"{_fmt(s['baseline_tokens_per_s_excl_eos'])} / {_fmt(s['medusa_tokens_per_s_excl_eos'])}"),
        ("tokens (incl. / excl. EOS)", f"{s['baseline_tokens']} / {s['baseline_tokens_excl_eos']}"),
        ("mean accepted tokens per round", _fmt(s["mean_accepted_per_round"], ".3f")),
        ("drafted tokens accepted", percent(s["acceptance_rate"])),
        ("exact match (Medusa == baseline token ids)",
         f"{percent(s['exact_match_rate'])} ({s['exact_matches']}/{s['rows']})"),
        ("rows that left the base's output / at a base near-tie (half precision)",
         f"{s.get('divergent_rows', 0)} / {s.get('divergent_rows_at_base_near_ties', 0)}"),
        ("WER baseline / medusa (normalised)", f"{percent(s['baseline_wer'])} / {percent(s['medusa_wer'])}"),
    ]
    comparison = s.get("draft_comparison") or {}
    if len(comparison.get("latency_ms_total") or {}) > 1:
        rows.append(("drafts measured in this run: latency total (ms)", ", ".join(
            f"{label} {_fmt(ms)}" for label, ms in comparison["latency_ms_total"].items())))
    if comparison.get("best_fixed_draft"):
        rows.append(("auto vs the fastest fixed draft of this run", gap_cell(comparison)))
    if s.get("feature_ms_total") is not None:
        rows.append(("feature extraction total / median per item (ms, not in latencies)",
                     f"{_fmt(s['feature_ms_total'])} / {_fmt(s['feature_ms_median'])}"))
    if s.get("baseline_rtf") is not None:
        rows.append(("real-time factor: baseline / medusa", f"{_fmt(s['baseline_rtf'], '.3f')} / {_fmt(s['medusa_rtf'], '.3f')}"))
    if s.get("timing_spread_median") is not None:
        rows.append(("timing spread: median (max-min)/median over repeats", percent(s["timing_spread_median"])))
    if s.get("medusa_fallbacks"):
        rows.append(("Medusa fell back to base generate", s["medusa_fallbacks"]))
    if s.get("nondeterministic_groups"):
        rows.append(("clips whose output changed between repeats", s["nondeterministic_groups"]))
    if memory:
        if "medusa_peak_bytes" in memory:
            rows.append(("peak GPU memory: baseline / medusa (MiB)",
                         f"{_mib(memory['baseline_peak_bytes'])} / {_mib(memory['medusa_peak_bytes'])}"))
        else:
            rows.append(("peak RSS of the process (MiB; after model load)",
                         f"{_mib(memory.get('peak_rss_bytes'))} ({_mib(memory.get('peak_rss_after_load_bytes'))})"))
        rows.append(("memory measured with", memory["method"]))
    return markdown_table(["metric", "value"], rows)


def device_label(row: dict) -> str:
    """A summary row's device for a table: the GPU's model ("NVIDIA H100 80GB HBM3" -> "H100"), else ``CPU (name)``
    without trademark marks."""
    if row.get("gpu"):
        return re.sub(r"^NVIDIA\s+|\s+\d+\s*GB\b.*$", "", row["gpu"]) or row["gpu"]
    name = re.sub(r"\((R|TM)\)|\bProcessor\b|\bCPU\b", " ", row.get("cpu") or "unnamed")
    return f"CPU ({' '.join(name.split())})"


def gap_cell(record: dict) -> str:
    """``auto_gap_vs_best_fixed`` and ``best_fixed_draft`` of a summary row or a ``draft_comparison`` as text
    ("+2.1 % (chain)"), or "" where it has none."""
    if record.get("auto_gap_vs_best_fixed") is None:
        return ""
    return f"{100 * record['auto_gap_vs_best_fixed']:+.1f} % ({record['best_fixed_draft']})"


def render_comparison(comparison: dict) -> str:
    """The drafts of one run side by side (``draft_comparison``), as Markdown."""
    totals = comparison["latency_ms_total"]
    fastest = min(totals.values())
    rows = [[label, _fmt(ms), f"{100 * (ms / fastest - 1):+.1f} %"] for label, ms in totals.items()]
    text = "\n## Drafts measured in this run (batch size 1)\n\n" + markdown_table(
        ["draft", "latency total (ms)", "vs the fastest"], rows) + "\n"
    if comparison.get("best_fixed_draft"):
        text += f"\nauto vs the fastest fixed draft: {gap_cell(comparison)}\n"
    return text


def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f}"


# --------------------------------------------------------------------------- writing


def write_plot(results: dict, path: Path) -> str | None:
    """Speed-up per clip vs output tokens (``tools.plot_lengths``); returns why it was skipped, or None when written."""
    from tools.plot_lengths import draw

    return draw([results], path)


def write_outputs(results: dict, out_dir: Path, plot: bool = True) -> dict:
    """Write results.json, results.md and the plot; returns {name: path or skip reason}."""
    out_dir = Path(out_dir)
    written = {}
    if plot:
        skipped = write_plot(results, out_dir / PLOT_NAME)
        results["plot"] = PLOT_NAME if skipped is None else None
        if skipped:
            results.setdefault("notes", []).append(f"{PLOT_NAME} not written: {skipped}.")
        written["plot"] = str(out_dir / PLOT_NAME) if skipped is None else f"skipped ({skipped})"
    markdown = render_markdown(results)
    write_json_atomic(out_dir / "results.json", results, ensure_ascii=False)
    write_atomic(out_dir / "results.md", markdown)
    written.update(json=str(out_dir / "results.json"), markdown=str(out_dir / "results.md"))
    return written


# --------------------------------------------------------------------------- the summary across runs

SUMMARY_KEY = ("model", "device", "gpu", "cpu", "dtype", "requested_draft", "rounds_mode", "timestamps", "batch")
SUMMARY_DEFAULTS = {"batch": 1}  # rows written before the field existed


def summary_row(results: dict, command: str) -> dict:
    """One row of ``benchmarks/real_speech/summary.json``: this run's headline figures, all measured
    side by side in it (the per-clip data stays in its results.json); a batched run's are its batched section's."""
    env, settings = results["environment"], results["settings"]
    batch = settings.get("batch_size") or 1
    summary = results["batched"]["summary"] if batch > 1 and results.get("batched") else results["summary"]
    cuda = str(env["device"]).startswith("cuda")
    mode = "compiled" if settings.get("compile") else (
        "graph" if cuda and settings.get("cuda_graph") != "off" else "eager")
    return {
        "model": Path(str(settings.get("base_model_declared") or settings["model"])).name,
        "heads": str(settings["model"]), "device": "cuda" if cuda else "cpu",
        "gpu": env["device_name"] if cuda else None, "cpu": None if cuda else env["device_name"],
        "dtype": env["dtype"], "draft": summary["draft_ran"], "requested_draft": settings["draft"],
        "rounds_mode": mode, "timestamps": True if settings.get("timestamps") else None,  # (None: rows without)
        "batch": batch, "clips": summary["clips"], "exact_match_rate": summary["exact_match_rate"],
        "divergent_rows_at_base_near_ties": f"{summary['divergent_rows_at_base_near_ties']}/{summary['divergent_rows']}",
        "mean_accepted_per_round": summary["mean_accepted_per_round"],
        "tokens_per_s": summary["medusa_tokens_per_s"], "baseline_hf_tokens_per_s": summary["baseline_tokens_per_s"],
        "own_greedy_tokens_per_s": summary["greedy_tokens_per_s"],
        **clips_per_s_fields(summary),
        "speedup_vs_hf_generate": summary["speedup_sum_latency"],
        "decode_speedup_vs_own_greedy": summary["decode_speedup_vs_own_greedy"],
        "e2e_speedup_vs_own_greedy": summary["e2e_speedup_vs_own_greedy"],
        "round_cost_vs_plain": summary["round_cost_vs_plain"],
        **auto_gap_fields(settings["draft"], summary.get("draft_comparison")),
        "decode_share_of_call": ratio(summary["greedy_rounds_ms_total"], summary["greedy_latency_ms_total"]),
        "wer_hf": summary["baseline_wer"], "wer_ours": summary["medusa_wer"],
        "timing_spread_median": summary.get("timing_spread_median"),
        "load_average": [env.get("load_average_at_start"), env.get("load_average_at_end")],
        "date": str(env["date"])[:10], "torch": env["torch_version"], "transformers": env["transformers_version"],
        "results": None, "command": command,
    }


def clips_per_s_fields(summary: dict) -> dict:
    """Clips a second (each clip one request) of ours, our greedy loop and ``generate``: the run's clips over each
    decoder's total latency (a batched run's batches one after another)."""
    fields = {"clips_per_s": "medusa_latency_ms_total", "own_greedy_clips_per_s": "greedy_latency_ms_total",
              "baseline_hf_clips_per_s": "baseline_latency_ms_total"}
    return {name: ratio(1000 * summary["clips"], summary.get(total)) for name, total in fields.items()}


def auto_gap_fields(draft: str, comparison: dict | None) -> dict:
    """An ``auto`` row's ``auto_gap_vs_best_fixed`` and ``best_fixed_draft``, where fixed drafts ran beside it."""
    if draft != "auto" or not (comparison or {}).get("best_fixed_draft"):
        return {}
    return {key: comparison[key] for key in ("auto_gap_vs_best_fixed", "best_fixed_draft")}


def merge_summaries(sources: list[Path], into: Path, make_row=None, key: tuple | None = None) -> int:
    """Add rows to ``into`` from other summary lists (e.g. written on another machine, their results folders
    copied beside ``into``) or straight from results files (``results.json``, with the command inside); each row's
    results path is made relative to ``into``, and a row whose results file is there is made again from it by
    ``make_row`` (the same figures, in this version's row format; default ``summary_row``, keyed by ``SUMMARY_KEY``)."""
    make_row, key = make_row or summary_row, key or SUMMARY_KEY
    count = 0
    for source in sources:
        loaded = json.loads(Path(source).read_text())
        if isinstance(loaded, dict):  # a results file
            if not loaded.get("settings", {}).get("command"):
                raise ValueError(f"{source}: no settings.command (written before the benchmark recorded it)")
            loaded = [{"results": Path(source).name, "command": loaded["settings"]["command"]}]
        for row in loaded:
            if row.get("results"):
                results = (Path(source).resolve().parent / row["results"]).resolve()
                if results.exists():
                    row = make_row(json.loads(results.read_text()), row["command"])
                row["results"] = os.path.relpath(results, into.resolve().parent)
            update_summary(into, row, key)
            count += 1
    return count


QUANTISED_SUMMARY_KEY = ("model", "precision", "kernel", "device", "gpu", "batch", "requested_draft", "rounds_mode")


def quantised_row(results: dict, command: str) -> dict:
    """One row of ``benchmarks/quantised/summary.json``: a verifier of some precision with the same heads,
    against its own greedy output (exact match, WER of that base, accepted tokens per round, speed)."""
    row, settings = summary_row(results, command), results["settings"]
    return {"model": row["model"], "precision": settings.get("precision"), "kernel": settings.get("kernel"),
            "base": settings.get("base_model"), "device": row["device"], "gpu": row["gpu"], "dtype": row["dtype"],
            "batch": settings.get("batch_size") or 1, "draft": row["draft"], "requested_draft": row["requested_draft"],
            "clips": row["clips"], "exact_match_rate": row["exact_match_rate"],
            "divergent_rows_at_base_near_ties": row["divergent_rows_at_base_near_ties"],
            "mean_accepted_per_round": row["mean_accepted_per_round"], "wer": row["wer_hf"], "wer_ours": row["wer_ours"],
            "tokens_per_s": row["tokens_per_s"], "own_greedy_tokens_per_s": row["own_greedy_tokens_per_s"],
            "speedup_vs_own_greedy": row["e2e_speedup_vs_own_greedy"],
            "decode_speedup_vs_own_greedy": row["decode_speedup_vs_own_greedy"],
            "verify_ms_by_tokens": None, "replayed": False, "date": row["date"], "torch": row["torch"],
            "transformers": row["transformers"], "command": command}


def summary_key(row: dict, key: tuple = SUMMARY_KEY) -> tuple:
    """What ``row`` measured: its ``key`` fields (model, device, dtype, draft, rounds mode... by default), a CPU row's
    CPU among them (a GPU row's machine is its GPU, whichever host CPU drove it)."""
    return tuple(None if k == "cpu" and row.get("gpu") else row.get(k, SUMMARY_DEFAULTS.get(k)) for k in key)


def update_summary(path: Path, row: dict, key: tuple = SUMMARY_KEY) -> None:
    """Add ``row`` to the summary list, replacing an earlier row that measured the same (``summary_key``);
    written atomically."""
    def fields(r):
        return summary_key(r, key)

    rows = json.loads(path.read_text()) if path.exists() else []
    rows = replace_rows(rows, [row], fields)
    rows.sort(key=lambda r: tuple(str(v) for v in fields(r)))
    write_json_atomic(path, rows, indent=1)
