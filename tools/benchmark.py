#!/usr/bin/env python
"""Benchmark plain greedy decoding against Medusa decoding on real speech.

    python -m tools.benchmark                                   # heads/whisper-tiny.en on work_data/eval_speech
    python -m tools.benchmark --model heads/whisper-tiny.en --audio work_data/eval_speech/manifest.jsonl \
        --device cpu --dtype float32 --repeats 3 --warmup 1 --max-new-tokens 128 --out benchmarks/cpu

For every clip of a manifest.jsonl ({"id", "audio", "text", ...}; relative audio paths are relative
to the manifest) the features are prepared once (timed separately), then the same inputs are decoded
``--warmup`` times and ``--repeats`` timed times by each decoder, interleaved (in a new seeded order every
repeat, so drift and cache effects fall on all alike), with a device synchronisation around each
timed call. The baseline is the base model's own ``generate`` (``use_medusa=False``); Medusa is the
same call with the heads. Reported latencies are medians of the timed repeats; every raw timing is
kept in results.json. ``--batch-size N`` (N > 1) adds a section that decodes the same clips N at a
time, batched baseline against batched Medusa. ``--draft auto,none,chain,tree-16`` (a comma list) times every
listed draft beside the same baseline in one run, interleaved per clip: a results folder per draft (``OUT/DRAFT/``),
and ``auto``'s summary says how much slower it ran than the fastest fixed draft listed (``draft_comparison``).

Outputs: Markdown tables on stdout, ``OUT/results.json`` (everything), ``OUT/results.md`` (the
tables) and ``OUT/speedup_vs_length.png`` (when matplotlib is installed), all written atomically.

This file measures and holds the command line; the manifest, the artifact and the clips' features come from
``tools.benchmark_inputs``, the machine and memory records from ``tools.benchmark_environment``, the records,
summaries, notes and tables from ``tools.benchmark_report``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from functools import partial
from pathlib import Path

from tools import cli_args, runtime
from tools.files import command_line
from tools.benchmark_inputs import (BenchmarkError, Clip, as_clip, base_precision, DEFAULT_MANIFEST, DEFAULT_MODEL,
                                    load_clips, load_model, read_manifest, resolve_artifact)
from tools.benchmark_environment import (cpu_seconds, environment_info, load_average, memory_info,
                                         other_processes_cpus, peak_rss_bytes)
from tools.benchmark_report import (add_notes, add_totals, batch_record, clip_record, clip_wer, draft_comparison,
                                    median, merge_summaries, PLOT_NAME, quantised_row, QUANTISED_SUMMARY_KEY, ratio,
                                    render_markdown, render_comparison, summarise, SUMMARY_KEY, summary_row,
                                    update_summary, write_outputs)

DEFAULT_OUT = "work_data/benchmarks/latest"  # committed results are written only where asked (--out)
PROMPT_OPTIONS = ("language", "task")  # generate inputs that are options, not tensors
PHASES = ("prefill_seconds", "setup_seconds", "rounds_seconds")  # our loop's phases (generate's return_stats)
SCHEMA_VERSION = 1
TIMING = ("median of the timed repeats of generate(); features prepared once per clip outside the timing; "
          "decoders interleaved, in a new seeded order each repeat; device synchronised around each call")
EXIT_OK, EXIT_ERROR = 0, 2


# --------------------------------------------------------------------------- small helpers


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
        self.decoder_only = getattr(backbone, "output_has_prompt", False)

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


# --------------------------------------------------------------------------- measurement


class Timer:
    """Runs generate for every decoder on the same inputs: warm-up, then interleaved timed repeats.

    Decoders: ``baseline`` (the base's own generate), ``greedy`` (our decode loop without drafts: the
    bar speculation must clear) and one per requested draft (``drafts``: label -> draft, e.g. ``{"auto": "auto"}``;
    our loop with that draft). A draft ``none`` is the ``greedy`` decoder itself, not run twice."""

    def __init__(self, model, max_new_tokens: int, drafts: dict, repeats: int, warmup: int, medusa_kwargs=None,
                 generate_kwargs=None):
        self.model = model
        self.medusa_kwargs = dict(medusa_kwargs or {})  # extra generate options for our loop (graph, compile)
        self.generate_kwargs = dict(generate_kwargs or {})  # options of every decoder's call (e.g. timestamps)
        self.max_new_tokens = max_new_tokens
        self.drafts = dict(drafts)
        self.repeats = repeats
        self.warmup = warmup
        self.device = runtime.model_device(model)
        self.cuda = str(self.device).startswith("cuda")
        self.sync = partial(runtime.synchronize, self.device)
        self.methods = ("baseline", "greedy", *dict.fromkeys(self.method(label) for label in self.drafts
                                                              if self.method(label) != "greedy"))
        self.peak_bytes = {name: 0 for name in self.methods}  # cuda only
        self.order = random.Random(0)

    def method(self, label: str) -> str:
        """The decoder that runs the draft ``label``: ``greedy`` for no draft, else the label itself."""
        return "greedy" if _is_plain(self.drafts[label]) else label

    def _generate(self, inputs, name: str):
        if name == "baseline":
            return self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, use_medusa=False,
                                       return_stats=True, **self.generate_kwargs)
        draft = "none" if name == "greedy" else self.drafts[name]
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
        for _ in range(self.repeats):
            # a new order every repeat (seeded: the same run orders alike), so that no decoder always follows the
            # same one (a rotation kept auto right after plain greedy) and drift and caches fall on all alike
            for name in self.order.sample(self.methods, len(self.methods)):
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
    median_ms = median(times_ms)
    return {
        "latency_ms_median": median_ms,
        "latency_ms_min": min(times_ms),
        "latency_ms_max": max(times_ms),
        "latency_ms_all": times_ms,
        "process_cpu_ms_median": median(cpu_ms),
        "process_cpu_ms_all": cpu_ms,
        "tokens": tokens_total,
        "tokens_excl_eos": tokens_excl_total,
        "tokens_per_s": ratio(tokens_total, median_ms / 1000.0),
        "tokens_per_s_excl_eos": ratio(tokens_excl_total, median_ms / 1000.0),
        "texts": texts,
        "wer": wers,
        "token_counts_per_row": rows_counts,
    }


def _stats_record(stats: dict) -> dict:
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


def measure_groups(timer: Timer, counter: TokenCounter, inputs: dict, references: list) -> dict:
    """Time one set of inputs (one clip or one batch) with every decoder; compare and score them: label -> that
    draft's group (the baseline, our own greedy loop and ours with the draft, as ``medusa``)."""
    result = timer.run(inputs)
    per_method, rows_by_method = {}, {}
    for name in timer.methods:
        sequences, stats = result["outputs"][name]
        rows = counter.rows(sequences, inputs)
        counts = [counter.counts(r) for r in rows]
        texts = _decode_texts(timer.model, sequences, inputs)
        hyps = texts if texts is not None else [None] * len(rows)
        wers = [clip_wer(r, h) for r, h in zip(references, hyps)]
        record = _method_record(result["times_ms"][name], result["cpu_times_ms"][name], [list(c) for c in counts],
                                texts, wers,
                                sum(c[0] for c in counts), sum(c[1] for c in counts))
        record["repeats_identical"] = result["repeats_identical"][name]
        if name != "baseline":
            record["stats"] = _stats_record(stats)
            record["phases_ms_median"] = {phase.replace("_seconds", "_ms"): median([p[phase] for p in
                                                                                     result["phases_ms"][name]])
                                          for phase in PHASES if result["phases_ms"][name][0].get(phase) is not None}
            # Our loop always emits >= 1 token per row; 0 means generate fell back to the base.
            record["fell_back_to_base"] = stats.get("new_tokens", 0) == 0
            record["stats_new_tokens_match"] = stats.get("new_tokens") == record["tokens"]
        per_method[name] = record
        rows_by_method[name] = rows
    return {label: _draft_group(timer, inputs, per_method, rows_by_method, timer.method(label))
            for label in timer.drafts}


