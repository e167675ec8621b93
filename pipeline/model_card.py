"""Model card (README.md) for an exported Medusa artifact, generated from its config's provenance.

``render_model_card(config)`` reads only ``MedusaConfig`` fields (``base_model_name_or_path``,
``base_family``, head shape, ``tree``, ``training_data``, ``head_accuracy``, ``benchmark``), so
the card never says more than the artifact records.
"""

from __future__ import annotations

from huggingface_hub import ModelCardData

from tools.markdown import markdown_table

CARD_TAGS = ["medusa", "speculative-decoding", "automatic-speech-recognition", "asr"]


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    if isinstance(value, dict):  # sorted: the same card from a fresh export and from a saved config.json
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in sorted(value.items()))
    return str(value)


def _table(header: list[str], rows: list[list]) -> str:
    return markdown_table(header, [[_fmt(c) for c in row] for row in rows])


def _pct(x) -> str:
    return f"{100.0 * float(x):.1f} %" if isinstance(x, (int, float)) else "–"


# what an artifact's benchmark entries hold (pipeline.export), in the card's column order
BENCHMARK_FIELDS = ("draft_ran", "decode_speedup_vs_own_greedy", "e2e_speedup_vs_own_greedy", "speedup_sum_latency",
                    "round_cost_vs_plain", "mean_accepted_per_round", "baseline_tokens_per_s", "medusa_tokens_per_s",
                    "acceptance_rate", "exact_match_rate", "divergent_rows_at_base_near_ties", "baseline_wer",
                    "medusa_wer", "clips", "audio_seconds_total")
PROVENANCE_FIELDS = ("torch", "transformers", "date", "source")


def _dicts_table(rows: list[tuple[str, dict]]) -> str:
    known = BENCHMARK_FIELDS + PROVENANCE_FIELDS
    columns = [k for k in known if any(k in row for _, row in rows)]
    for _, row in rows:
        columns += [k for k in row if k not in columns]
    return _table([""] + columns, [[name] + [row.get(c, "") for c in columns] for name, row in rows])


def benchmark_section(bench: dict) -> str:
    """Generic rendering: scalars as a setup list, dicts of dicts / lists of dicts as tables; a dict of
    flat rows (one per benchmark run, as export records them) becomes one table."""
    if bench and all(isinstance(v, dict) and not any(isinstance(x, (dict, list)) for x in v.values())
                     for v in bench.values()):
        return _dicts_table(list(bench.items()))
    setup, tables = [], []
    for key, value in bench.items():
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            tables.append((key, _dicts_table(list(value.items()))))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            name_key = next((k for k in ("name", "method", "mode", "setting") if k in value[0]), None)
            rows = [(str(v.get(name_key, i)) if name_key else str(i),
                     {k: x for k, x in v.items() if k != name_key}) for i, v in enumerate(value)]
            tables.append((key, _dicts_table(rows)))
        elif isinstance(value, dict):
            tables.append((key, _table(["", "value"], [[k, v] for k, v in value.items()])))
        else:
            setup.append(f"- **{key}**: {_fmt(value)}")
    parts = ["\n".join(setup)] if setup else []
    for key, table in tables:
        parts.append(f"**{key}**\n\n{table}")
    return "\n\n".join(parts)


def accuracy_section(acc: dict) -> str:
    top1, top5, topk = acc.get("top1") or [], acc.get("top5") or [], acc.get("topk") or []
    n = acc.get("n_positions") or []
    rows = []
    for k in range(len(top1)):
        row = [f"{k}", f"token +{k + 1}", _pct(top1[k]), _pct(top5[k]) if k < len(top5) else "–",
               _pct(topk[k][-1]) if k < len(topk) and topk[k] else "–"]
        if n:
            row.append(n[k] if k < len(n) else "")
        rows.append(row)
    header = ["head", "predicts", "top-1", "top-5", f"top-{len(topk[0]) if topk and topk[0] else 10}"]
    if n:
        header.append("positions")
    where = ("held-out utterances (never trained on)" if acc.get("held_out", True)
             else "the training utterances (too little data for a held-out split)")
    text = (f"Next-token accuracy of each head on {where}, measured against the base model's own "
            "greedy output. \"token +n\" = the n-th token after the one the current hidden state "
            "produced; head 0 drafts the first token after the base model's own next token.\n\n"
            + _table(header, rows))
    if "val_loss" in acc:
        text += f"\n\nValidation loss (sum over heads of mean cross-entropy): {float(acc['val_loss']):.4f}"
        if "step" in acc:
            text += f" at step {acc['step']}"
        text += "."
    return text


