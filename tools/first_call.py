"""A new process's first transcription with ``draft="auto"``, its candidates timed in the process (the draft timings
store off) against recalled from ``draft_timings.json`` (kept by an earlier process on this machine): in fresh
processes, interleaved, medians of the repeats, every output checked equal to the first run's:

- the first ``generate`` call of a process that loaded the model (and its phases), then its second;
- ``python -m tools.transcribe CLIP`` of one clip, the whole process (imports, loading, transcription), and the same
  with ``--no-medusa`` (the base's own ``generate``) beside them, the three in turn in every order.

    python -m tools.first_call --model heads/whisper-tiny.en \\
        --audio work_data/eval_speech/wavs/CLIP.wav --out benchmarks/first_call/cpu_tiny.en.json
    (on a GPU: --device cuda --dtype bfloat16 [--compile], where auto captures or compiles its candidates to time them)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools import cli_args, runtime
from tools.benchmark_environment import cpu_name
from tools.files import command_line, write_json_atomic

MODES = ("timed_here", "recalled")


def first_calls(args) -> dict:
    """(Run in a child process.) Seconds of loading, of the first and second calls and the first call's phases."""
    from tools import runtime
    from tools.audio_io import load_audio

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = runtime.resolve_device(args.device)
    start = time.perf_counter()
    model = runtime.load_medusa(args.model, runtime.resolve_dtype(args.dtype, device),
                                runtime.base_to_load(args.model, None), device_map=device).eval()
    loaded = time.perf_counter()
    inputs = runtime.to_model(model.prepare_audio_inputs([load_audio(args.audio)]), model)
    out, stats = model.generate(**inputs, draft="auto", compile=args.compile, return_stats=True)
    runtime.synchronize(model)
    first = time.perf_counter()
    model.generate(**inputs, draft="auto", compile=args.compile)
    runtime.synchronize(model)
    second = time.perf_counter()
    return {"load_s": loaded - start, "first_call_s": first - loaded, "second_call_s": second - first,
            "first_call_phases_s": {k: v for k, v in stats.items() if k.endswith("_seconds")},
            "draft": stats["draft"], "ids": out[0].tolist()}


def device_options(args) -> list[str]:
    threads = ["--threads", str(args.threads)] if args.threads else []
    return ["--device", args.device, "--dtype", args.dtype, *threads, *(["--compile"] if args.compile else [])]


def run_child(args, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "tools.first_call", "--child", "--model", args.model, "--audio", args.audio,
                           *device_options(args)], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli_seconds(args, env: dict, *options: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tools.transcribe", args.audio, "--model", args.model,
                           *device_options(args), *options],
                          env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout.strip().splitlines()[-1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.first_call", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="heads/whisper-tiny.en")
    parser.add_argument("--audio", required=True, help="one clip")
    parser.add_argument("--repeats", type=cli_args.positive_int, default=5, help="fresh processes per mode")
    parser.add_argument("--out", help="results JSON (e.g. benchmarks/first_call/cpu_tiny.en.json)")
    parser.add_argument("--compile", action="store_true", help="compiled rounds (auto compiles its best few)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    runtime.add_device_options(parser, device="cpu")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.child:
        print(json.dumps(first_calls(args)))
        return
    store = Path(tempfile.mkdtemp()) / "draft_timings.json"
    envs = {"timed_here": {**os.environ, "MEDUSA_ASR_DRAFT_TIMINGS": "off"},
            "recalled": {**os.environ, "MEDUSA_ASR_DRAFT_TIMINGS": str(store)}}
    reference = run_child(args, envs["recalled"])  # (times the candidates, and keeps them for the runs below)
    calls, cli = {mode: [] for mode in MODES}, {mode: [] for mode in (*MODES, "no_medusa")}
    for repeat in range(args.repeats):
        for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
            calls[mode].append(run_child(args, envs[mode]))
            if calls[mode][-1]["ids"] != reference["ids"]:
                raise SystemExit(f"{mode}: the transcript's ids differ from the first run's")
        order = list(cli)[repeat % 3:] + list(cli)[: repeat % 3]  # (each in every position in turn: drift)
        for mode in order:
            options = ("--no-medusa",) if mode == "no_medusa" else ()
            cli[mode].append(cli_seconds(args, envs["timed_here" if mode == "no_medusa" else mode], *options)[0])
        print(repeat, {mode: round(runs[-1], 2) for mode, runs in cli.items()}, flush=True)

    def medians(runs: list[dict]) -> dict:
        phases = runs[0]["first_call_phases_s"]
        seconds = ("load_s", "first_call_s", "second_call_s")
        return {**{k: round(statistics.median(r[k] for r in runs), 3) for k in seconds},
                "first_call_phases_s": {k: round(statistics.median(r["first_call_phases_s"][k] for r in runs), 3)
                                        for k in phases},
                "draft": runs[0]["draft"]}

    import torch

    gpu = torch.cuda.get_device_name() if runtime.resolve_device(args.device).startswith("cuda") else None
    result = {"command": command_line("tools.first_call"), "cpu": cpu_name(), "gpu": gpu,
              "threads": torch.get_num_threads(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "model": args.model, "audio": args.audio, "repeats": args.repeats,
              "first_calls": {mode: medians(runs) for mode, runs in calls.items()},
              "transcribe_cli_s": {mode: round(statistics.median(runs), 3) for mode, runs in cli.items()},
              "transcribe_cli_runs_s": {mode: [round(x, 3) for x in runs] for mode, runs in cli.items()}}
    print(json.dumps({k: result[k] for k in ("first_calls", "transcribe_cli_s")}, indent=1))
    if args.out:
        write_json_atomic(args.out, result)


if __name__ == "__main__":
    main()