def _draft_group(timer: Timer, inputs: dict, per_method: dict, rows_by_method: dict, ours: str) -> dict:
    """One draft's group: the baseline, our own greedy loop and ``ours`` (the decoder of that draft) compared."""
    exact_rows = [a == b for a, b in zip(rows_by_method["baseline"], rows_by_method[ours])]
    exact_rows += [False] * abs(len(rows_by_method["baseline"]) - len(rows_by_method[ours]))
    greedy_exact = [a == b for a, b in zip(rows_by_method["baseline"], rows_by_method["greedy"])]
    divergences = None
    if not all(exact_rows) and _half_precision(timer.model):
        divergences = _bf16_divergences(timer, inputs, rows_by_method["baseline"], rows_by_method[ours])
    return {
        "baseline": per_method["baseline"],
        "greedy": per_method["greedy"],
        "medusa": per_method[ours],
        "speedup": ratio(per_method["baseline"]["latency_ms_median"], per_method[ours]["latency_ms_median"]),
        "exact_rows": exact_rows,
        "exact_match": all(exact_rows) and all(greedy_exact),
        "bf16_divergences": divergences,
    }


def _half_precision(model) -> bool:
    import torch

    return getattr(model, "dtype", None) in (torch.bfloat16, torch.float16)


def _bf16_divergences(timer: Timer, inputs: dict, expected_rows: list, got_rows: list) -> list:
    """Where ours left the base's half-precision greedy output, whether the base itself had a near-tie
    there (top-2 scores within bf16 rounding: see tools/bf16_ties.py) — the one way a lossless
    verifier may differ in half precision."""
    from tools.bf16_ties import check_bf16_row, first_divergence

    result = timer.model.base.generate(**inputs, **timer.generate_kwargs, max_new_tokens=timer.max_new_tokens,
                                       output_scores=True, return_dict_in_generate=True)
    scores = base_step_scores(result, len(expected_rows))
    eos = (timer.model.backbone.eos_token_ids or [None])[0]
    ended = lambda row: row + [eos] if len(row) < timer.max_new_tokens else row  # noqa: E731 (the EOS is a choice too)
    out = []
    for row, (expected, got) in enumerate(zip(expected_rows, got_rows)):
        expected, got = ended(expected), ended(got)
        if expected != got:
            problem = check_bf16_row(expected, got, scores[row][:len(expected)])
            out.append({"row": row, "at_new_token": first_divergence(expected, got), "base_near_tie": problem is None,
                        "problem": problem})
    return out