def training_section(data: dict) -> str:
    if not data:
        return "No training provenance is recorded in config.json."
    labels = [
        ("source", "audio source"), ("kind", "source type"), ("hf_dataset", "Hugging Face dataset"),
        ("description", "description"),
        ("n_utterances", "utterances collected"), ("n_tokens", "tokens (base model's own output)"),
        ("n_train_utterances", "utterances trained on"), ("n_val_utterances", "utterances held out"),
        ("hours", "hours of audio"), ("voices", "voices / speakers"), ("languages", "languages"),
        ("sources", "corpora / engines"), ("licence", "data licence"),
    ]
    rows = [[label, data[key]] for key, label in labels if data.get(key) not in (None, "", [])]
    known = {k for k, _ in labels}
    rows += [[k, v] for k, v in data.items()
             if k not in known and k not in ("training", "collection") and not isinstance(v, dict)]
    text = ("The heads are self-distilled: the frozen base model transcribed the audio below greedily, "
            "and each head learned to predict the base model's own later tokens from its last-layer "
            "hidden state. No reference transcripts are used.\n\n" + _table(["", ""], rows))
    for key, title in (("collection", "Collection"), ("training", "Training")):
        if isinstance(data.get(key), dict) and data[key]:
            text += f"\n\n{title}: " + _fmt(data[key]) + "."
    return text


def _is_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def _base_link(base: str) -> str:
    return f"[{base}](https://huggingface.co/{base})" if _is_hub_id(base) else f"`{base}`"


def _heads_description(kind: str, speech: bool, k: int, layers: int, hidden: int, draft_vocab) -> str:
    projection = (f"the base model's own output projection restricted to the {draft_vocab} most frequent tokens "
                  "of the training transcripts" if draft_vocab else "the base model's own output projection")
    if kind == "path":
        return (f"Each head is sequentially dependent (Hydra-style): head d merges the state of the node it drafts "
                f"after with that node's token embedding ({2 * hidden}→{hidden}), "
                + ("attends to the speech through the base's own last-layer cross-attention keys and values, "
                   if speech else "")
                + f"runs {layers} residual block(s) `h + SiLU(W h)` and drafts through {projection}, shared by "
                "reference; every tree node gets its own continuation.")
    params = k * layers * (hidden * hidden + hidden)
    params_text = f"{params / 1e6:.1f} M" if params >= 1e5 else f"{params:,}"
    return (f"Each head is {layers} residual block(s) `h + SiLU(W h)` ({hidden}×{hidden}, {params_text} parameters "
            f"in all) followed by {projection}, shared by reference.")


def _train_flags(cfg: dict) -> str:
    flags = ""
    if cfg.get("head_kind", "medusa") != "medusa":
        flags += f" --head-kind {cfg['head_kind']}"
    if cfg.get("speech_attention"):
        flags += " --speech-attention"
    if cfg.get("draft_vocab_size"):
        flags += f" --draft-vocab {cfg['draft_vocab_size']}"
    soft = ((cfg.get("training_data") or {}).get("training") or {}).get("soft_labels")
    return flags + (f" --soft-labels {soft}" if soft else "")


def _draft_name(paths: list) -> str:
    if all(set(p) == {0} for p in paths):
        return f"chain of {len(paths)}"
    return f"tree of {len(paths)} nodes"


def _pipeline_usage(repo: str) -> str:
    """The Hugging Face ASR pipeline snippet (Whisper-family artifacts register a pipeline class)."""
    return ("\n\nOr through the library's ASR pipeline (audio files, chunking, batching and timestamps are the "
            "pipeline's; decoding is greedy Medusa):\n\n```python\nfrom transformers import pipeline\n\n"
            f"asr = pipeline(\"automatic-speech-recognition\", model=\"{repo}\", trust_remote_code=True)\n"
            "print(asr(\"speech.wav\", return_timestamps=True, chunk_length_s=30, batch_size=4))\n```")


def _runs_in_asr_pipeline(family: str) -> bool:
    """Whether transformers' ASR pipeline runs this family's artifacts (its backbone says so)."""
    from modeling_medusa import BACKBONES

    return family in BACKBONES and BACKBONES[family].asr_pipeline


def _front_matter(base: str, family: str, data: dict, license: str | None) -> str:
    """The card's YAML metadata block, as the Hub reads it."""
    card_data = ModelCardData(
        base_model=base if _is_hub_id(base) else None,  # the Hub rejects local paths here
        library_name="transformers",
        pipeline_tag="automatic-speech-recognition",
        license=license or "other",
        tags=CARD_TAGS + ([family] if family else []),
        language=data.get("languages") or None,
        datasets=[data["hf_dataset"]] if data.get("hf_dataset") else None,
    )
    return f"---\n{card_data.to_yaml()}\n---"


def vllm_section(base: str, k: int) -> str:
    """Residual-block heads are what vLLM's Medusa loads: how to serve them there."""
    spec = f'{{"method": "medusa", "model": "<vllm folder>", "num_speculative_tokens": {k}}}'
    return ("## Serving with vLLM\n\n"
            "vLLM loads heads of this kind. Export them to its Medusa format, then serve the base with them:\n\n"
            "```bash\npython -m pipeline.export_vllm --heads <this folder> --out <vllm folder>\n"
            f"python -m vllm.entrypoints.openai.api_server --model {base} \\\n    --speculative-config '{spec}'\n```\n\n"
            "vLLM drafts a chain of top-1 tokens (each head's most likely token; no trees), so its tokens per "
            "verify pass are this card's chain row, not its best tree's. Its output is the base's greedy output.")


