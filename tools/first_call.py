"""A new process's first transcription with ``draft="auto"``, its candidates timed in the process (the draft timings
store off) against recalled from ``draft_timings.json`` (kept by an earlier process on this machine): in fresh
processes, interleaved, medians of the repeats, every output checked equal to the first run's:

- the first ``generate`` call of a process that loaded the model (and its phases), then its second;
- ``python -m tools.transcribe CLIP`` of one clip, the whole process (imports, loading, transcription), and the same
  with ``--no-medusa`` (the base's own ``generate``) beside them, the three in turn in every order.

    python -m tools.first_call --model heads/whisper-tiny.en \\
        --audio work_data/eval_speech/wavs/CLIP.wav --out benchmarks/first_call/cpu_tiny.en.json
    (on a GPU: --device cuda --dtype bfloat16 [--compile], where auto captures or compiles its candidates to time them)

With ``--compile`` each child gets its own torch.compile cache folder: ``timed_here`` and ``recalled_cold_compile``
an empty one (a first process), ``recalled`` the one the first run filled (a later process: ``compile_cache_dir``).

``--shape meralion2-3b`` (random weights, replayed drafts, one ``--draft``, compiled as ``generate(compile=True)``
compiles: the speech encoder, the prompt's pass and the rounds) times the first call of a process that built the
model: with an empty compile cache (``cold``) and then, in a new process, with the one it filled (``warm``), each
with the decoder layers compiled whole (``whole``) and as one region reused by every layer (``regions``,
``KernelOptions.layer_regions``); its later calls give the round loop's seconds (the rounds' speed).

    python -m tools.first_call --shape meralion2-3b --device cuda --dtype bfloat16 --out FILE
    python -m tools.first_call --shape meralion2-3b --tiny --out FILE   # the 26 layers at tiny widths, on a CPU
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
COMPILE_MODES = ("timed_here", "recalled_cold_compile", "recalled")
LAYER_FORMS = ("whole", "regions")


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


def shaped_first_calls(args) -> dict:
    """(Run in a child process.) A MERaLiON-2-shaped model's first compiled call, its second and its round loop."""
    import torch

    from backbone_meralion2 import MERaLiON2Backbone
    from medusa_options import KernelOptions
    from tools import meralion2_shaped as shaped
    from tools.benchmark_gpu import draft_trees

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(runtime.resolve_device(args.device))
    start = time.perf_counter()
    model = shaped.build_model(device, runtime.resolve_dtype(args.dtype, device), args.shape, tiny=args.tiny)
    backbone = MERaLiON2Backbone(model)
    backbone.kernels = KernelOptions(layer_regions=args.layers == "regions")
    if device.type == "cuda":
        backbone.fuse_projections()  # (as generate does on a GPU)
    inputs = shaped.make_prompt(model, 1, device)
    continuation = shaped.plain_continuation(backbone, inputs, args.new_tokens)  # (eager: warms the device too)
    profile = shaped.rank_profile(shaped.SEED_TOP1)
    tree = next(iter(draft_trees(profile, [args.draft]).values()))
    runtime.synchronize(device)
    built = time.perf_counter()
    replay = shaped.ReplayedRunner(backbone, inputs, continuation, profile, tree, args.new_tokens, compile=True)
    out, _ = replay(inputs)
    runtime.synchronize(device)
    first = time.perf_counter()
    replay(inputs)
    runtime.synchronize(device)
    second = time.perf_counter()
    loops = [replay(inputs)[1].loop_seconds for _ in range(args.loop_repeats)]
    return {"load_s": built - start, "first_call_s": first - built, "second_call_s": second - first,
            "first_call_phases_s": {"setup_seconds": replay.setup_seconds},
            "loop_s": statistics.median(loops), "loop_runs_s": loops, "draft": args.draft,
            "exact": out[0] == continuation[0].tolist(), "ids": out[0]}


def shaped_main(args) -> tuple[bool, dict]:
    """Per repeat and layer form: a fresh compile cache, a child on it (cold), another child on it (warm); whether
    the forms gave the same ids, and each mode's medians."""
    forms = args.forms.split(",")
    calls = {f"{form}_{c}": [] for form in forms for c in ("cold", "warm")}
    for repeat in range(args.repeats):
        for form in forms if repeat % 2 == 0 else forms[::-1]:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="first_call_compile_")}
            for cache in ("cold", "warm"):
                calls[f"{form}_{cache}"].append(run_child(args, env, "--layers", form))
                print(repeat, form, cache, {k: round(calls[f"{form}_{cache}"][-1][k], 3)
                                            for k in ("first_call_s", "loop_s")}, flush=True)
    for form in forms:  # a kept compile cache must give the very program the cold compile made
        runs = calls[f"{form}_cold"] + calls[f"{form}_warm"]
        if any(run["ids"] != runs[0]["ids"] for run in runs):
            raise SystemExit(f"the transcript's ids differ between the {form} form's runs")
    # Forms fuse differently: in bfloat16, random weights' near-ties may then part (recorded, not a failure)
    agree = len({tuple(runs[0]["ids"]) for runs in calls.values()}) == 1
    return agree, {mode: {"first_call_s": round(statistics.median(r["first_call_s"] for r in runs), 3),
                   "second_call_s": round(statistics.median(r["second_call_s"] for r in runs), 3),
                   "loop_s": round(statistics.median(r["loop_s"] for r in runs), 5),
                   "load_s": round(statistics.median(r["load_s"] for r in runs), 3),
                   "exact": all(r["exact"] for r in runs), "draft": runs[0]["draft"],
                   "runs": [{k: r[k] for k in ("first_call_s", "second_call_s", "loop_s")} for r in runs]}
            for mode, runs in calls.items()}


