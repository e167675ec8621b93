#!/usr/bin/env python
"""Measure the engines past one process on this machine, in one run, and merge the rows into
benchmarks/scale_out/summary.json (``tools.scale_out_rows``): Ray Data bulk transcription with 1 and 2 CPU actors,
and the Ray Serve endpoint's latency (p50, p95) and requests/s at 1, 4 and 16 concurrent clients, with and
without Medusa; every row says whether its texts equal the single-process command's on the same clips.

    nice -n 10 python -m tools.bench_scale_out --clips 8

The clips are flite speech of the long-recording sentences (``tools.long_recording``), written under
--work. Each row records the command, the date, and the machine's load average before and after the run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tools import cli_args, runtime, scale_out_rows, transcribe
from tools.benchmark_inputs import read_manifest

VOICES = ("slt", "rms", "awb", "kal16")
CONCURRENCY = (1, 4, 16)


def make_clips(folder: Path, count: int) -> list[Path]:
    from tools.long_recording import LONG_TEXT, flite

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"clip{i:03d}.wav"
        if not path.is_file():
            flite(LONG_TEXT[i % len(LONG_TEXT)], path, VOICES[i % len(VOICES)])
        paths.append(path)
    return paths


def single_process_texts(clips: list[Path], folder: Path, model: str, device: str = "cpu",
                         dtype: str = "auto") -> dict[str, str]:
    """Per clip, the text of ``python -m tools.transcribe CLIPS --format json`` (run in this process)."""
    code = transcribe.main([*map(str, clips), "--model", model, "--format", "json", "--output", str(folder),
                            "--overwrite", "--quiet", "--device", device, "--dtype", dtype])
    if code != 0:
        raise RuntimeError(f"the single-process command failed on the clips (exit {code})")
    return {str(p.resolve()): json.loads((folder / f"{p.stem}.json").read_text())["text"] for p in clips}


def ray_data_rows(clips, reference, work: Path, model: str, batch_size: int) -> list[dict]:
    from tools import bulk

    rows = []
    for workers in (1, 2):
        output = work / f"bulk_{workers}"
        summary = bulk.bulk_transcribe([str(c) for c in clips], str(output), model=model, workers=workers,
                                       cpus_per_worker=1, batch_size=batch_size, overwrite=True)
        written = {r["path"]: r for r in bulk.read_rows(str(output))}
        rows.append({"engine": "ray_data", "workers": workers, "medusa": True, "clips": len(clips),
                     "clips_per_s": round(len(clips) / summary.wall_seconds, 3), "wall_s": round(summary.wall_seconds, 2),
                     "errors": summary.errors, "batch_size": batch_size, "cpus_per_worker": 1,
                     "identical_to_single_process": all(written[p]["text"] == t for p, t in reference.items()),
                     "note": "wall from the call to the last row written: Ray Data's start, each actor's model load "
                             "and the writes included"})
    return rows


def actor_batch_rows(clips, reference, model: str, batch_sizes: list[int], device: str, dtype: str,
                     total: int) -> list[dict]:
    """Clips/s of one bulk actor's batch function (``SpeechBatcher``, what each Ray Data actor runs) at each batch
    size, with and without Medusa, on ``total`` recordings (the clips repeated), after one untimed batch; timed
    without Ray, which adds its scheduling around the same calls (e.g. on a GPU host where Ray is not installed)."""
    from tools import audio_io, speech_batch

    audios = [audio_io.load_audio(str(clips[i % len(clips)])) for i in range(total)]
    expected = [reference[str(clips[i % len(clips)])] for i in range(total)]
    options, rows = speech_batch.DecodeOptions(), []
    for medusa in (True, False):
        batcher = speech_batch.SpeechBatcher(speech_batch.ModelOptions(model=model, device=device, dtype=dtype,
                                                                       medusa=medusa))
        checked = batcher.check(options)
        for batch_size in batch_sizes:
            batcher.batch_size = batch_size
            batcher.transcribe(audios[:batch_size], checked)  # (first calls: allocations, graphs, draft timing)
            started = time.perf_counter()
            results = batcher.transcribe(audios, checked)
            wall = time.perf_counter() - started
            rows.append({"engine": "ray_data", "workers": 1, "medusa": medusa, "clips": total,
                         "clips_per_s": round(total / wall, 2), "wall_s": round(wall, 3), "batch_size": batch_size,
                         "errors": sum(r.error is not None for r in results),
                         "identical_to_single_process": [r.text for r in results] == expected,
                         "draft": results[0].draft, "without_ray": True,
                         "note": "one actor's batch function (tools.speech_batch.SpeechBatcher) timed without Ray; "
                                 "model loading excluded"})
        del batcher
    return rows


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_rows(clips, reference, model: str, requests_per_level: int, max_batch_size: int) -> list[dict]:
    import openai
    from ray import serve

    from tools import serve as serving

    rows, port = [], free_port()  # (Serve keeps its first HTTP options for the session)
    for medusa in (True, False):
        serving.start(model, port=port, medusa=medusa, max_batch_size=max_batch_size, threads=None)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                               timeout=600)
        name = serving.served_name(model)

        def ask(path: Path):
            started = time.perf_counter()
            with open(path, "rb") as handle:
                text = client.audio.transcriptions.create(file=handle, model=name).text
            return time.perf_counter() - started, text

        ask(clips[0])  # the replica's first call (draft timing, allocations) is not the service's steady state
        for concurrency in CONCURRENCY:
            jobs = [clips[i % len(clips)] for i in range(max(requests_per_level, concurrency))]
            started = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                answers = list(pool.map(ask, jobs))
            wall = time.perf_counter() - started
            latencies = np.array([seconds for seconds, _ in answers]) * 1000
            rows.append({"engine": "ray_serve", "concurrency": concurrency, "medusa": medusa, "requests": len(jobs),
                         "requests_per_s": round(len(jobs) / wall, 3),
                         "p50_ms": round(float(np.percentile(latencies, 50)), 1),
                         "p95_ms": round(float(np.percentile(latencies, 95)), 1), "errors": 0,
                         "max_batch_size": max_batch_size,
                         "identical_to_single_process": all(text == reference[str(p.resolve())]
                                                            for p, (_, text) in zip(jobs, answers))})
        serve.delete("medusa-asr")
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_scale_out", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help=f"heads folder (default: {transcribe.DEFAULT_MODEL})")
    parser.add_argument("--clips", type=runtime.positive_int, default=8, help="flite clips (default: 8)")
    parser.add_argument("--requests", type=runtime.positive_int, default=16,
                        help="requests per concurrency level, at least the concurrency (default: 16)")
    parser.add_argument("--batch-size", type=runtime.positive_int, default=4,
                        help="Ray Data's recordings per generate (default: 4)")
    parser.add_argument("--max-batch-size", type=runtime.positive_int, default=16,
                        help="Serve's requests per batched generate (default: 16)")
    parser.add_argument("--sections", default="ray_data,ray_serve",
                        help="any of ray_data, ray_serve and actor_batches (one actor's batches timed without Ray)")
    parser.add_argument("--audio", type=Path, default=None,
                        help="a manifest.jsonl of recordings instead of --clips flite clips")
    parser.add_argument("--actor-batches", type=cli_args.positive_ints, default=[1, 16, 64],
                        help="actor_batches: batch sizes (default: 1,16,64)")
    parser.add_argument("--actor-clips", type=runtime.positive_int, default=128,
                        help="actor_batches: recordings per timed run, the clips repeated (default: 128)")
    runtime.add_device_options(parser, device="cpu")
    parser.add_argument("--work", type=Path, default=Path("work_data/scale_out"), help="clips and outputs")
    parser.add_argument("--summary", type=Path, default=scale_out_rows.SUMMARY, help="rows merged into this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    import torch

    args = build_parser().parse_args(argv)
    command = "python -m tools.bench_scale_out " + shlex.join(sys.argv[1:] if argv is None else argv)
    model = args.model or transcribe.default_model_path()
    load_before = [round(x, 2) for x in os.getloadavg()]
    runtime.time_drafts_afresh()
    clips = ([row["audio"].resolve() for row in read_manifest(str(args.audio))] if args.audio
             else make_clips(args.work / "clips", args.clips))
    device = runtime.resolve_device(args.device)
    reference = single_process_texts(clips, args.work / "single", model, device, args.dtype)
    sections = set(args.sections.split(","))
    rows = []
    if "actor_batches" in sections:
        rows += actor_batch_rows(clips, reference, model, args.actor_batches, device, args.dtype, args.actor_clips)
    if sections & {"ray_data", "ray_serve"}:
        from tools import bulk

        bulk.start_ray()
    if "ray_data" in sections:
        rows += ray_data_rows(clips, reference, args.work, model, args.batch_size)
    if "ray_serve" in sections:
        rows += serve_rows(clips, reference, model, args.requests, args.max_batch_size)
    machine = {"cpus": os.cpu_count(), "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
               "shared": "a 2-core machine shared with other engineers' jobs during the run: figures are what this "
                         "load allowed, not the machine's best; rerun when quiet"}
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    model_name = Path(model).name
    device_name = "cpu" if device == "cpu" else torch.cuda.get_device_name(device)
    rows = [{"model": model_name, "device": device_name, "dtype": args.dtype, "workers": None, "concurrency": None, "clips": None,
             "requests": None, "clips_per_s": None, "requests_per_s": None, "p50_ms": None, "p95_ms": None,
             "tokens_per_pass": None, **row, "command": command, "date": date, "machine": machine} for row in rows]
    scale_out_rows.merge_rows(rows, args.summary)
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if v is not None and k not in ("command", "machine")}))
    print(f"machine load (1, 5, 15 min) before {load_before}, after {machine['load_after']}; rows in {args.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
