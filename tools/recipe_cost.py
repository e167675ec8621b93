"""What the one-command head recipe costs per hour of audio: runs ``pipeline/train_heads.sh`` on a base and records,
for each step it logs (synthesise, collect, train, export), the wall-clock time, the GPU memory in use at its peak
(``nvidia-smi``, sampled) and the disk its output takes; for the steps that grow with the audio, time and disk per
hour of the audio collected too (collect_info.json's ``audio_seconds``).

    python -m tools.recipe_cost --base BASE --work WORK [--audio FOLDER] [--env HEADS=path --env DEVICE=cuda ...] \\
        --out benchmarks/recipe/FILE.json

The environment settings (``--env NAME=VALUE``) are train_heads.sh's own (see its header); they are recorded with
the command.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools import cli_args
from tools.benchmark_environment import cpu_name
from tools.files import command_line, write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "pipeline" / "train_heads.sh"
MIB, GIB = 1024**2, 1024**3
# steps whose time grows with the audio (export's does not), and whose output does (training's is its checkpoints)
TIME_GROWS, DISK_GROWS = ("synthesise", "collect", "train"), ("synthesise", "collect")


@dataclass
class Options:
    base: str
    work: Path
    out: Path
    audio: str | None = None
    env: dict = field(default_factory=dict)
    sample_seconds: float = 0.5


def nvidia_smi(field: str) -> str | None:
    """One field of the first GPU as nvidia-smi reads it (not torch: a CUDA context of this process's own would show
    in the recipe's memory readings); None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", "0"]
    return subprocess.run(query, capture_output=True, text=True).stdout.strip() or None


class GpuMemorySampler:
    """``nvidia-smi``'s memory in use on the first GPU, every ``interval`` seconds, in a thread: (time, MiB)."""

    def __init__(self, interval: float):
        self.interval, self.samples = interval, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            used = nvidia_smi("memory.used")
            if used and used.isdigit():
                self.samples.append((time.time(), int(used)))
            self._stop.wait(self.interval)

    def peak_mib(self, start: float, end: float) -> int | None:
        inside = [mib for t, mib in self.samples if start <= t <= end]
        return max(inside) if inside else None


def run_recipe(opts: Options, steps_log: Path) -> GpuMemorySampler:
    """train_heads.sh BASE WORK WORK/artifact, its step log in ``steps_log``; raises if the recipe fails."""
    env = {**os.environ, **opts.env, "STEP_LOG": str(steps_log), **({"AUDIO": opts.audio} if opts.audio else {})}
    with GpuMemorySampler(opts.sample_seconds) as sampler:
        subprocess.run(["bash", str(RECIPE), opts.base, str(opts.work), str(opts.work / "artifact")], env=env,
                       check=True)
    return sampler


def folder_bytes(path: str | Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def collected(steps: list[dict]) -> dict:
    """Clips, tokens and seconds of audio over every collect step's folder (collect_info.json)."""
    infos = [json.loads((Path(step["out"]) / "collect_info.json").read_text()) for step in steps
             if step["step"].startswith("collect")]
    return {"clips": sum(i["n_utterances"] for i in infos), "tokens": sum(i["n_tokens"] for i in infos),
            "audio_seconds": sum(i["audio_seconds"] for i in infos)}


def step_row(step: dict, sampler: GpuMemorySampler, audio_hours: float) -> dict:
    """One logged step: its time, GPU memory peak and output size, per audio hour where they grow with the audio."""
    name, seconds, disk = step["step"], step["end"] - step["start"], folder_bytes(step["out"])
    peak = sampler.peak_mib(step["start"], step["end"])
    return {"step": name, "seconds": round(seconds, 1),
            "seconds_per_audio_hour": round(seconds / audio_hours, 1) if name.startswith(TIME_GROWS) else None,
            "gpu_memory_peak_gib": None if peak is None else round(peak / 1024, 2),
            "disk_mib": round(disk / MIB, 1),
            "disk_gib_per_audio_hour": round(disk / GIB / audio_hours, 3) if name.startswith(DISK_GROWS) else None}


def measure(opts: Options, argv: list[str] | None = None) -> dict:
    opts.work.mkdir(parents=True, exist_ok=True)
    steps_log = opts.work / "steps.jsonl"
    steps_log.unlink(missing_ok=True)
    sampler = run_recipe(opts, steps_log)
    steps = [json.loads(line) for line in steps_log.read_text().splitlines()]
    data = collected(steps)
    audio_hours = data["audio_seconds"] / 3600
    return {"command": command_line("tools.recipe_cost", argv), "env": opts.env, "date": time.strftime("%Y-%m-%d"),
            "gpu": nvidia_smi("name"), "cpu": cpu_name(), "cpus": os.cpu_count(), "base": opts.base, "clips": data["clips"],
            "tokens": data["tokens"], "audio_hours": round(audio_hours, 4),
            "tokens_per_audio_hour": round(data["tokens"] / audio_hours),
            "steps": [step_row(step, sampler, audio_hours) for step in steps]}


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the base model: Hub id or local folder")
    p.add_argument("--work", required=True, help="the recipe's work folder (its artifact goes to WORK/artifact)")
    p.add_argument("--audio", help="your own speech instead of synthesised (train_heads.sh's AUDIO)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="a train_heads.sh setting")
    p.add_argument("--sample-seconds", type=cli_args.Number(float, 0.0, open_low=True), default=0.5,
                   help="how often GPU memory is read")
    p.add_argument("--out", required=True, help="the JSON to write")
    args = p.parse_args(argv)
    bad = [e for e in args.env if "=" not in e]
    if bad:
        p.error(f"--env {bad[0]}: write NAME=VALUE, e.g. --env HEADS=path")
    return Options(base=args.base, work=Path(args.work), out=Path(args.out), audio=args.audio,
                   env=dict(e.split("=", 1) for e in args.env), sample_seconds=args.sample_seconds)


def main(argv: list[str] | None = None) -> dict:
    opts = parse_args(argv)
    result = measure(opts, argv)
    write_json_atomic(opts.out, result, indent=1)
    for row in result["steps"]:
        per_hour = row["seconds_per_audio_hour"]
        print(f"{row['step']:>12}: {row['seconds']:8.1f} s" + (f" ({per_hour:.0f} s an audio hour)" if per_hour else "")
              + f", GPU peak {row['gpu_memory_peak_gib']} GiB, disk {row['disk_mib']} MiB")
    return result


if __name__ == "__main__":
    main()
