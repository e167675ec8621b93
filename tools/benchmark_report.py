"""The reporting half of ``benchmark.py``: the environment and memory a run records, its Markdown tables and
plot, and the summary list across runs (``benchmarks/real_speech/summary.json``)."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

from tools.audio_io import write_atomic

REPO_ROOT = Path(__file__).resolve().parent.parent
PLOT_NAME = "speedup_vs_length.png"


def _ratio(numerator, denominator):
    return numerator / denominator if numerator is not None and denominator else None


# --------------------------------------------------------------------------- environment & memory


def memory_info(cuda_peak: dict | None, device, rss_after_load: int | None) -> dict:
    if cuda_peak is not None:
        import torch

        return {
            "method": "torch.cuda.max_memory_allocated, reset before every timed generate; max over the clips "
                      "(batch size 1; the batched section's peaks are in batched.cuda_peak_bytes)",
            "baseline_peak_bytes": cuda_peak["baseline"],
            "medusa_peak_bytes": cuda_peak["medusa"],
            "allocated_after_benchmark_bytes": torch.cuda.memory_allocated(device),
        }
    info = {
        "method": "resource.getrusage(RUSAGE_SELF).ru_maxrss: peak resident set size of the whole process "
                  "(model loading and both decoders; CPU memory cannot be split per decoder)",
        "peak_rss_after_load_bytes": rss_after_load,
        "peak_rss_bytes": peak_rss_bytes(),
    }
    try:
        import psutil

        info["rss_now_bytes"] = psutil.Process().memory_info().rss
        info["rss_now_method"] = "psutil.Process().memory_info().rss"
    except ImportError:
        pass
    return info


def peak_rss_bytes() -> int | None:
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # bytes on macOS, KiB on Linux


def environment_info(device, dtype, threads) -> dict:
    import torch
    import transformers

    device = str(device)
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = _cpu_name()
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "torch_threads": threads,
        "torch_interop_threads": torch.get_num_interop_threads(),
        "load_average_at_start": _load_average(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if device.startswith("cuda") else None,
        "transformers_version": transformers.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "dtype": str(dtype).replace("torch.", ""),
        "git": _git_info(),
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _git_info() -> dict | None:
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return None


# --------------------------------------------------------------------------- rendering


def _fmt(value, spec=".1f", suffix=""):
    if value is None:
        return "n/a"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    return f"{value:{spec}}{suffix}"


def _pct(value):
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


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
    lines += ["## Per clip (batch size 1)", "",
              "| id | duration (s) | tokens | HF generate ms | own greedy ms | ours ms | draft ran | vs HF | "
              "rounds vs own greedy | accepted/round | exact |",
              "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|:---:|"]
    for c in results["clips"]:
        lines.append(f"| {_cell(c['id'])} | {_fmt(c['duration_s'], '.2f')} | {c['tokens']} | "
                     f"{_fmt(c['baseline']['latency_ms_median'])} | {_fmt(c['greedy']['latency_ms_median'])} | "
                     f"{_fmt(c['medusa']['latency_ms_median'])} | {c['draft_ran']} | "
                     f"{_fmt(c['speedup'], '.2f', 'x')} | {_fmt(c['decode_speedup_vs_own_greedy'], '.2f', 'x')} | "
                     f"{_fmt(c['mean_accepted_per_round'], '.2f')} | {'yes' if c['exact_match'] else '**NO**'} |")
    lines += ["", "## Summary (batch size 1)", ""] + _summary_table(summary, results.get("memory"))
    batched = results.get("batched")
    if batched:
        bs = batched["summary"]
        lines += ["", f"## Batched (batch size {bs['batch_size']})", "",
                  "| batch | clips | tokens | baseline ms | medusa ms | speed-up | accepted/round | exact rows |",
                  "|---:|---:|---:|---:|---:|---:|---:|:---:|"]
        for b in batched["batches"]:
            lines.append(f"| {b['index']} | {b['rows']} | {b['tokens']} | {_fmt(b['baseline']['latency_ms_median'])} | "
                         f"{_fmt(b['medusa']['latency_ms_median'])} | {_fmt(b['speedup'], '.2f', 'x')} | "
                         f"{_fmt(b['mean_accepted_per_round'], '.2f')} | {sum(b['exact_rows'])}/{len(b['exact_rows'])} |")
        peaks = batched.get("cuda_peak_bytes")
        memory = ({"method": "torch.cuda.max_memory_allocated, reset before every timed generate; max over batches",
                   "baseline_peak_bytes": peaks["baseline"], "medusa_peak_bytes": peaks["medusa"]} if peaks else None)
        lines += ["", f"### Batched summary (batch size {bs['batch_size']})", ""] + _summary_table(bs, memory)
    if env:
        git = env.get("git") or {}
        commit = (git.get("commit", "")[:12] + (" (uncommitted changes)" if git.get("dirty") else "")) if git else "n/a"
        lines += ["", "## Environment", "", "| | |", "|---|---|"]
        rows = [("date (UTC)", env.get("date")), ("device", f"{env.get('device')}: {env.get('device_name')}"),
                ("CPUs (count / usable)", f"{env.get('cpu_count')} / {env.get('cpus_usable')}"),
                ("torch threads", env.get("torch_threads")), ("load average at start", env.get("load_average_at_start")),
                ("torch", env.get("torch_version")), ("transformers", env.get("transformers_version")),
                ("python", env.get("python_version")), ("dtype", env.get("dtype")), ("git commit", commit)]
        lines += [f"| {k} | {_cell(v)} |" for k, v in rows]
    notes = results.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _summary_table(s: dict, memory: dict | None) -> list[str]:
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
        ("drafted tokens accepted", _pct(s["acceptance_rate"])),
        ("exact match (Medusa == baseline token ids)",
         f"{_pct(s['exact_match_rate'])} ({s['exact_matches']}/{s['rows']})"),
        ("rows that left the base's output / at a base near-tie (half precision)",
         f"{s.get('divergent_rows', 0)} / {s.get('divergent_rows_at_base_near_ties', 0)}"),
        ("WER baseline / medusa (normalised)", f"{_pct(s['baseline_wer'])} / {_pct(s['medusa_wer'])}"),
    ]
    if s.get("feature_ms_total") is not None:
        rows.append(("feature extraction total / median per item (ms, not in latencies)",
                     f"{_fmt(s['feature_ms_total'])} / {_fmt(s['feature_ms_median'])}"))
    if s.get("baseline_rtf") is not None:
        rows.append(("real-time factor: baseline / medusa", f"{_fmt(s['baseline_rtf'], '.3f')} / {_fmt(s['medusa_rtf'], '.3f')}"))
    if s.get("timing_spread_median") is not None:
        rows.append(("timing spread: median (max-min)/median over repeats", _pct(s["timing_spread_median"])))
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
    return ["| metric | value |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in rows]


def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f}"


# --------------------------------------------------------------------------- writing


def write_plot(results: dict, path: Path) -> str | None:
    """Speed-up vs output tokens; returns why it was skipped, or None when written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed"
    import io

    clips = [c for c in results["clips"] if c["speedup"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    scatter = ax.scatter([c["tokens"] for c in clips], [c["speedup"] for c in clips],
                         c=[c["duration_s"] or 0 for c in clips], cmap="viridis")
    fig.colorbar(scatter, ax=ax, label="audio duration (s)")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("output tokens (incl. EOS)")
    ax.set_ylabel("speed-up (baseline ms / Medusa ms)")
    settings = results.get("settings") or {}
    name = "/".join(Path(str(settings.get("model", "model"))).parts[-2:])
    ax.set_title(f"{name}: Medusa speed-up per clip (batch size 1)", fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
    return None


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
    write_atomic(out_dir / "results.json", json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    write_atomic(out_dir / "results.md", markdown)
    written.update(json=str(out_dir / "results.json"), markdown=str(out_dir / "results.md"))
    return written


# --------------------------------------------------------------------------- the summary across runs

SUMMARY_KEY = ("model", "device", "gpu", "dtype", "requested_draft", "rounds_mode", "timestamps")


def summary_row(results: dict, command: str) -> dict:
    """One row of ``benchmarks/real_speech/summary.json``: this run's headline figures, all measured
    side by side in it (the per-clip data stays in its results.json)."""
    env, settings, summary = results["environment"], results["settings"], results["summary"]
    cuda = str(env["device"]).startswith("cuda")
    mode = "compiled" if settings.get("compile") else (
        "graph" if cuda and settings.get("cuda_graph") != "off" else "eager")
    return {
        "model": Path(str(settings.get("base_model_declared") or settings["model"])).name,
        "heads": str(settings["model"]), "device": "cuda" if cuda else "cpu",
        "gpu": env["device_name"] if cuda else None, "cpu": None if cuda else env["device_name"],
        "dtype": env["dtype"], "draft": summary["draft_ran"], "requested_draft": settings["draft"],
        "rounds_mode": mode, "timestamps": True if settings.get("timestamps") else None,  # (None: rows without)
        "clips": summary["clips"], "exact_match_rate": summary["exact_match_rate"],
        "divergent_rows_at_base_near_ties": f"{summary['divergent_rows_at_base_near_ties']}/{summary['divergent_rows']}",
        "mean_accepted_per_round": summary["mean_accepted_per_round"],
        "tokens_per_s": summary["medusa_tokens_per_s"], "baseline_hf_tokens_per_s": summary["baseline_tokens_per_s"],
        "own_greedy_tokens_per_s": summary["greedy_tokens_per_s"],
        "speedup_vs_hf_generate": summary["speedup_sum_latency"],
        "decode_speedup_vs_own_greedy": summary["decode_speedup_vs_own_greedy"],
        "e2e_speedup_vs_own_greedy": summary["e2e_speedup_vs_own_greedy"],
        "round_cost_vs_plain": summary["round_cost_vs_plain"],
        "decode_share_of_call": _ratio(summary["greedy_rounds_ms_total"], summary["greedy_latency_ms_total"]),
        "wer_hf": summary["baseline_wer"], "wer_ours": summary["medusa_wer"],
        "timing_spread_median": summary.get("timing_spread_median"),
        "load_average": [env.get("load_average_at_start"), env.get("load_average_at_end")],
        "date": str(env["date"])[:10], "torch": env["torch_version"], "transformers": env["transformers_version"],
        "results": None, "command": command,
    }


def merge_summaries(sources: list[Path], into: Path) -> int:
    """Add the rows of other summary lists (e.g. written on another machine, their results folders copied
    beside ``into``) to ``into``, with each row's results path made relative to ``into``."""
    count = 0
    for source in sources:
        for row in json.loads(Path(source).read_text()):
            if row.get("results"):
                results = (Path(source).resolve().parent / row["results"]).resolve()
                row["results"] = os.path.relpath(results, into.resolve().parent)
            update_summary(into, row)
            count += 1
    return count


QUANTISED_SUMMARY_KEY = ("model", "precision", "device", "gpu", "batch", "requested_draft")


def quantised_row(results: dict, command: str) -> dict:
    """One row of ``benchmarks/quantised/summary.json``: a verifier of some precision with the same heads,
    against its own greedy output (exact match, WER of that base, accepted tokens per round, speed)."""
    row, settings = summary_row(results, command), results["settings"]
    return {"model": row["model"], "precision": settings.get("precision"), "kernel": settings.get("kernel"),
            "base": settings.get("base_model"), "device": row["device"], "gpu": row["gpu"], "dtype": row["dtype"],
            "batch": settings.get("batch_size") or 1, "draft": row["draft"], "requested_draft": row["requested_draft"],
            "clips": row["clips"], "exact_match_rate": row["exact_match_rate"],
            "mean_accepted_per_round": row["mean_accepted_per_round"], "wer": row["wer_hf"], "wer_ours": row["wer_ours"],
            "tokens_per_s": row["tokens_per_s"], "own_greedy_tokens_per_s": row["own_greedy_tokens_per_s"],
            "speedup_vs_own_greedy": row["e2e_speedup_vs_own_greedy"],
            "decode_speedup_vs_own_greedy": row["decode_speedup_vs_own_greedy"],
            "verify_ms_by_tokens": None, "replayed": False, "date": row["date"], "torch": row["torch"],
            "transformers": row["transformers"], "command": command}


def update_summary(path: Path, row: dict, key: tuple = SUMMARY_KEY) -> None:
    """Add ``row`` to the summary list, replacing an earlier row with the same ``key`` fields (model, device,
    dtype, draft and rounds mode by default); written atomically."""
    rows = json.loads(path.read_text()) if path.exists() else []
    rows = [r for r in rows if tuple(r.get(k) for k in key) != tuple(row.get(k) for k in key)]
    rows.append(row)
    rows.sort(key=lambda r: tuple(str(r.get(k)) for k in key))
    write_atomic(path, json.dumps(rows, indent=1) + "\n")