def render_model_card(config, repo_id: str | None = None, license: str | None = None) -> str:
    """README.md text for an artifact; ``config`` is a MedusaConfig or its dict."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    base = cfg.get("base_model_name_or_path", "")
    family = cfg.get("base_family", "")
    k, layers = cfg.get("medusa_num_heads", 0), cfg.get("medusa_num_layers", 1)
    hidden = cfg.get("hidden_size", 0)
    data = cfg.get("training_data") or {}
    acc = cfg.get("head_accuracy") or {}
    bench = cfg.get("benchmark") or {}
    tree = cfg.get("tree")
    repo = repo_id or "path/to/this/folder"
    kind, speech = cfg.get("head_kind", "medusa"), cfg.get("speech_attention", False)
    sections = [_front_matter(base, family, data, license), f"# Medusa heads for {base}"]
    sections.append(
        f"{k} draft heads for {_base_link(base)} (family `{family}`), for "
        "**lossless** greedy speculative decoding: the heads guess the next tokens, the base model "
        "checks all guesses in one forward pass and keeps the longest prefix equal to its own greedy "
        "choice, so the transcript is exactly the base model's greedy transcript, produced in fewer "
        "decoder passes (float32: token for token; bfloat16: up to a first divergence where the base's own top two "
        "scores lie within bfloat16's rounding, counted in the benchmark's `divergent_rows_at_base_near_ties`)."
        f"\n\n{_heads_description(kind, speech, k, layers, hidden, cfg.get('draft_vocab_size'))} "
        "This repository holds only the heads (`medusa_heads.safetensors`) and the code; the base model's "
        f"weights are loaded from `{base}`" + (" under its own licence." if not license else ".")
    )
    sections.append("## Usage\n\n```python\n"
                    "import soundfile as sf\n"
                    "from transformers import AutoModel\n\n"
                    f"model = AutoModel.from_pretrained(\"{repo}\", trust_remote_code=True)  # base + heads\n"
                    "audio, sr = sf.read(\"speech.wav\", dtype=\"float32\")  # 16 kHz mono\n"
                    "inputs = model.prepare_audio_inputs([audio])\n"
                    "sequences, stats = model.generate(**inputs, max_new_tokens=model.default_max_new_tokens, "
                    "return_stats=True)\n"
                    "print(model.decode_text(sequences, inputs)[0])\n"
                    "print(stats)  # drafted / accepted tokens per round\n"
                    "```\n\nOr from the command line: `python example_inference.py speech.wav`."
                    + (_pipeline_usage(repo) if _runs_in_asr_pipeline(family) else ""))
    if tree:
        draft = (f"A sparse draft tree of {len(tree)} nodes, chosen from the measured per-head top-k "
                 "accuracy below (each path lists the per-head top-k ranks).")
    else:
        draft = f"A chain: each round drafts head 0..{k - 1}'s top-1 tokens."
    candidates = cfg.get("draft_candidates") or []
    if candidates:
        evals = sorted({name for c in candidates for name in c.get("eval_tokens_per_round", {})})
        draft += (" `draft=\"auto\"` weighs each measured tree below against its verify cost on your device. "
                  "Tokens per round = tokens emitted per verify pass, replayed exactly (as `generate` would "
                  "decode) on the held-out utterances and on each evaluation set:\n\n"
                  + _table(["draft", "nodes", "tokens per round (held out)"] + [f"tokens per round ({e})" for e in evals],
                           [[_draft_name(c["paths"]), c["nodes"], f"{c['tokens_per_round']:.3f}"]
                            + [f"{c.get('eval_tokens_per_round', {}).get(e, float('nan')):.3f}" for e in evals]
                            for c in candidates]))
    sections.append("## Draft\n\n" + draft)
    sections.append("## Head accuracy\n\n" + (accuracy_section(acc) if acc.get("top1") else
                                             "Not measured (no `head_accuracy` in config.json)."))
    if bench:
        sections.append("## Benchmark\n\n" + benchmark_section(bench))
    if kind == "medusa":
        sections.append(vllm_section(base, k))
    sections.append("## Training data\n\n" + training_section(data))
    sections.append(
        "## Reproduce\n\n```bash\n"
        f"python -m pipeline.collect --base {base} --audio <folder|manifest.jsonl|hf-dataset> --out work_data/collect"
        + (" --speech" if speech else "") + "\n"
        f"python -m pipeline.train   --base {base} --data work_data/collect --out work_data/ckpt --heads {k} --layers {layers}"
        + _train_flags(cfg) + "\n"
        f"python -m pipeline.export  --base {base} --heads work_data/ckpt/best.safetensors --out <artifact>\n"
        "```")
    sections.append(
        "## Limitations\n\n"
        "- Greedy decoding only; the output equals the base model's greedy output (up to numerical ties).\n"
        "- The speed-up depends on the hardware, the dtype and how predictable the transcripts are; "
        "the head accuracy above is measured on the training distribution.\n"
        "- The base model's own limitations and licence apply.")
    return "\n\n".join(sections) + "\n"