def base_step_scores(result, rows: int) -> list[list]:
    """Per row, the base's processed scores [V] at each of its new tokens, from its ``generate(output_scores=True,
    return_dict_in_generate=True)``: the call's own ``scores``, or with Whisper timestamps (a dict of sequences and
    segments) those its segments' windows kept (``segment_scores``)."""
    if isinstance(result, dict) and "segments" in result:
        return [segment_scores(segments) for segments in result["segments"]]
    return [[step[row] for step in result.scores] for row in range(rows)]


def segment_scores(segments: list[dict]) -> list:
    """The scores at each token of a row's segments, in order, then at the EOS that ended the last window: a
    segment's tokens are positions ``idxs`` of its window's output (``result``: sequences with the decoder prompt,
    scores of the new tokens only)."""
    out, scores, after = [], [], 0
    for segment in segments:
        scores = segment["result"]["scores"]
        offset = segment["result"]["sequences"].shape[-1] - len(scores)  # the window's decoder prompt
        start, end = segment["idxs"]
        out.extend(scores[start - offset:end - offset])
        after = end - offset
    if after < len(scores):
        out.append(scores[after])  # the step after the last kept token: EOS, or the next window's
    return out


def _stack_inputs(clips: list[Clip], model) -> tuple[dict, float | None]:
    """Batch inputs for a group of clips: from the audio via the processor when possible (timed),
    else by concatenating the per-clip inputs (which must then have equal shapes)."""
    if all(c.audio is not None for c in clips) and getattr(model, "processor", None) is not None:
        start = time.perf_counter()
        options = {k: v for k, v in clips[0].inputs.items() if k in PROMPT_OPTIONS}
        inputs = runtime.to_model(model.prepare_audio_inputs([c.audio for c in clips], **options), model)
        runtime.synchronize(model)
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


