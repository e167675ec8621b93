"""Stage 3: package trained heads as a Hub-ready Medusa artifact folder.

    python -m pipeline.export --base openai/whisper-tiny.en --heads work_data/ckpt/best.safetensors \\
        --out work_data/artifacts/whisper-tiny.en [--tree auto|chain] [--benchmark bench.json] [--data-info extra.json]

Builds ``MedusaForASR.from_base`` + the trained heads, records provenance in the config
(``training_data`` from the collect folder's ``collect_info.json`` and the training metrics,
``head_accuracy`` from ``metrics.json``), picks the draft tree from the measured per-head top-k accuracy,
saves everything into a temporary folder with the ``--benchmark`` rows (``results.json``, ``speedup.png``) and
the README.md model card rendered from them, and only then moves it into ``--out``. An existing, non-empty ``--out``
must be a previous export that git does not track (``--force`` overrides): a shipped artifact is never
replaced by accident.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from pipeline.collect import (_summarise_entries, import_medusa, load_from_base, parse_device,
                              parse_dtype, run_cli)
from pipeline.model_card import render_model_card
from pipeline.update_card import PLOT_FILE, draw_speedup, result_row, write_results
from tools import cli_args
from tools.files import apply_umask, command_line, write_atomic
from tools.runtime import add_device_options

HEAD_KEY = re.compile(r"^blocks\.(\d+)\.layers\.(\d+)\.weight$")
TRAINING_KEYS = ("epochs", "batch_size", "lr", "warmup_steps", "seed", "val_fraction", "min_tokens", "dtype",
                 "soft_labels", "draft_vocab")


def heads_shape(state: dict) -> tuple[int, int]:
    """(num_heads, num_layers) from vLLM-style keys ``blocks.{i}.layers.{j}.weight``."""
    found = [tuple(map(int, m.groups())) for m in map(HEAD_KEY.match, state) if m]
    if not found:
        raise SystemExit("the heads file has no blocks.{i}.layers.{j}.weight tensors")
    return max(i for i, _ in found) + 1, max(j for _, j in found) + 1


def heads_kind(path: str, state: dict) -> dict:
    """The head shape recorded by pipeline.train in the checkpoint's metadata (older checkpoints: Medusa
    heads, shape read from the tensor names)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    if "head_kind" in meta:
        return {"head_kind": meta["head_kind"], "medusa_num_heads": int(meta["num_heads"]),
                "medusa_num_layers": int(meta["num_layers"]), "speech_attention": meta.get("speech_attention") == "true"}
    num_heads, num_layers = heads_shape(state)
    return {"head_kind": "medusa", "medusa_num_heads": num_heads, "medusa_num_layers": num_layers,
            "speech_attention": False}


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _load_data_info(spec: str) -> dict:
    """A collect folder, a collect_info.json / any JSON dict, or a manifest.jsonl."""
    if os.path.isdir(spec):
        path = os.path.join(spec, "collect_info.json")
        if not os.path.exists(path):
            raise SystemExit(f"--data-info {spec}: no collect_info.json in that folder")
        return {"collect": _read_json(path)}
    if spec.endswith(".jsonl"):
        with open(spec, encoding="utf-8") as f:
            entries = [json.loads(line) for line in f if line.strip()]
        return {"manifest": _summarise_entries(entries)}
    info = _read_json(spec)
    if "audio_source" in info and "runs" in info:  # a collect_info.json
        return {"collect": info}
    return {"overrides": info}


def _source_name(src: dict) -> str | None:
    kind, path = src.get("kind"), src.get("path")
    if kind == "hf_dataset":
        name = src.get("name", "")
        return name + (f":{src['config']}" if src.get("config") else "") + f" ({src.get('split', 'train')})"
    if kind == "manifest" and path:  # never leak absolute local paths into the artifact
        return f"{os.path.basename(os.path.dirname(path))}/{os.path.basename(path)}"
    if kind == "folder" and path:
        return os.path.basename(path.rstrip("/"))
    return src.get("spec")


