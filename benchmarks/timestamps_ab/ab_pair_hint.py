"""Timestamped Medusa with and without drafting the timestamp that opens the next segment (``hint_drafts``), on
windows of several segments: the eval recordings of one source joined with 0.3 s gaps up to 29.5 s. The base's
own timestamped ``generate`` gives the reference ids; the two variants run interleaved, 3 repeats, medians.
Writes one JSON file with the command.

    python benchmarks/timestamps_ab/ab_pair_hint.py --model heads/whisper-tiny.en --out benchmarks/timestamps_ab/cpu_tiny.en.json
"""

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, ".")
import backbone_whisper  # noqa: E402
from tools import runtime  # noqa: E402
from tools.audio_io import load_audio  # noqa: E402
from tools.files import write_json_atomic  # noqa: E402

SOURCES = ("sonnet", "librivox", "librispeech")  # id prefixes of the eval manifest with several utterances
GAP_SECONDS, WINDOW_SECONDS, RATE = 0.3, 29.5, 16000
HINT = backbone_whisper.TimestampRules.hint_drafts


def no_hint(self, chunk, history):
    return chunk


def windows(manifest: Path) -> dict:
    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    joined = {}
    for source in SOURCES:
        pieces, seconds = [], 0.0
        for row in (r for r in rows if r["id"].startswith(source)):
            audio = load_audio(manifest.parent / row["audio"], RATE)
            if seconds + len(audio) / RATE > WINDOW_SECONDS:
                break
            pieces += [audio, np.zeros(int(GAP_SECONDS * RATE), np.float32)]
            seconds += len(audio) / RATE + GAP_SECONDS
        joined[source] = (seconds, np.concatenate(pieces))
    return joined


def timed_call(model, inputs, draft: str, hint: bool):
    backbone_whisper.TimestampRules.hint_drafts = HINT if hint else no_hint
    runtime.synchronize(model)
    start = time.perf_counter()
    out, stats = model.generate(**inputs, draft=draft, return_timestamps=True, return_stats=True)
    runtime.synchronize(model)
    return time.perf_counter() - start, out, stats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="heads/whisper-tiny.en")
    parser.add_argument("--manifest", type=Path, default=Path("work_data/eval_speech/manifest.jsonl"))
    parser.add_argument("--draft", default="chain")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    runtime.add_device_options(parser, threads=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runtime.quiet_generate_notices(False)
    device = runtime.resolve_device(args.device)
    model = runtime.load_medusa(args.model, runtime.resolve_dtype(args.dtype, device),
                                base=runtime.base_to_load(args.model)).to(device).eval()
    rows = []
    for source, (seconds, audio) in windows(args.manifest).items():
        inputs = runtime.to_model(model.prepare_audio_inputs([audio], sampling_rate=RATE), model)
        with torch.no_grad():
            reference = model.generate(**inputs, use_medusa=False, return_timestamps=True)
            runs = {True: [], False: []}
            for hint in (True, False):  # warm-up
                timed_call(model, inputs, args.draft, hint)
            for repeat in range(args.repeats):
                for hint in ((True, False) if repeat % 2 == 0 else (False, True)):
                    runs[hint].append(timed_call(model, inputs, args.draft, hint))
        row = {"window": source, "seconds": round(seconds, 2)}
        for hint, name in ((False, "heads_only"), (True, "with_hint")):
            _, out, stats = runs[hint][-1]
            row[name] = {"call_ms": 1000 * statistics.median(r[0] for r in runs[hint]),
                         "rounds_ms": 1000 * statistics.median(r[2]["rounds_seconds"] for r in runs[hint]),
                         "rounds": stats["rounds"], "new_tokens": stats["new_tokens"],
                         "tokens_per_round": stats["new_tokens"] / stats["rounds"],
                         "exact": torch.equal(out.cpu(), reference.cpu())}
        row["rounds_speedup"] = row["heads_only"]["rounds_ms"] / row["with_hint"]["rounds_ms"]
        row["call_speedup"] = row["heads_only"]["call_ms"] / row["with_hint"]["call_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    command = shlex.join(["python", "benchmarks/timestamps_ab/ab_pair_hint.py", *sys.argv[1:]])
    write_json_atomic(args.out, {"command": command, "model": args.model, "draft": args.draft,
                                 "device": str(device), "dtype": str(model.dtype), "torch": torch.__version__,
                                 "date": time.strftime("%Y-%m-%d"), "rows": rows})


if __name__ == "__main__":
    main()