def device_options(args) -> list[str]:
    threads = ["--threads", str(args.threads)] if args.threads else []
    return ["--device", args.device, "--dtype", args.dtype, *threads, *(["--compile"] if args.compile else [])]


def run_child(args, env: dict, *options: str) -> dict:
    what = (["--shape", args.shape, "--draft", args.draft, "--new-tokens", str(args.new_tokens),
             "--loop-repeats", str(args.loop_repeats), *(["--tiny"] if args.tiny else [])] if args.shape else
            ["--model", args.model, "--audio", args.audio])
    done = subprocess.run([sys.executable, "-m", "tools.first_call", "--child", *what, *device_options(args), *options],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"a child failed:\n{done.stderr[-4000:]}")
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
    parser.add_argument("--audio", help="one clip (required without --shape)")
    parser.add_argument("--repeats", type=cli_args.positive_int, default=5, help="fresh processes per mode")
    parser.add_argument("--out", help="results JSON (e.g. benchmarks/first_call/cpu_tiny.en.json)")
    parser.add_argument("--compile", action="store_true", help="compiled rounds (auto compiles its best few)")
    parser.add_argument("--no-cli", action="store_true", help="leave out the tools.transcribe processes")
    parser.add_argument("--shape", choices=["meralion2-3b", "meralion2-10b"], help="a random-weight shape instead")
    parser.add_argument("--tiny", action="store_true", help="--shape: its layers at tiny widths (a CPU's smoke)")
    parser.add_argument("--draft", default="tree-16", help="--shape: chain or tree-N")
    parser.add_argument("--new-tokens", type=cli_args.positive_int, default=64, help="--shape: tokens a call")
    parser.add_argument("--loop-repeats", type=cli_args.positive_int, default=5, help="--shape: timed later calls")
    parser.add_argument("--forms", default="whole,regions", choices=["whole,regions", "whole", "regions"],
                        help="--shape: the layer forms compiled (a GPU call's time: one at a time)")
    parser.add_argument("--layers", choices=LAYER_FORMS, default="whole", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    runtime.add_device_options(parser, device="cpu")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.child:
        print(json.dumps((shaped_first_calls if args.shape else first_calls)(args)))
        return
    if args.shape:
        agree, calls = shaped_main(args)
        return write_result(args, {"shape": args.shape, "tiny": args.tiny, "new_tokens": args.new_tokens,
                                   "draft": args.draft, "repeats": args.repeats, "ids_agree_across_forms": agree,
                                   "first_calls": calls})
    if not args.audio:
        raise SystemExit("--audio is required (or --shape)")
    store = Path(tempfile.mkdtemp()) / "draft_timings.json"
    modes = COMPILE_MODES if args.compile else MODES
    envs = {"timed_here": {**os.environ, "MEDUSA_ASR_DRAFT_TIMINGS": "off"},
            "recalled": {**os.environ, "MEDUSA_ASR_DRAFT_TIMINGS": str(store)}}
    if args.compile:  # (a first process's compile against a later one's)
        kept = {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="first_call_compile_")}
        envs["recalled_cold_compile"] = dict(envs["recalled"])
        envs["recalled"].update(kept)
    reference = run_child(args, envs["recalled"])  # (times the candidates, and keeps them for the runs below)
    calls, cli = {mode: [] for mode in modes}, {mode: [] for mode in (*MODES, "no_medusa")}
    for repeat in range(args.repeats):
        for mode in modes if repeat % 2 == 0 else modes[::-1]:
            env = envs[mode]
            if args.compile and mode != "recalled":
                env = {**env, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="first_call_compile_")}
            calls[mode].append(run_child(args, env))
            if calls[mode][-1]["ids"] != reference["ids"]:
                raise SystemExit(f"{mode}: the transcript's ids differ from the first run's")
        if args.no_cli:
            continue
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

    result = {"model": args.model, "audio": args.audio, "repeats": args.repeats,
              "first_calls": {mode: medians(runs) for mode, runs in calls.items()}}
    if not args.no_cli:
        result.update({"transcribe_cli_s": {mode: round(statistics.median(runs), 3) for mode, runs in cli.items()},
                       "transcribe_cli_runs_s": {mode: [round(x, 3) for x in runs] for mode, runs in cli.items()}})
    write_result(args, result)


def write_result(args, measured: dict) -> None:
    import torch

    gpu = torch.cuda.get_device_name() if runtime.resolve_device(args.device).startswith("cuda") else None
    result = {"command": command_line("tools.first_call"), "cpu": cpu_name(), "gpu": gpu, "compile": args.compile or bool(args.shape),
              "threads": args.threads or torch.get_num_threads(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), **measured}
    print(json.dumps({k: result[k] for k in ("first_calls", "transcribe_cli_s") if k in result}, indent=1))
    if args.out:
        write_json_atomic(args.out, result)


if __name__ == "__main__":
    main()
