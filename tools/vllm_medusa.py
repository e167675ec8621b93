"""vLLM serving exported Medusa heads on real clips, against vLLM's own greedy and the HF base's (``make test-vllm``).

Two steps in two environments (vLLM brings its own torch and transformers):

    # the project's environment: the HF base's greedy ids and our Medusa chain (the same heads, top-1 of each)
    python -m tools.vllm_medusa reference --heads heads/whisper-base-vllm \\
        --audio work_data/eval_speech/manifest.jsonl --out work_data/vllm/reference.json
    # vLLM's environment: vLLM greedy, then vLLM + speculative_config medusa; compares and writes the summary row
    .venv-vllm/bin/python -m tools.vllm_medusa vllm --reference work_data/vllm/reference.json \\
        --draft-model work_data/vllm/whisper-base-medusa --summary benchmarks/scale_out/summary.json

Both transcribe with Whisper's prompt for English transcription without timestamps (what vLLM's transcription
endpoint writes). The ids compared are the text tokens (below <|endoftext|>). Tokens per verify pass: ours is
the tokens our rounds emitted per round; vLLM's is 1 + accepted drafts per draft pass (its spec-decode
counters), each pass emitting its accepted drafts and one token of the base. Exit status 1 when any output
differs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from tools import cli_args
from tools.files import command_line

ROOT = Path(__file__).resolve().parents[1]

PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
MAX_NEW_TOKENS = 200


def read_clips(manifest: Path, limit: int | None) -> list[dict]:
    rows = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def load_clip(manifest: Path, row: dict):
    from tools.audio_io import load_audio

    return load_audio(manifest.parent / row["audio"], 16000)


def text_ids(ids, eot: int) -> list[int]:
    return [int(t) for t in ids if int(t) < eot]


# --------------------------------------------------------------------------- reference (project environment)
def reference(args) -> None:
    import torch

    from modeling_medusa import MedusaForASR

    torch.set_num_threads(args.threads)
    model = MedusaForASR.from_pretrained(args.heads)
    eot = int(model.base.generation_config.eos_token_id)
    clips, emitted, rounds = [], 0, 0
    for row in read_clips(args.audio, args.limit):
        inputs = model.prepare_audio_inputs([load_clip(args.audio, row)], language="en", task="transcribe")
        options = dict(max_new_tokens=MAX_NEW_TOKENS)
        greedy = model.generate(**inputs, use_medusa=False, **options)
        medusa, stats = model.generate(**inputs, draft="chain", return_stats=True, **options)
        emitted, rounds = emitted + stats["emitted_tokens"], rounds + stats["row_rounds"]
        clips.append({"id": row["id"], "hf_greedy": text_ids(greedy[0], eot), "ours": text_ids(medusa[0], eot),
                      "text": model.decode_text(greedy)[0]})
        print(f"[reference] {row['id']}: {stats['mean_accepted_per_round']:.2f} tokens/pass", flush=True)
    result = {"heads": str(args.heads), "base": model.config.base_model_name_or_path, "eot": eot,
              "draft": "chain (top-1 of each head)", "tokens_per_pass": emitted / max(rounds, 1),
              "ours_identical_to_hf": all(c["ours"] == c["hf_greedy"] for c in clips), "clips": clips}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"[reference] {len(clips)} clips, ours == HF greedy: {result['ours_identical_to_hf']}, "
          f"{result['tokens_per_pass']:.2f} tokens/pass -> {args.out}")


# --------------------------------------------------------------------------- vLLM (its own environment)
def spec_counters(llm) -> dict:
    """vLLM's spec-decode counters (v1 metrics: drafts, draft tokens, accepted tokens)."""
    found = {}
    for metric in llm.get_metrics():
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            if metric.name == f"vllm:spec_decode_{key}":
                found[key] = found.get(key, 0) + int(metric.value)
    return found


