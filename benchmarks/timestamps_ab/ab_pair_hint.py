"""Timestamped Medusa with and without drafting the timestamp that opens the next segment (``hint_drafts``), on
windows of several segments: the eval recordings of one source joined with 0.3 s gaps up to 29.5 s of speech. The base's
own timestamped ``generate`` gives the reference ids; the two variants run interleaved, 3 repeats, medians.
Each variant has its own copy of the model: on a GPU the rounds are captured graphs, which keep whichever variant
they were captured with. Writes one JSON file with the command.

    python benchmarks/timestamps_ab/ab_pair_hint.py --model heads/whisper-tiny.en --out benchmarks/timestamps_ab/cpu_tiny.en.json
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, ".")
import backbone_whisper  # noqa: E402
from pipeline.quantise import GAP_SECONDS, pack_clips, window_audio  # noqa: E402
from tools import runtime  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402

SOURCES = ("sonnet", "librivox", "librispeech")  # id prefixes of the eval manifest with several utterances
WINDOW_SECONDS, RATE = 29.5, 16000
HINT = backbone_whisper.TimestampRules.hint_drafts


def no_hint(self, chunk, history):
    return chunk


def windows(manifest: Path) -> dict:
    """Per source, its first recordings joined into one window (``pipeline.quantise``'s packing: 0.3 s gaps)."""
    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    joined = {}
    for source in SOURCES:
        clips = [{**row, "audio": str(manifest.parent / row["audio"])} for row in rows if row["id"].startswith(source)]
        window = pack_clips(clips, WINDOW_SECONDS)[0]
        joined[source] = (sum(c["duration"] for c in window) + GAP_SECONDS * (len(window) - 1), window_audio(window)[0])
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
    models = {hint: runtime.load_medusa(args.model, runtime.resolve_dtype(args.dtype, device),
                                        base=runtime.base_to_load(args.model)).to(device).eval()
              for hint in (True, False)}
    model = models[True]
    rows = []
    for source, (seconds, audio) in windows(args.manifest).items():
        inputs = runtime.to_model(model.prepare_audio_inputs([audio], sampling_rate=RATE), model)
        with torch.no_grad():
            reference = model.generate(**inputs, use_medusa=False, return_timestamps=True)
            runs = {True: [], False: []}
            for hint in (True, False):  # warm-up
                timed_call(models[hint], inputs, args.draft, hint)
            for repeat in range(args.repeats):
                for hint in ((True, False) if repeat % 2 == 0 else (False, True)):
                    runs[hint].append(timed_call(models[hint], inputs, args.draft, hint))
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
    command = command_line("benchmarks/timestamps_ab/ab_pair_hint.py")
    write_json_atomic(args.out, {"command": command, "model": args.model, "draft": args.draft,
                                 "device": str(device), "dtype": str(model.dtype), "torch": torch.__version__,
                                 "date": time.strftime("%Y-%m-%d"), "rows": rows})


if __name__ == "__main__":
    main()
