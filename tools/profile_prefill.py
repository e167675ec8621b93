#!/usr/bin/env python
"""Cost of the prefill (speech encoder, cross-attention keys/values, the prompt's decoder pass) on a GPU,
eager and as captured CUDA graphs, for Whisper-shaped models with random weights; and a check that every
draft still gives the base's own greedy ids.

    python -m tools.profile_prefill --shapes tiny.en,base --dtypes float32,bfloat16 --out OUT

A prefill's cost does not depend on the weights' values, so random weights of the real shapes (all
encoder layers) measure it. Writes OUT/prefill_cost.json and prints each row.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tools.files import command_line, write_json_atomic
from tools.profile_rounds import SHAPES, build_model, timed


def cuda_ms(fn, repeats: int = 20) -> float:
    """Median milliseconds of ``fn`` after warm-up (CUDA events around each call)."""
    return round(timed(fn, torch.device("cuda"), repeats=repeats), 3)


def same_ids_as_base(model, features, max_new: int = 24) -> dict:
    want = model.base.generate(input_features=features, max_new_tokens=max_new, do_sample=False, num_beams=1)
    out = {}
    for draft in ("none", "chain", "tree"):
        got = model.generate(input_features=features, max_new_tokens=max_new, draft=draft)
        out[draft] = got.shape == want[:, -got.shape[1]:].shape and torch.equal(got.cpu(), want[:, -got.shape[1]:].cpu())
    return out


def prefill_row(model, shape: str, dtype_name: str) -> dict:
    backbone, calls, pool = model.backbone, model.round_cache.calls, model.round_cache.pool
    process = backbone.make_logits_processor(None)
    one = {"input_features": torch.randn(1, 80, 3000, device=model.base.device, dtype=model.base.dtype)}
    kv_eager, kv_graph = backbone._speech_kv(one), backbone._speech_kv(one, calls)
    return {
        "shape": shape, "dtype": dtype_name,
        "speech_kv_graph_equals_eager": all(torch.equal(a, b) for a, b in zip(kv_eager, kv_graph)),
        "speech_kv_eager_ms": cuda_ms(lambda: backbone._speech_kv(one)),
        "speech_kv_graph_ms": cuda_ms(lambda: backbone._speech_kv(one, calls)),
        "prefill_eager_ms": cuda_ms(lambda: backbone.prefill(one, 100, 34, process, cache_pool=pool)),
        "prefill_captured_ms": cuda_ms(lambda: backbone.prefill(one, 100, 34, process, cache_pool=pool, capture=calls)),
        "generate_30_tokens_ms": cuda_ms(lambda: model.generate(**one, max_new_tokens=30, min_new_tokens=30,
                                                                draft="none"), repeats=10),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.profile_prefill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="tiny.en,base")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--out", default="work_data/prefill_cost")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_prefill.py times CUDA graphs: run it on a machine with a CUDA GPU.")
    import transformers

    device, rows = torch.device("cuda"), []
    with torch.no_grad():
        for shape in args.shapes.split(","):
            for dtype_name in args.dtypes.split(","):
                model = build_model(shape, getattr(torch, dtype_name), device, "path", 8192,
                                    encoder_layers=SHAPES[shape][1])
                torch.manual_seed(1)
                features = torch.randn(2, 80, 3000, device=device, dtype=model.base.dtype)
                row = {**prefill_row(model, shape, dtype_name), "same_ids_as_base": same_ids_as_base(model, features)}
                print(json.dumps(row), flush=True)
                rows.append(row)
                model.release_caches()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d"),
            "command": command_line("tools.profile_prefill", argv)}
    write_json_atomic(Path(args.out) / "prefill_cost.json", {**meta, "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