def run_vllm(base: str, clips: list, draft_model: str | None, num_tokens: int) -> tuple[list, dict, float]:
    from vllm import LLM, SamplingParams

    spec = {"method": "medusa", "model": draft_model, "num_speculative_tokens": num_tokens} if draft_model else None
    llm = LLM(model=base, dtype="float32", max_model_len=448, limit_mm_per_prompt={"audio": 1},
              speculative_config=spec, disable_log_stats=False, seed=0, enforce_eager=True)
    prompts = [{"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio, 16000)}},
                "decoder_prompt": PROMPT} for audio in clips]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    ids = [list(out.outputs[0].token_ids) for out in outputs]
    counters = spec_counters(llm) if draft_model else {}
    del llm
    return ids, counters, seconds


def vllm_row(ref: dict, same_greedy: bool, same_hf: bool, counters: dict, seconds: float, command: str) -> dict:
    import platform

    drafts = counters.get("num_drafts", 0)
    return {"engine": "vllm", "model": ref["base"], "device": f"cpu ({platform.processor() or platform.machine()})",
            "workers": 1, "concurrency": None, "medusa": True, "clips": len(ref["clips"]), "requests": None,
            "clips_per_s": round(len(ref["clips"]) / seconds, 3), "requests_per_s": None, "p50_ms": None,
            "p95_ms": None, "errors": 0, "identical_to_single_process": same_greedy and same_hf,
            "tokens_per_pass": {"vllm": round(1 + counters.get("num_accepted_tokens", 0) / drafts, 3) if drafts else None,
                                "ours_same_heads_chain": round(ref["tokens_per_pass"], 3),
                                "vllm_counters": counters},
            "command": command, "date": time.strftime("%Y-%m-%d")}


def serve(args) -> int:
    ref = json.loads(args.reference.read_text())
    manifest = Path(args.audio)
    rows = {r["id"]: r for r in read_clips(manifest, None)}
    audio = [load_clip(manifest, rows[c["id"]]) for c in ref["clips"]]
    base = args.base or ref["base"]
    greedy, _, _ = run_vllm(base, audio, None, args.num_speculative_tokens)
    medusa, counters, seconds = run_vllm(base, audio, str(args.draft_model), args.num_speculative_tokens)
    eot = ref["eot"]
    same_greedy = same_hf = True
    for clip, plain, spec in zip(ref["clips"], greedy, medusa):
        plain, spec = text_ids(plain, eot), text_ids(spec, eot)
        same_greedy &= spec == plain
        same_hf &= spec == clip["hf_greedy"]
        if spec != plain or spec != clip["hf_greedy"]:
            print(f"[vllm] {clip['id']}: medusa {spec[:12]}... greedy {plain[:12]}... HF {clip['hf_greedy'][:12]}...")
    row = vllm_row(ref, same_greedy, same_hf, counters, seconds, command_line("tools.vllm_medusa"))
    print(json.dumps(row, indent=1))
    if args.summary:
        from tools.scale_out_rows import merge_rows

        merge_rows([row], args.summary)
    return 0 if same_greedy and same_hf else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    steps = p.add_subparsers(dest="step", required=True)
    r = steps.add_parser("reference", help="HF greedy + our Medusa chain (the project's environment)")
    r.add_argument("--heads", required=True, help="the heads artifact (residual-block heads)")
    r.add_argument("--audio", type=Path, default=ROOT / "work_data/eval_speech/manifest.jsonl")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--limit", type=cli_args.positive_int)
    r.add_argument("--threads", type=cli_args.positive_int, default=2)
    v = steps.add_parser("vllm", help="vLLM greedy and vLLM + Medusa (vLLM's environment)")
    v.add_argument("--reference", type=Path, required=True)
    v.add_argument("--draft-model", type=Path, required=True, help="folder written by pipeline.export_vllm")
    v.add_argument("--audio", type=Path, default=ROOT / "work_data/eval_speech/manifest.jsonl")
    v.add_argument("--base", help="base folder for vLLM (default: the reference's)")
    v.add_argument("--num-speculative-tokens", type=cli_args.positive_int, default=4)
    v.add_argument("--summary", type=Path, help="merge the row into this summary (benchmarks/scale_out/summary.json)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: a few clips need little
    if args.step == "reference":
        reference(args)
        return 0
    return serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
