"""Where a whole ``generate`` call's time goes outside its rounds on a GPU: random weights of the real Whisper shapes
(every encoder layer, path heads with an 8 192-token draft vocabulary, as the committed heads), one 30 s window,
a fixed number of new tokens. Per shape: the call's wall time and the phases ``return_stats`` reports (medians),
the host's Python time per function over the calls (cProfile: its own overhead inflates every figure, so read
the ranking and the shares), torch.profiler's host ops and device kernels per call, and how the host reads each
round's verdict (``--readbacks``, alternated call by call: ``sync``, ``tolist()`` of the device tensor, a blocking
copy through pageable memory, against ``pinned``, the rounds' own form since the H100 A/B of 2026-12-05: a copy into
page-locked memory then waited on; the GPU idles while the host reads, decides and relaunches, so the form is part
of every round's cost).

    python benchmarks/round_cost/call_overhead.py --shapes tiny.en,base \
        --out benchmarks/round_cost/h200_call_overhead.json

A call's cost outside its rounds does not depend on the weights' values; the rounds' count does (the replayed
drafts of random heads are rarely accepted), so compare ``outside_rounds_ms``, not whole calls, with real clips.
"""

import argparse
import cProfile
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from medusa_fast import CapturedRounds  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402
from tools.profile_rounds import build_model  # noqa: E402

ENCODER_LAYERS = {"tiny.en": 4, "base": 6}


