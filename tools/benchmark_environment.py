"""What a ``tools.benchmark`` run records about where it ran: the machine, its load and the software versions
(``environment`` in results.json), and the memory the decoders used (``memory``)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


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
        name = cpu_name()
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
        "load_average_at_start": load_average(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if device.startswith("cuda") else None,
        "transformers_version": transformers.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "dtype": str(dtype).replace("torch.", ""),
        "git": _git_info(),
    }


def cpu_name() -> str:
    from draft_policy import processor_name

    return processor_name()


def cpu_seconds():
    """(seconds every CPU spent busy, seconds this process used) so far; None where /proc/stat is not there.
    Their change over a run tells what other processes took, which a load average (still high from a run that
    just ended) does not."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:8]
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields)
    except (OSError, IndexError, ValueError):
        return None
    own = os.times()
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK"), own.user + own.system


def other_processes_cpus(start, end, wall_seconds: float):
    """CPUs' worth of work done by other processes between two ``cpu_seconds()`` readings."""
    if start is None or end is None or wall_seconds <= 0:
        return None
    others = (end[0] - start[0]) - (end[1] - start[1])
    return round(max(others, 0.0) / wall_seconds, 2)


def load_average():
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