def build_training_data(metrics: dict, infos: list[dict]) -> dict:
    collects = [i["collect"] for i in infos if "collect" in i]
    collect = collects[-1] if collects else {}
    src = collect.get("audio_source", {})
    data = metrics.get("data", {})
    td = {
        "source": _source_name(src),
        "kind": src.get("kind"),
        "n_utterances": collect.get("n_utterances", data.get("n_utterances")),
        "n_tokens": collect.get("n_tokens", data.get("n_tokens")),
        "n_train_utterances": data.get("n_train_utterances"),
        "n_val_utterances": data.get("n_val_utterances"),
    }
    if src.get("kind") == "hf_dataset":
        td["hf_dataset"] = src.get("name")
    for key in ("voices", "licence", "sources", "languages", "hours"):
        if key in src:
            td[key] = src[key]
    if len(collects) > 1:  # trained on several collect folders (languages, timestamps): what each held, and the sums
        td.update(_combined_collects(collects))
    elif collect.get("language") and "languages" not in td:  # (draft="auto" drafts only in the heads' languages)
        td["languages"] = [collect["language"]]
    for info in infos:
        for key, value in info.get("manifest", {}).items():
            td.setdefault(key, value)
    collection = {k: v for k, v in {
        "base_dtype": (data.get("collected_with") or {}).get("dtype"),
        "max_new_tokens": collect.get("max_new_tokens"),
        "skip_first": src.get("skip") or None,
        "throughput": collect.get("throughput"),
    }.items() if v}
    if collection:
        td["collection"] = collection
    train_args = metrics.get("train_args", {})
    training = {k: train_args[k] for k in TRAINING_KEYS if train_args.get(k) is not None}
    if train_args.get("init_heads"):  # fine-tuned from these heads (their folder and file, not this machine's path)
        training["init_heads"] = "/".join(os.path.normpath(train_args["init_heads"]).split(os.sep)[-2:])
    if metrics:
        training.update({"best_step": metrics.get("step"), "total_steps": metrics.get("total_steps")})
    if training:
        td["training"] = training
    for info in infos:
        td.update(info.get("overrides", {}))
    return {k: v for k, v in td.items() if v is not None}


def _combined_collects(collects: list[dict]) -> dict:
    parts = [{k: v for k, v in {"source": _source_name(c.get("audio_source", {})), "language": c.get("language"),
                                "timestamps": c.get("timestamps") or None, "n_utterances": c.get("n_utterances"),
                                "n_tokens": c.get("n_tokens"), "hours": c.get("audio_source", {}).get("hours")}.items()
              if v is not None} for c in collects]

    def union(key):
        return sorted({x for c in collects for x in c.get("audio_source", {}).get(key, [])})

    combined = {"parts": parts, "source": ", ".join(p["source"] for p in parts if p.get("source")),
                "n_utterances": sum(p.get("n_utterances", 0) for p in parts),
                "n_tokens": sum(p.get("n_tokens", 0) for p in parts),
                "languages": sorted({p["language"] for p in parts if p.get("language")}),
                "timestamps": any(p.get("timestamps") for p in parts)}
    for key in ("voices", "licence", "sources"):
        combined[key] = union(key)
    hours = [p["hours"] for p in parts if p.get("hours")]
    if hours:
        combined["hours"] = round(sum(hours), 4)
    return {k: v for k, v in combined.items() if v not in ([], "")}


def build_head_accuracy(metrics: dict) -> dict:
    acc = dict(metrics.get("head_accuracy") or {})
    if acc:
        acc["val_loss"] = metrics.get("val_loss")
        acc["step"] = metrics.get("step")
        acc["held_out"] = metrics.get("held_out", True)
    return acc


def choose_tree(mode: str, head_accuracy: dict, num_nodes: int, num_heads: int):
    """None (= chain) or a list of per-head rank paths chosen from the measured top-k accuracy (the
    trees pipeline.train replays are built the same way, so a size it measured is that very tree)."""
    if mode == "chain":
        return None
    topk = head_accuracy.get("topk")
    if not topk:
        print("[export] no measured top-k accuracy (metrics.json missing?): using a chain")
        return None
    # The tree builder lives with the decoding code (draft_trees.py, the artifact's own module).
    import_medusa()  # puts the repository root on sys.path
    from draft_trees import build_tree_from_accuracy

    tree = build_tree_from_accuracy([list(map(float, row)) for row in topk[:num_heads]], num_nodes)
    if all(set(path) == {0} for path in tree) and len(tree) <= num_heads:
        return None  # the builder chose a chain
    return tree


def draft_candidates(held_out: list[dict], eval_replay: dict) -> list[dict]:
    """The trees pipeline.train replayed: held-out tokens per round (what draft="auto" weighs), and the
    same tree's tokens per round on each extra evaluation set (e.g. real speech), for the model card."""
    rows = []
    for c in held_out:
        row = {k: c[k] for k in ("paths", "nodes", "tokens_per_round")}
        extra = {name: next(r["tokens_per_round"] for r in replayed if r["paths"] == c["paths"])
                 for name, replayed in eval_replay.items()}
        rows.append({**row, **({"eval_tokens_per_round": extra} if extra else {})})
    return rows


