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

This file measures and holds the command line; the manifest, the artifact and the clips' features come from
``tools.benchmark_inputs``, the machine and memory records from ``tools.benchmark_environment``, the records,
summaries, notes and tables from ``tools.benchmark_report``.
"""

from __future__ import annotations

import argparse
import os
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
from tools.benchmark_report import (add_notes, add_totals, batch_record, clip_record, clip_wer, median, merge_summaries,
                                    PLOT_NAME, quantised_row, QUANTISED_SUMMARY_KEY, ratio, render_markdown, summarise,
                                    SUMMARY_KEY, summary_row, update_summary, write_outputs)

DEFAULT_OUT = "work_data/benchmarks/latest"  # committed results are written only where asked (--out)
PROMPT_OPTIONS = ("language", "task")  # generate inputs that are options, not tensors
PHASES = ("prefill_seconds", "setup_seconds", "rounds_seconds")  # our loop's phases (generate's return_stats)
SCHEMA_VERSION = 1
TIMING = ("median of the timed repeats of generate(); features prepared once per clip outside the timing; "
          "decoders interleaved, order flipped each repeat; device synchronised around each call")
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
        self.device = runtime.model_device(model)
        self.cuda = str(self.device).startswith("cuda")
        self.sync = partial(runtime.synchronize, self.device)
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
        wers = [clip_wer(r, h) for r, h in zip(references, hyps)]
        record = _method_record(result["times_ms"][name], result["cpu_times_ms"][name], [list(c) for c in counts],
                                texts, wers,
                                sum(c[0] for c in counts), sum(c[1] for c in counts))
        record["repeats_identical"] = result["repeats_identical"][name]
        if name != "baseline":
            record["stats"] = _stats_record(stats, depth, len(rows))
            record["phases_ms_median"] = {phase.replace("_seconds", "_ms"): median([p[phase] for p in
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
        inputs = runtime.to_model(clip.inputs, model)
        if _batch_rows(inputs) != 1:
            raise BenchmarkError(f"clip {clip.id!r}: inputs must hold one row (batch size 1)")
        group = measure_group(timer, counter, inputs, [clip.reference], tree.depth)
        groups.append(group)
        per_clip.append(clip_record(clip, group, max_audio))
    summary = summarise(groups, [c.reference for c in clips], len(clips), len(clips))
    add_totals(summary, clips, [c.feature_ms for c in clips])

    cuda_peak = dict(timer.peak_bytes) if timer.cuda else None
    batched = None
    if batch_size and batch_size > 1:
        timer.peak_bytes = {name: 0 for name in timer.methods}
        batched = _run_batched(model, clips, batch_size, timer, counter, tree.depth, progress)
        batched["cuda_peak_bytes"] = dict(timer.peak_bytes) if timer.cuda else None

    draft_info = {"requested": draft if isinstance(draft, str) else "paths", "chain": tree.is_chain,
                  "depth": tree.depth, "nodes": tree.num_nodes, "paths": [list(p) for p in tree.paths],
                  "auto_measurements": model.draft_policy.measurements()}
    return {"clips": per_clip, "summary": summary, "batched": batched, "draft_tree": draft_info,
            "cuda_peak_bytes": cuda_peak}


def _run_batched(model, clips, batch_size, timer, counter, depth, progress) -> dict:
    from tqdm import tqdm

    chunks = [clips[i:i + batch_size] for i in range(0, len(clips), batch_size)]
    records, groups = [], []
    for index, chunk in enumerate(tqdm(chunks, desc=f"batches of {batch_size}", unit="batch",
                                       disable=not progress, file=sys.stderr)):
        inputs, feature_ms = _stack_inputs(chunk, model)
        inputs = runtime.to_model(inputs, model)
        group = measure_group(timer, counter, inputs, [c.reference for c in chunk], depth)
        groups.append(group)
        records.append(batch_record(index, chunk, group, feature_ms))
    summary = summarise(groups, [c.reference for c in clips], len(clips), len(clips))
    add_totals(summary, clips, [r["feature_ms"] for r in records])
    summary["batches"] = len(chunks)
    summary["batch_size"] = batch_size
    return {"batches": records, "summary": summary}


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
    cli_args.add_trust_base_code(parser)
    runtime.add_device_options(parser, device="cpu", dtype="float32", threads=2)
    parser.add_argument("--repeats", type=cli_args.positive_int, default=3, help="timed runs per decoder per clip (median reported)")
    parser.add_argument("--warmup", type=cli_args.non_negative_int, default=1, help="untimed runs per decoder per clip")
    parser.add_argument("--max-new-tokens", type=cli_args.positive_int, default=None,
                        help="new tokens per clip (default: the family's, its backbone's default_max_new_tokens)")
    parser.add_argument("--draft", default="auto", type=draft_option,
                        help="auto: the fastest of plain / chain / trees on this device (timed); chain; tree (the "
                             "artifact's); tree-N (its N-node tree); none: our decode loop without drafts (isolates "
                             "the loop's own speed)")
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
    results = _run_decoders(model, clips, args)
    environment["load_average_at_end"] = load_average()
    environment["other_processes_cpus"] = other_processes_cpus(cpu_before, cpu_seconds(),
                                                               time.perf_counter() - decoding_started)
    settings = {"model": str(args.model), "model_folder": str(folder), "base_model": base,
                "base_model_declared": declared_base, **_run_settings(args, model, len(clips), prompt_options),
                "model_load_s": load_seconds, "timing": TIMING, "command": command_line("tools.benchmark", argv)}
    results = {"schema_version": SCHEMA_VERSION, "environment": environment, "settings": settings, **results}
    results["memory"] = memory_info(results.pop("cuda_peak_bytes"), model.device, rss_after_load)
    add_notes(results, args.threads, getattr(model, "max_audio_seconds", None))
    written = write_outputs(results, Path(args.out), plot=not args.no_plot)
    _add_summary_rows(results, args, settings["command"], written["json"])
    print(render_markdown(results), end="")
    print(f"\nWrote {written['json']} and {written['markdown']}; plot: {written.get('plot', 'disabled')}",
          file=sys.stderr)
    summary = results["summary"]
    if summary["exact_match_rate"] is not None and summary["exact_match_rate"] < 1.0:
        print("warning: Medusa's token ids differ from the baseline's on some clips", file=sys.stderr)
    return EXIT_OK


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
        return run_benchmark(model, clips, repeats=args.repeats, warmup=args.warmup,
                             max_new_tokens=args.max_new_tokens, draft=[] if args.draft == "none" else args.draft,
                             batch_size=args.batch_size, progress=not args.quiet, medusa_kwargs=medusa_kwargs,
                             generate_kwargs={"return_timestamps": True} if args.timestamps else None)
    except ValueError as err:  # e.g. max_new_tokens beyond the model's limit
        raise BenchmarkError(" ".join(str(err).split())) from err


def _run_settings(args, model, clips: int, prompt_options: dict) -> dict:
    """The settings of results.json that come from the command line and the model."""
    return {"base_family": model.family, "medusa_num_heads": model.config.medusa_num_heads,
            "medusa_num_layers": model.config.medusa_num_layers, "manifest": str(args.audio),
            "clips": clips, "repeats": args.repeats, "warmup": args.warmup,
            "max_new_tokens": args.max_new_tokens, "draft": args.draft, "batch_size": args.batch_size,
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
