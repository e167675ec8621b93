"""Refresh an exported artifact's benchmark figures and model card from new benchmark runs.

    python -m pipeline.update_card heads/whisper-base benchmarks/real_speech/gpu_base_*/results.json

Each ``results.json`` (written by ``tools.benchmark``) replaces the artifact's ``config.json`` benchmark entry
with the same label (device, dtype, draft, rounds mode) or adds one; the fields that tell transformers how to
load the artifact (``auto_map``, the ASR pipeline) are written as ``save_pretrained`` writes them today (with
no results, only they are refreshed); the README.md model card is then rendered again from the updated config.
Heads, tree and training provenance are left as exported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pipeline.collect import run_cli
from pipeline.export import compact_benchmark
from pipeline.model_card import render_model_card
from tools.files import write_atomic, write_json_atomic


def update_benchmarks(artifact: str, results: list[str]) -> list[str]:
    """Write the new entries into ``artifact``/config.json and re-render its README.md; returns the labels."""
    config_path = os.path.join(artifact, "config.json")
    if not os.path.isfile(config_path):
        raise SystemExit(f"{artifact}: no config.json (pass an exported artifact folder)")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    from modeling_medusa import loading_fields

    config.update(loading_fields(config["base_family"]))
    labels = []
    for path in results:
        label, row = compact_benchmark(path)
        config.setdefault("benchmark", {})[label] = row
        labels.append(label)
    write_json_atomic(config_path, config, sort_keys=True)
    write_atomic(os.path.join(artifact, "README.md"), render_model_card(config))
    return labels


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.update_card", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", help="exported artifact folder (holds config.json)")
    p.add_argument("results", nargs="*", help="tools.benchmark results.json files")
    args = p.parse_args(argv)
    for label in update_benchmarks(args.artifact, args.results):
        print(f"[update_card] {args.artifact}: {label}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