def run_benchmark(model, clips, *, draft="auto", **options) -> dict:
    """Baseline greedy vs Medusa with ``draft`` on ``clips`` (``Clip`` objects or ``(id, inputs, reference)``); the
    ``options`` of ``run_drafts``. Returns the results dict written to results.json, less the environment/settings
    of the caller."""
    [results] = run_drafts(model, clips, [draft], **options).values()
    return results


def run_drafts(model, clips, drafts: list, *, repeats: int = 3, warmup: int = 1, max_new_tokens: int = 128,
               batch_size: int | None = None, progress: bool = True, medusa_kwargs: dict | None = None,
               generate_kwargs: dict | None = None) -> dict:
    """Every draft of ``drafts`` against the same baseline and own greedy loop on the same ``clips``, interleaved
    per clip by one ``Timer`` (so a slow moment of the machine falls on every draft alike); ``generate_kwargs`` reach
    every decoder's call (e.g. ``return_timestamps=True``). Returns label (``requested_label``) -> the results dict
    ``run_benchmark`` returns for that draft, each summary with the ``draft_comparison`` of the drafts measured."""
    if repeats < 1:
        raise BenchmarkError("--repeats must be >= 1")
    if warmup < 0:
        raise BenchmarkError("--warmup must be >= 0")
    clips = [as_clip(c) for c in clips]
    if not clips:
        raise BenchmarkError("no clips to benchmark")
    labelled = {requested_label(d): d for d in sorted(drafts, key=lambda d: d != "auto")}  # auto's first call first
    if len(labelled) != len(drafts):
        raise BenchmarkError("a draft is listed twice")
    timer = Timer(model, max_new_tokens, labelled, repeats, warmup, medusa_kwargs, generate_kwargs)
    counter = TokenCounter(model, max_new_tokens)
    max_audio = getattr(model, "max_audio_seconds", None)

    items = [(runtime.to_model(clip.inputs, model), [clip.reference], partial(clip_record, clip, max_audio=max_audio))
             for clip in clips]
    for clip, (inputs, _, _) in zip(clips, items):
        if _batch_rows(inputs) != 1:
            raise BenchmarkError(f"clip {clip.id!r}: inputs must hold one row (batch size 1)")
    sections = _measure_section(timer, counter, items, clips, [c.feature_ms for c in clips], ("clips", "clip"),
                                progress)
    cuda_peak = {label: _peaks(timer, label) for label in labelled}
    batched = None
    if batch_size and batch_size > 1:
        timer.peak_bytes = {name: 0 for name in timer.methods}
        batched = _run_batched(model, clips, batch_size, timer, counter, progress)
    out = {}
    for label, draft in labelled.items():
        records, summary = sections[label]
        out[label] = {"clips": records, "summary": summary, "batched": batched[label] if batched else None,
                      "draft_tree": _draft_info(model, label, draft), "cuda_peak_bytes": cuda_peak[label]}
    return out


def requested_label(draft) -> str:
    """How a run names a requested draft: its name, ``none`` for no paths, ``paths`` for explicit paths."""
    return draft if isinstance(draft, str) else ("paths" if draft else "none")


def _is_plain(draft) -> bool:
    return requested_label(draft) == "none"


def _peaks(timer: Timer, label: str) -> dict | None:
    """The peak GPU memory of the baseline, our own greedy loop and ours with ``label``'s draft (cuda only)."""
    if not timer.cuda:
        return None
    return {"baseline": timer.peak_bytes["baseline"], "greedy": timer.peak_bytes["greedy"],
            "medusa": timer.peak_bytes[timer.method(label)]}


def _draft_info(model, label: str, draft) -> dict:
    """What results.json records of the draft: the tree it resolves to and what ``auto`` timed (its run only)."""
    tree = model.draft_tree(draft)
    return {"requested": draft if isinstance(draft, str) else "paths", "chain": tree.is_chain,
            "depth": tree.depth, "nodes": tree.num_nodes, "paths": [list(p) for p in tree.paths],
            "auto_measurements": model.draft_policy.measurements() if label == "auto" else []}