def install_folder(staged: str, out: str) -> None:
    """Move the finished staging folder to ``out`` (replacing a previous export atomically).

    If ``out`` holds anything an export does not write (e.g. it is a git checkout), the new files
    are moved in one by one and everything else is left alone.
    """
    if not os.path.exists(out):
        os.replace(staged, out)
        return
    new, old = set(os.listdir(staged)), set(os.listdir(out))
    if old <= new:
        trash = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(out)), prefix=".export-old-")
        os.replace(out, os.path.join(trash, "old"))
        os.replace(staged, out)
        shutil.rmtree(trash, ignore_errors=True)
        return
    print(f"[export] {out} holds other files too: updating the exported files in place")
    for name in sorted(new):
        target = os.path.join(out, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        os.replace(os.path.join(staged, name), target)
    shutil.rmtree(staged, ignore_errors=True)


def check_target(out: str, force: bool) -> None:
    """Refuse, unless forced, to write into a non-empty ``out`` that is not a previous export, or one that git
    tracks (a shipped artifact such as heads/whisper-tiny.en: re-exporting there would replace it)."""
    if force or not os.path.exists(out) or (os.path.isdir(out) and not os.listdir(out)):
        return
    if not _is_previous_export(out):
        raise SystemExit(f"{out} is not empty and is not a previous export (no Medusa config.json with "
                         "medusa_heads.safetensors); choose another --out, or pass --force to write the exported "
                         "files into it")
    committed = _committed_files(out)
    if committed:
        raise SystemExit(f"{out} is an artifact committed to git ({len(committed)} tracked files, e.g. "
                         f"{committed[0]}); export elsewhere (pipeline/train_heads.sh: work_data/artifacts/NAME), "
                         "or pass --force to overwrite it")


def _is_previous_export(out: str) -> bool:
    try:
        config = _read_json(os.path.join(out, "config.json"))
    except (OSError, ValueError):
        return False
    return config.get("model_type") == "medusa_asr" and os.path.isfile(os.path.join(out, "medusa_heads.safetensors"))


def _committed_files(out: str) -> list[str]:
    """Files under ``out`` that git tracks (none without git or outside a repository)."""
    try:
        listed = subprocess.run(["git", "-C", out, "ls-files"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return listed.stdout.split() if listed.returncode == 0 else []


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="base model used for training (Hub id or folder)")
    cli_args.add_trust_base_code(p)
    p.add_argument("--base-id", default=None,
                   help="name to record as the artifact's base model (e.g. the Hub id when --base is a "
                        "local copy); default --base")
    p.add_argument("--heads", required=True, help="trained heads, e.g. work_data/ckpt/best.safetensors")
    p.add_argument("--metrics", default=None, help="training metrics.json (default: next to --heads)")
    p.add_argument("--out", required=True, help="artifact folder to create or replace")
    p.add_argument("--tree", choices=("auto", "chain"), default="auto",
                   help="auto: sparse tree from measured top-k accuracy; chain: top-1 of every head")
    p.add_argument("--tree-nodes", type=cli_args.positive_int, default=16,
                   help="draft nodes of the artifact's default tree (root excluded); draft='auto' weighs "
                        "every tree pipeline.train measured")
    p.add_argument("--benchmark", action="append", default=[],
                   help="tools.benchmark results.json to show in the model card (results.json); repeatable")
    p.add_argument("--data-info", action="append", default=[],
                   help="extra provenance: a collect folder, a manifest.jsonl, or a JSON dict of "
                        "training_data fields (e.g. {\"licence\": ..., \"description\": ...}); repeatable. "
                        "The collect folder recorded in metrics.json is read automatically.")
    p.add_argument("--license", default=None, help="licence id for the model card front matter (default: other)")
    p.add_argument("--repo-id", default=None, help="Hub repo id for the usage snippet")
    p.add_argument("--force", action="store_true",
                   help="replace the exported files in --out even when it is not a previous export or is committed "
                        "to git (e.g. a shipped heads/ folder)")
    add_device_options(p, device="cpu", dtype="float32", dtype_help="model (the heads are saved in it)")
    return p


def main(argv=None, model=None) -> str:
    """Export; returns the artifact folder. ``model`` (fresh MedusaForASR-like) may be injected."""
    args = build_parser().parse_args(argv)
    check_target(args.out, args.force)
    import torch
    from safetensors.torch import load_file

    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = parse_device(args.device)
    state = load_file(args.heads)
    from pipeline.prefix_attention import PREFIX

    if any(name.startswith(PREFIX) for name in state):
        raise SystemExit(f"{args.heads} was trained with --prefix-attention, which only training's replay runs: "
                         "the decoder has no prefix attention yet")
    shape = heads_kind(args.heads, state)
    num_heads, num_layers = shape["medusa_num_heads"], shape["medusa_num_layers"]
    metrics_path = args.metrics or os.path.join(os.path.dirname(os.path.abspath(args.heads)), "metrics.json")
    metrics = _read_json(metrics_path) if os.path.exists(metrics_path) else {}
    if not metrics:
        print(f"[export] WARNING: no {metrics_path}: head accuracy and training provenance are not recorded")
    elif not metrics.get("finished", True):
        print("[export] WARNING: training did not finish (metrics.json says finished=false)")

    infos = []
    data_dirs = (metrics.get("data") or {}).get("dir") or []
    for data_dir in [data_dirs] if isinstance(data_dirs, str) else data_dirs:  # several: a list
        if os.path.exists(os.path.join(data_dir, "collect_info.json")):
            infos.append(_load_data_info(data_dir))
    infos += [_load_data_info(spec) for spec in args.data_info]
    training_data = build_training_data(metrics, infos)
    head_accuracy = build_head_accuracy(metrics)
    rows = [result_row(path) for path in args.benchmark]
    candidates = metrics.get("draft_candidates") or []
    tree = choose_tree(args.tree, head_accuracy, args.tree_nodes, num_heads)

    dtype = parse_dtype(args.dtype, args.device)
    if model is None:
        model = load_from_base(args, medusa_num_heads=num_heads, medusa_num_layers=num_layers,
                               head_kind=shape["head_kind"], speech_attention=shape["speech_attention"],
                               torch_dtype=dtype, device_map=args.device)
    from pipeline.train import load_heads_state

    load_heads_state(model, {k: v for k, v in state.items()})
    cfg = model.config
    if (cfg.medusa_num_heads, cfg.medusa_num_layers, cfg.head_kind) != (num_heads, num_layers, shape["head_kind"]):
        raise SystemExit(f"model built with {cfg.medusa_num_heads}x{cfg.medusa_num_layers} heads, "
                         f"file has {num_heads}x{num_layers}")
    trained_base = metrics.get("base")
    if trained_base and trained_base != args.base:
        print(f"[export] note: heads were trained with --base {trained_base!r}, exporting for {args.base!r}")
    if args.base_id:
        cfg.base_model_name_or_path = args.base_id
    elif os.path.isabs(args.base):
        print(f"[export] WARNING: the artifact will name a local base path {args.base!r}; "
              "pass --base-id HUB_ID to publish it")
    cfg.tree = tree
    cfg.draft_candidates = draft_candidates(candidates, metrics.get("eval_replay") or {})
    cfg.training_data = training_data
    cfg.head_accuracy = head_accuracy

    out = os.path.abspath(args.out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    staged = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out)}.export-")
    try:
        model.save_pretrained(staged)
        written = os.path.join(staged, "medusa_heads.safetensors")
        if os.path.exists(written):  # what was written is what was trained
            saved = load_file(written)
            for k, v in state.items():
                if k not in saved or not torch.allclose(saved[k].float(), v.float(), rtol=1e-2, atol=1e-2):
                    raise RuntimeError(f"saved heads differ from {args.heads} at {k}")
        else:
            print("[export] WARNING: save_pretrained wrote no medusa_heads.safetensors")
        plot = None
        if rows:
            write_results(staged, rows, command_line("pipeline.export", argv))
            plot = draw_speedup(rows, os.path.join(staged, PLOT_FILE))
        write_atomic(os.path.join(staged, "README.md"), render_model_card(
            cfg, rows, plot, repo_id=args.repo_id, license=args.license))
        apply_umask(staged)
        install_folder(staged, out)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    acc = head_accuracy.get("top1")
    print(f"[export] {out}: {num_heads} heads x {num_layers} layers, "
          f"{'chain' if tree is None else f'tree of {len(tree)} nodes'}"
          + (", top-1 " + " / ".join(f"{a:.3f}" for a in acc) if acc else ""))
    return out


if __name__ == "__main__":
    sys.exit(run_cli(main))