def call(model, features, tokens: int, draft: str, stats: bool = False):
    return model.generate(input_features=features, max_new_tokens=tokens, min_new_tokens=tokens, draft=draft,
                          return_stats=stats)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_ms(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1000


def phases(model, features, tokens: int, draft: str, repeats: int) -> dict:
    walls, laps = [], []
    for _ in range(repeats):
        walls.append(wall_ms(lambda: call(model, features, tokens, draft)))
        sync()
        start = time.perf_counter()
        _, stats = call(model, features, tokens, draft, stats=True)
        sync()
        laps.append({**{k: v * 1000 for k, v in stats.items() if k.endswith("_seconds")},
                     "wall_with_stats_ms": (time.perf_counter() - start) * 1000, "rounds": stats["rounds"]})
    out = {"wall_ms": round(statistics.median(walls), 3)}
    for key in laps[0]:
        out[key.replace("_seconds", "_ms")] = round(statistics.median(lap[key] for lap in laps), 3)
    out["outside_rounds_ms"] = round(out["wall_with_stats_ms"] - out["rounds_ms"], 3)
    return out


def tolist_read(self) -> list:
    """The verdict read by ``tolist()`` of the device tensor, a blocking copy through pageable memory (the rounds'
    own read until the H100 A/B of 2026-12-05 chose the page-locked one)."""
    return self.result.tolist()


ROUNDS_OWN_READ = CapturedRounds._read_result  # page-locked: "pinned"
READBACKS = {"sync": tolist_read, "pinned": ROUNDS_OWN_READ}


def readback_forms(model, features, tokens: int, draft: str, forms: list[str], repeats: int) -> dict:
    """Per form of reading a round's verdict: the median call and round in the loop (calls alternated)."""
    if not torch.cuda.is_available():
        return {}
    samples = {form: [] for form in forms}
    try:
        for _ in range(repeats):
            for form in forms:
                CapturedRounds._read_result = READBACKS[form]
                start = time.perf_counter()
                _, stats = call(model, features, tokens, draft, stats=True)
                sync()
                samples[form].append(((time.perf_counter() - start) * 1000, stats["rounds_seconds"] * 1000 / stats["rounds"]))
    finally:
        CapturedRounds._read_result = ROUNDS_OWN_READ
    return {form: {"wall_ms": round(statistics.median(s[0] for s in rows), 3),
                   "round_in_loop_us": round(statistics.median(s[1] for s in rows) * 1000, 1)}
            for form, rows in samples.items()}


def readback_row(model, features, tokens: int, draft: str, readbacks: str, repeats: int) -> dict:
    """``readback_forms`` for the row, or the error it raised (an experiment: its failure must not cost the lease
    the rest of the row)."""
    try:
        return readback_forms(model, features, tokens, draft, readbacks.split(","), repeats)
    except Exception as error:  # noqa: BLE001
        return {"error": " ".join(str(error).split())[:300]}


def host_functions(model, features, tokens: int, draft: str, calls: int, top: int) -> list[dict]:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call(model, features, tokens, draft)
    sync()
    profiler.disable()
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in pstats.Stats(profiler).stats.items():
        rows.append({"function": f"{file.split('/')[-1]}:{line}:{name}", "calls_per_call": ncalls / calls,
                     "self_us_per_call": round(tottime / calls * 1e6, 1),
                     "cumulative_us_per_call": round(cumtime / calls * 1e6, 1)})
    by_self = sorted(rows, key=lambda r: -r["self_us_per_call"])[:top]
    by_cumulative = sorted(rows, key=lambda r: -r["cumulative_us_per_call"])[:top]
    return {"by_self": by_self, "by_cumulative": by_cumulative}


def device_and_ops(model, features, tokens: int, draft: str, calls: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call(model, features, tokens, draft)
        sync()
    events = prof.key_averages()
    kernels = [e for e in events if getattr(e, "device_time_total", 0) > 0 and e.self_cpu_time_total == 0]
    ops = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    return {
        "device_kernels_per_call": sum(e.count for e in kernels) / calls,
        "device_us_per_call": round(sum(e.device_time_total for e in kernels) / calls, 1),
        "host_ops": [{"op": e.key[:80], "calls_per_call": e.count / calls,
                      "self_cpu_us_per_call": round(e.self_cpu_time_total / calls, 1)} for e in ops],
        "kernels": [{"kernel": e.key[:80], "calls_per_call": e.count / calls,
                     "us_per_call": round(e.device_time_total / calls, 1)}
                    for e in sorted(kernels, key=lambda e: -e.device_time_total)[:top]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="tiny.en,base")
    parser.add_argument("--tokens", type=int, default=12, help="new tokens a call (the 28 recordings average 12)")
    parser.add_argument("--drafts", default="none,chain")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--readbacks", default="pinned,sync", help="forms of reading a round's verdict to alternate")
    parser.add_argument("--phases-only", action="store_true",
                        help="only the call's phases (no readback forms, host profile or torch.profiler): an A/B of "
                             "two versions of the code, run in turn from their own folders")
    parser.add_argument("--label", default=None, help="what code this run measured (recorded in the JSON)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    unknown = set(args.readbacks.split(",")) - set(READBACKS)
    if unknown:
        parser.error(f"--readbacks: unknown form(s) {sorted(unknown)}; use {', '.join(READBACKS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU: a check of the script only
    rows = []
    for shape in args.shapes.split(","):
        model = build_model(shape, torch.bfloat16, device, "path", 8192, ENCODER_LAYERS[shape])
        features = torch.randn(1, 80, 3000, device=device, dtype=torch.bfloat16)
        for draft in args.drafts.split(","):
            for _ in range(5):
                call(model, features, args.tokens, draft)
            row = {"shape": shape, "draft": draft, "tokens": args.tokens,
                   **phases(model, features, args.tokens, draft, args.repeats)}
            if not args.phases_only:
                row["readback"] = readback_row(model, features, args.tokens, draft, args.readbacks, args.repeats)
            print(row, flush=True)
            if not args.phases_only:
                row["host_functions"] = host_functions(model, features, args.tokens, draft, args.repeats, args.top)
                row["profiler"] = device_and_ops(model, features, args.tokens, draft, 10, args.top)
            rows.append(row)
        model.release_caches()
        del model
        torch.cuda.empty_cache()
    write_json_atomic(args.out, {"command": command_line("benchmarks/round_cost/call_overhead.py"), "label": args.label,
                                 "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None, "torch": torch.__version__,
                                 "date": time.strftime("%Y-%m-%d"), "rows": rows})


if __name__ == "__main__":
    main()