def _measure_section(timer, counter, items: list, clips: list, feature_ms: list, bar: tuple, progress: bool) -> dict:
    """Each item (inputs, references, record maker) timed with every decoder: label -> (the records, the summary
    with the ``draft_comparison`` of every draft measured); ``bar``: the progress bar's description and unit."""
    from tqdm import tqdm

    groups = {label: [] for label in timer.drafts}
    records = {label: [] for label in timer.drafts}
    for inputs, references, make_record in tqdm(items, desc=bar[0], unit=bar[1], disable=not progress,
                                                file=sys.stderr):
        for label, group in measure_groups(timer, counter, inputs, references).items():
            groups[label].append(group)
            records[label].append(make_record(group))
    summaries = {}
    for label in timer.drafts:
        summaries[label] = summarise(groups[label], [c.reference for c in clips], len(clips), len(clips))
        add_totals(summaries[label], clips, feature_ms)
    comparison = draft_comparison(summaries)
    for summary in summaries.values():
        summary["draft_comparison"] = comparison
    return {label: (records[label], summaries[label]) for label in timer.drafts}


def _run_batched(model, clips, batch_size, timer, counter, progress) -> dict:
    """The batched section of every draft: label -> its batches and summary."""
    chunks = [clips[i:i + batch_size] for i in range(0, len(clips), batch_size)]
    items, feature_ms = [], []
    for index, chunk in enumerate(chunks):
        inputs, features = _stack_inputs(chunk, model)
        items.append((runtime.to_model(inputs, model), [c.reference for c in chunk],
                      partial(batch_record, index, chunk, feature_ms=features)))
        feature_ms.append(features)
    sections = _measure_section(timer, counter, items, clips, feature_ms, (f"batches of {batch_size}", "batch"),
                                progress)
    out = {}
    for label, (records, summary) in sections.items():
        summary.update(batches=len(chunks), batch_size=batch_size)
        out[label] = {"batches": records, "summary": summary, "cuda_peak_bytes": _peaks(timer, label)}
    return out


# --------------------------------------------------------------------------- command line


def draft_option(value: str) -> str:
    from draft_policy import DRAFT_NAMES, sized_tree_nodes

    if value in DRAFT_NAMES or sized_tree_nodes(value) is not None:
        return value
    raise argparse.ArgumentTypeError(f"{value!r}: use auto, chain, tree, tree-N or none")


def drafts_option(value: str) -> list[str]:
    """``--draft``: one draft (``draft_option``) or a comma list of different ones, all measured in one run."""
    drafts = [draft_option(part.strip()) for part in value.split(",")]
    if len(set(drafts)) != len(drafts):
        raise argparse.ArgumentTypeError(f"{value!r}: each draft once")
    return drafts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="folder (or Hub repo) with the Medusa heads")
    parser.add_argument("--audio", default=DEFAULT_MANIFEST, help="manifest.jsonl of clips")
    parser.add_argument("--base", default=None,
                        help="base folder instead of the one the heads name (e.g. a quantised copy: pipeline.quantise)")
    cli_args.add_trust_base_code(parser)
    runtime.add_device_options(parser, device="cpu", dtype="float32", threads=2)
    parser.add_argument("--repeats", type=cli_args.positive_int, default=3, help="timed runs per decoder per clip (median reported)")
    parser.add_argument("--warmup", type=cli_args.non_negative_int, default=1, help="untimed runs per decoder per clip")
    parser.add_argument("--max-new-tokens", type=cli_args.positive_int, default=None,
                        help="new tokens per clip (default: the family's, its backbone's default_max_new_tokens)")
    parser.add_argument("--draft", default="auto", type=drafts_option,
                        help="auto: the fastest of plain / chain / trees on this device (timed); chain; tree (the "
                             "artifact's); tree-N (its N-node tree); none: our decode loop without drafts (isolates "
                             "the loop's own speed). A comma list (auto,none,chain,tree-16) measures each on the same "
                             "clips in one run, interleaved per clip: OUT/DRAFT/ per draft, a summary row each, and "
                             "auto's row says how much slower it ran than the fastest fixed draft listed")
    parser.add_argument("--language", default=None,
                        help="multilingual Whisper: language code of the clips (default: detected per clip)")
    parser.add_argument("--task", default=None, choices=["transcribe", "translate"],
                        help="multilingual Whisper: task (default: the model's own, transcribe)")
    parser.add_argument("--batch-size", type=cli_args.positive_int, default=None,
                        help="also run a batched section, N clips per batch (N > 1)")
    parser.add_argument("--cuda-graph", default="auto", choices=["auto", "on", "off"],
                        help="Medusa's CUDA-graph rounds (auto: the model's default, on for CUDA devices)")
    parser.add_argument("--compile", action="store_true", help="torch.compile Medusa's fixed-shape rounds")
    parser.add_argument("--timestamps", action="store_true",
                        help="Whisper: every decoder returns timestamps (return_timestamps=True); Medusa then "
                             "decodes inside the base's own generate, with its timestamp rules")
    parser.add_argument("--limit", type=cli_args.positive_int, default=None, help="only the first N clips of the manifest")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (results.json, results.md, the plot)")
    parser.add_argument("--merge-summary", action="append", default=[], metavar="JSON",
                        help="only merge these summary lists or results.json files (rows measured elsewhere) into "
                             "--summary and/or --quantised-summary, and exit")
    parser.add_argument("--int4-kernel", action="store_true",
                        help="with a W4A16 GPTQ --base (pipeline.quantise): its layers on PyTorch's int4 kernel (tinygemm "
                             "on CUDA, its CPU port on the CPU), scales in bf16, instead of dense decompressed weights")
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
    runtime.time_drafts_afresh()
    try:
        return _main(args, argv)
    except BenchmarkError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR


def _main(args, argv=None) -> int:
    if args.merge_summary:
        return _merge_summaries_only(args)
    _check_options(args)
    rows = read_manifest(args.audio)[: args.limit]
    folder = resolve_artifact(args.model)

    import torch

    device = _resolve_device(args.device)
    dtype = runtime.resolve_dtype(args.dtype, device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    environment = environment_info(device, dtype, torch.get_num_threads())

    started = time.perf_counter()
    model, base, declared_base = load_model(folder, device, dtype, args.base, args.int4_kernel, args.trust_base_code)
    if args.max_new_tokens is None:
        args.max_new_tokens = model.default_max_new_tokens
    load_seconds = time.perf_counter() - started
    rss_after_load = peak_rss_bytes()
    runtime.quiet_generate_notices(args.verbose)
    prompt_options = {k: getattr(args, k) for k in PROMPT_OPTIONS if getattr(args, k)}
    try:
        clips = load_clips(model, rows, progress=not args.quiet, prompt_options=prompt_options)
    except ValueError as err:  # a language or task the model cannot take
        raise BenchmarkError(str(err)) from err
    cpu_before, decoding_started = cpu_seconds(), time.perf_counter()
    by_draft = _run_decoders(model, clips, args)
    environment["load_average_at_end"] = load_average()
    environment["other_processes_cpus"] = other_processes_cpus(cpu_before, cpu_seconds(),
                                                               time.perf_counter() - decoding_started)
    command = command_line("tools.benchmark", argv)
    for label, results in by_draft.items():
        settings = {"model": str(args.model), "model_folder": str(folder), "base_model": base,
                    "base_model_declared": declared_base, **_run_settings(args, model, len(clips), prompt_options),
                    "draft": label, **({"drafts": list(by_draft)} if len(by_draft) > 1 else {}),
                    "model_load_s": load_seconds, "timing": TIMING, "command": command}
        results = {"schema_version": SCHEMA_VERSION, "environment": environment, "settings": settings, **results}
        results["memory"] = memory_info(results.pop("cuda_peak_bytes"), model.device, rss_after_load)
        add_notes(results, args.threads, getattr(model, "max_audio_seconds", None))
        out = Path(args.out) if len(by_draft) == 1 else Path(args.out) / label
        _write_results(results, args, out)
    if len(by_draft) > 1:
        print(render_comparison(results["summary"]["draft_comparison"]), end="")
    return EXIT_OK


def _write_results(results: dict, args, out: Path) -> None:
    """One draft's results.json, results.md and plot in ``out``, its summary rows, its tables on stdout."""
    written = write_outputs(results, out, plot=not args.no_plot)
    _add_summary_rows(results, args, results["settings"]["command"], written["json"])
    print(render_markdown(results), end="")
    print(f"\nWrote {written['json']} and {written['markdown']}; plot: {written.get('plot', 'disabled')}",
          file=sys.stderr)
    summary = results["summary"]
    if summary["exact_match_rate"] is not None and summary["exact_match_rate"] < 1.0:
        print(f"warning: {results['settings']['draft']}: Medusa's token ids differ from the baseline's on some clips",
              file=sys.stderr)


def _merge_summaries_only(args) -> int:
    targets = [(path, make_row, key) for path, make_row, key in summary_lists(args) if path]
    if not targets:
        raise BenchmarkError("--merge-summary needs --summary or --quantised-summary (the list to merge into)")
    for path, make_row, key in targets:
        try:
            merged = merge_summaries([Path(p) for p in args.merge_summary], Path(path), make_row, key)
        except ValueError as err:
            raise BenchmarkError(str(err)) from None
        print(f"merged {merged} row(s) into {path}")
    return EXIT_OK


def summary_lists(args) -> tuple:
    """The summary lists a run adds its row to: (path or None, the row's maker, the key that replaces a row)."""
    return ((args.summary, summary_row, SUMMARY_KEY), (args.quantised_summary, quantised_row, QUANTISED_SUMMARY_KEY))


def _check_options(args) -> None:
    for name in ("repeats", "threads", "max_new_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise BenchmarkError(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        raise BenchmarkError("--warmup must be >= 0")
    if args.batch_size is not None and args.batch_size < 1:
        raise BenchmarkError("--batch-size must be >= 1")
    if args.limit is not None and args.limit < 1:
        raise BenchmarkError("--limit must be >= 1")
    if args.int4_kernel and not args.base:
        raise BenchmarkError("--int4-kernel needs --base: a W4A16 GPTQ folder (python -m pipeline.quantise)")


def _resolve_device(name: str) -> str:
    try:
        return runtime.resolve_device(name)
    except ValueError as err:
        raise BenchmarkError(str(err)) from err


def _run_decoders(model, clips: list[Clip], args) -> dict:
    medusa_kwargs = {} if args.cuda_graph == "auto" else {"cuda_graph": args.cuda_graph == "on"}
    if args.compile:
        medusa_kwargs["compile"] = True
    try:
        return run_drafts(model, clips, args.draft, repeats=args.repeats, warmup=args.warmup,
                          max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, progress=not args.quiet,
                          medusa_kwargs=medusa_kwargs,
                          generate_kwargs={"return_timestamps": True} if args.timestamps else None)
    except ValueError as err:  # e.g. max_new_tokens beyond the model's limit
        raise BenchmarkError(" ".join(str(err).split())) from err


def _run_settings(args, model, clips: int, prompt_options: dict) -> dict:
    """The settings of results.json that come from the command line and the model."""
    return {"base_family": model.family, "medusa_num_heads": model.config.medusa_num_heads,
            "medusa_num_layers": model.config.medusa_num_layers, "manifest": str(args.audio),
            "clips": clips, "repeats": args.repeats, "warmup": args.warmup,
            "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
            **prompt_options,
            "threads": args.threads, "cuda_graph": args.cuda_graph, "compile": args.compile,
            "timestamps": args.timestamps,
            **base_precision(args.base, args.dtype, args.int4_kernel, str(runtime.model_device(model))),
            **({"int4_layers": int4_layers(model)} if args.int4_kernel else {})}


def int4_layers(model) -> int:
    """How many of the base's layers multiply on the int4 kernel (``--int4-kernel``)."""
    from tools.weight_only import Int4WeightOnlyLinear

    return sum(isinstance(module, Int4WeightOnlyLinear) for module in model.base.modules())


def _add_summary_rows(results: dict, args, command: str, results_json: str) -> None:
    """This run's row in the summary lists it was asked to add to (--summary, --quantised-summary)."""
    for summary_path, make_row, key in summary_lists(args):
        if summary_path:
            row = make_row(results, command)
            row["results"] = os.path.relpath(results_json, Path(summary_path).resolve().parent)
            update_summary(Path(summary_path), row, key)


if __name__ == "__main__":
    sys.exit(main())
