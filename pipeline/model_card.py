"""The model card (README.md) of an artifact, rendered from one template (``model_card.md``).

``render_model_card(config, rows, plot)`` reads the artifact's ``MedusaConfig`` fields (base, family, head shape,
training data, head accuracy) and the benchmark rows of its ``results.json`` (``tools.benchmark_report.summary_row``
rows, each with the command that measured it), so the card never says more than the artifact and its committed
results record. An artifact without trained heads (``trained=False``: the repository root, for MERaLiON-2) gets
the card that says so and shows the shipped artifacts' rows instead.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from huggingface_hub import ModelCardData

from tools.benchmark_report import device_label, gap_cell
from tools.heads_summary import base_name, heads_folder, latest_rows
from tools.markdown import markdown_table, number_cell

CARD_TAGS = ["medusa", "speculative-decoding", "automatic-speech-recognition", "asr"]
TEMPLATE = Path(__file__).with_name("model_card.md")
PIP_PACKAGES = '"transformers>=5" torch soundfile soxr safetensors'
MERALION_LICENCE = {"license": "other", "license_name": "meralion-public-license",
                    "license_link": "https://huggingface.co/MERaLiON/MERaLiON-2-3B"}

CITATIONS = {
    "medusa": """@article{cai2024medusa,
  title   = {Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads},
  author  = {Cai, Tianle and Li, Yuhong and Geng, Zhengyang and Peng, Hongwu and Lee, Jason D. and Chen, Deming
             and Dao, Tri},
  journal = {arXiv preprint arXiv:2401.10774},
  year    = {2024}
}""",
    "path": """@article{ankner2024hydra,
  title   = {Hydra: Sequentially-Dependent Draft Heads for Medusa Decoding},
  author  = {Ankner, Zachary and Parthasarathy, Rishab and Nrusimha, Aniruddha and Rinard, Christopher
             and Ragan-Kelley, Jonathan and Brandon, William},
  journal = {arXiv preprint arXiv:2402.05109},
  year    = {2024}
}""",
    "whisper": """@article{radford2022whisper,
  title   = {Robust Speech Recognition via Large-Scale Weak Supervision},
  author  = {Radford, Alec and Kim, Jong Wook and Xu, Tao and Brockman, Greg and McLeavey, Christine
             and Sutskever, Ilya},
  journal = {arXiv preprint arXiv:2212.04356},
  year    = {2022}
}""",
    "meralion2": """@article{meralion2024,
  title   = {MERaLiON-AudioLLM: Bridging Audio and Language with Large Language Models},
  author  = {{MERaLiON Team}},
  journal = {arXiv preprint arXiv:2412.09818},
  year    = {2024}
}""",
}

TERMS = ("A *draft* is the heads' guess of the next few tokens. A *verify pass* runs the base decoder once over the "
         "last token and the draft. A *round* is a draft and its verify pass: it keeps the longest draft prefix "
         "equal to the base's own choices, plus one token of the base.")
TREE_TERMS = ("A *tree* drafts several candidates per position, verified together under a tree-shaped mask; a "
              "*chain* has one per position.")
PATH_TERMS = ("*Path heads* (Hydra-style) each see the token drafted before them, so every branch of the tree "
              "gets its own continuation.")
RESULTS_INTRO = ("28 real recordings with references, batch 1 unless the device says otherwise. "
                 "*Tokens per pass*: tokens a round emits, on average. *× `generate`*: the whole call against the "
                 "base's greedy `generate`. *× own greedy*: against our loop decoding one token per pass, same "
                 "cache and kernels (*rounds*: the decoding loop only). "
                 "*Exact*: recordings whose ids equal the base's greedy ids.")
LOSSLESS = ("Every emitted token is the base model's own greedy choice. A round keeps a drafted token only where "
            "it equals the base's own top-scoring token in the verify pass, then adds the base's next token. "
            "The verify pass runs the base's own weights over a key-value cache written by position, so a rejected "
            "draft leaves nothing behind. "
            "Tests compare the ids with the base's float32 greedy `generate` on random and real "
            "inputs. "
            "In bfloat16 the ids can part at a *near-tie*: a step where the base's two best scores lie within "
            "bfloat16's rounding. The exact column counts those recordings, each checked to be such a tie.")
LIMITATIONS = [
    "Greedy decoding only: no beam search and no sampling inside the rounds.",
    "The speed-up depends on the device, the dtype and the speech; short clips have few rounds to save.",
    "The heads learned from synthetic speech; accented or noisy speech may accept fewer drafts, never "
    "changing the transcript.",
    "The base model's own limitations apply unchanged: its errors, languages and biases.",
]


def _is_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def _base_link(base: str) -> str:
    return f"[{base}](https://huggingface.co/{base})" if _is_hub_id(base) else f"`{base}`"


def licence_fields(base: str) -> dict:
    """The card's licence metadata: the base's licence, which the heads (distilled from it) and code share."""
    if base.startswith("openai/whisper"):
        return {"license": "mit"}
    if base.startswith("MERaLiON/"):
        return dict(MERALION_LICENCE)
    return {"license": "other"}


def _front_matter(base: str, family: str, data: dict, licence: dict) -> str:
    """The card's YAML metadata block, as the Hub reads it."""
    card_data = ModelCardData(
        base_model=base if _is_hub_id(base) else None,  # the Hub rejects local paths here
        library_name="transformers",
        pipeline_tag="automatic-speech-recognition",
        tags=CARD_TAGS + ([family] if family else []),
        language=data.get("languages") or None,
        datasets=[data["hf_dataset"]] if data.get("hf_dataset") else None,
        **licence,
    )
    return f"---\n{card_data.to_yaml()}\n---"


def row_name(row: dict) -> str:
    """What a row measured: its artifact's folder name (two artifacts may share a base)."""
    return Path(row.get("heads") or row["model"]).name


def _device(row: dict) -> str:
    return device_label(row) + (f", batch {row['batch']}" if (row.get("batch") or 1) > 1 else "")


def results_table(rows: list[dict]) -> str:
    """One line per benchmark row: model, device, dtype, draft, tokens per pass, speed-ups, exact match, date; and
    where some row measured fixed drafts beside ``auto``, how much slower it ran than the fastest of them."""
    gap = any(r.get("auto_gap_vs_best_fixed") is not None for r in rows)
    header = ["model", "device", "dtype", "draft", "tokens per pass", "× `generate`", "× own greedy",
              "× own greedy (rounds)", *(["vs best fixed draft"] if gap else []), "exact", "date"]
    return markdown_table(header, [
        [row_name(r), _device(r), r["dtype"], _draft(r), number_cell(r.get("mean_accepted_per_round")),
         number_cell(r.get("speedup_vs_hf_generate"), 2, "×"), number_cell(r.get("e2e_speedup_vs_own_greedy"), 2, "×"),
         number_cell(r.get("decode_speedup_vs_own_greedy"), 2, "×"), *([gap_cell(r)] if gap else []),
         _exact(r), r["date"]] for r in rows])


def _draft(row: dict) -> str:
    return row["draft"] + (", timestamps" if row.get("timestamps") else "")


def _exact(row: dict) -> str:
    """Recordings with the base's greedy ids, and how many of the others part at a base near-tie."""
    cell = f"{round(row['exact_match_rate'] * row['clips'])}/{row['clips']}"
    ties = str(row.get("divergent_rows_at_base_near_ties") or "0/0").split("/")[0]
    return cell + (f" ({ties} near-tie{'s' if ties != '1' else ''})" if ties not in ("0", "") else "")


def snippet(model_path: str, gpu: bool = False) -> str:
    """Transcribe ``speech.wav`` with the artifact at ``model_path``: audio read, resampled, decoded, printed."""
    load = (f'model = AutoModel.from_pretrained("{model_path}", trust_remote_code=True,\n'
            '                                  dtype=torch.bfloat16, device_map="cuda")' if gpu else
            f'model = AutoModel.from_pretrained("{model_path}", trust_remote_code=True)')
    return "\n".join([
        "import soundfile as sf",
        "import soxr",
        *(["import torch"] if gpu else []),
        "from transformers import AutoModel",
        "",
        load,
        'audio, rate = sf.read("speech.wav", dtype="float32", always_2d=True)',
        "audio = soxr.resample(audio.mean(axis=1), rate, 16_000)  # mono, 16 kHz",
        "inputs = model.prepare_audio_inputs([audio])",
        "ids = model.generate(**inputs, max_new_tokens=model.default_max_new_tokens)",
        "print(model.decode_text(ids, inputs)[0])",
    ])


def _heads_sentence(cfg: dict) -> str:
    k, kind = cfg.get("medusa_num_heads", 0), cfg.get("head_kind", "medusa")
    what = "path heads" if kind == "path" else "Medusa heads (each one independent of the others)"
    speech = " that also attend to the speech" if cfg.get("speech_attention") else ""
    draft = f"a tree of {len(cfg['tree'])} nodes" if cfg.get("tree") else f"a chain of {k}"
    return (f"It holds {k} {what}{speech}; by default each round drafts {draft}, and `draft=\"auto\"` picks the "
            "draft that runs fastest on your device.")


def _training_sentence(cfg: dict) -> str:
    data, acc = cfg.get("training_data") or {}, cfg.get("head_accuracy") or {}
    text = ("The heads are self-distilled: the frozen base transcribed the training audio, and each head learned "
            "to predict the base's own later tokens.")
    if data.get("n_utterances"):
        hours = f" ({float(data['hours']):.1f} h)" if data.get("hours") else ""
        text += f" Training used {data['n_utterances']:,} synthetic utterances{hours}; no reference transcripts."
    if acc.get("top1"):
        top1 = " / ".join(f"{100 * a:.0f}" for a in acc["top1"])
        text += f" Held-out top-1 accuracy per head: {top1} %."
    return text


def render_model_card(config, rows: list[dict] | None = None, plot: str | None = None, repo_id: str | None = None,
                      license: str | None = None, trained: bool = True, recipe_cost: dict | None = None,
                      compared: str = "") -> str:
    """README.md text for an artifact; ``config`` is a MedusaConfig or its dict, ``rows`` its benchmark rows
    (for an artifact without trained heads, ``trained=False``: the shipped artifacts' rows), ``plot`` the file
    name of its speed-up plot, ``recipe_cost`` what training its heads cost where measured (``tools.recipe_cost``),
    ``compared`` its base's heads side by side (``compared_heads``)."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    base, family = cfg.get("base_model_name_or_path", ""), cfg.get("base_family", "")
    licence = {"license": license} if license else licence_fields(base)
    untrained = not trained
    rows = rows or []
    shipped = sorted({r["heads"] for r in rows if r.get("heads")})
    example = next((h for h in shipped if "tiny" in h), shipped[0] if shipped else "heads/whisper-tiny.en")
    model_path = example if untrained else (repo_id or ".")
    terms = " ".join([TERMS, TREE_TERMS] + ([PATH_TERMS] if cfg.get("head_kind") == "path" else []))
    if untrained:
        title = f"Medusa decoding for {base}: the code, heads not yet trained"
        intro = (f"This folder is the Hugging Face remote-code artifact of Medusa decoding for {_base_link(base)}: "
                 "its config and code, without the trained *heads*, the small networks that guess the next tokens. "
                 "You train its heads with one command (below); until then, loading it fails with a message "
                 "saying how. "
                 "The Whisper artifacts in `heads/` hold real trained heads and "
                 "work today; the snippet uses one of them.\n\n" + terms)
        where = "Run it in a clone of this repository, with any WAV file named `speech.wav`."
    else:
        title = f"Medusa heads for {base}"
        intro = (f"Medusa heads for {_base_link(base)}: small networks that make its greedy transcription faster "
                 "without changing one output token. "
                 "The heads guess the next few tokens, and the base model checks all the guesses in one decoder "
                 "pass. "
                 "The transcript is the base model's own greedy transcript, produced in fewer decoder passes.\n\n"
                 + terms + "\n\n" + _heads_sentence(cfg) + " " + _training_sentence(cfg)
                 + (f"\n\n**{cfg['card_note']}**" if cfg.get("card_note") else ""))
        where = ("Run it inside this folder as downloaded, with any WAV file named `speech.wav`. "
                 "The base weights come from the Hub, or offline from a copy converted by "
                 f"`python -m tools.real_whisper {base}`." if family == "whisper" else
                 "Run it inside this folder as downloaded, with any WAV file named `speech.wav`.")
    command = (f"From the command line: `python {example}/example_inference.py speech.wav` prints the same "
               "transcript. The root's own `example_inference.py` runs once MERaLiON-2's heads are trained."
               if untrained else "From the command line: `python example_inference.py speech.wav` prints the "
               "same transcript.")
    plot_md = f"![Speed-up by device]({plot})" if plot else ""
    source = ("Each row's command is in its artifact's `results.json`; `docs/RESULTS.md` holds every run."
              if rows else "No benchmark rows are recorded yet.")
    if untrained and rows:
        source += (" The rows are each base's own heads; the others in `heads/` (timestamps, more languages, vLLM) "
                   "have theirs in their cards.")
    citations = [CITATIONS["medusa"]] + ([CITATIONS["path"]] if cfg.get("head_kind") == "path" else [])
    citations += [CITATIONS["whisper"]] if family == "whisper" or untrained else []
    citations += [CITATIONS["meralion2"]] if family == "meralion2" else []
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        front_matter=_front_matter(base, family, cfg.get("training_data") or {}, licence), title=title, intro=intro,
        where_to_run=where, snippet=snippet(model_path), gpu_snippet=snippet(model_path, gpu=True),
        command_line=command, results_intro=RESULTS_INTRO if rows else "", results_table=results_table(rows) if rows
        else "", plot=plot_md + ("\n\n" if plot_md else "") + source, lossless=LOSSLESS,
        limitations="\n".join(f"- {line}" for line in LIMITATIONS), extra=_extra(cfg, untrained, recipe_cost) + compared,
        licence=_licence_text(base, licence, untrained), citation="\n\n".join(citations))


def compared_heads(rows: list[dict], base: str, own: str) -> str:
    """A section comparing every heads trained for ``base`` (``tools.heads_summary`` rows, CPU): tokens per verify
    pass on English, on timestamped English and on the other languages (their range), and the GPU minutes their
    training took; "" when only ``own`` was measured."""
    rows = [r for r in latest_rows(rows) if not r.get("gpu") and base_name(r) == Path(base).name]
    heads = list(dict.fromkeys(heads_folder(r) for r in rows))
    if len(heads) < 2:
        return ""

    def passes(head, keep) -> str:
        found = sorted(r["tokens_per_pass"] for r in rows if heads_folder(r) == head and keep(r))
        return "" if not found else "–".join(dict.fromkeys(f"{v:.2f}" for v in (found[0], found[-1])))

    def minutes(head) -> str:
        return number_cell(next((r["training_gpu_minutes"] for r in rows if heads_folder(r) == head), None), 1)

    header = ["heads", "English", "timestamped", "other languages", "GPU minutes (where recorded)"]
    body = [[f"`{Path(h).name}`" + (" (these)" if h == own else ""),
             passes(h, lambda r: r["language"] == "en" and not r["timestamps"]),
             passes(h, lambda r: r["language"] == "en" and r["timestamps"]),
             passes(h, lambda r: r["language"] != "en"), minutes(h)] for h in heads]
    shown = [0] + [k for k in range(1, len(header)) if any(line[k] for line in body)]
    english = max((r["clips"] for r in rows if r["language"] == "en"), default=0)
    speech = ([f"English on {english} real recordings"] if english else []) + (
        ["other languages on synthetic speech"] if 3 in shown else [])
    drafts = ", ".join(sorted({r["draft"] for r in rows}))
    return (f"\n## Heads compared\n\nTokens per verify pass ({drafts}, CPU) of the heads trained for this base: "
            f"{', '.join(speech)}; `docs/DEVELOPING.md` gives each recipe.\n\n"
            + markdown_table([header[k] for k in shown], [[line[k] for k in shown] for line in body]) + "\n")


def _licence_text(base: str, licence: dict, untrained: bool) -> str:
    if licence.get("license") == "mit":
        return (f"MIT. The base weights ({base}) are MIT-licensed by OpenAI; the heads, distilled from the base's "
                "own outputs, and the code are MIT too.")
    if licence.get("license_name") == "meralion-public-license":
        return (f"The code is MIT. The base weights ({base}) are under the MERaLiON Public Licence; heads you "
                "train from them follow that licence. "
                "The Whisper artifacts in `heads/` are MIT, as OpenAI's Whisper weights are.")
    return f"The code is MIT; the base ({base}) and heads trained from it are under the base's own licence."


def vllm_section(base: str, k: int) -> str:
    """Residual-block heads are what vLLM's Medusa loads: how to serve them there."""
    spec = f'{{"method": "medusa", "model": "<vllm folder>", "num_speculative_tokens": {k}}}'
    return ("\n## Serving with vLLM\n\n"
            "vLLM loads heads of this kind. Export them to its Medusa format, then serve the base with them:\n\n"
            "```bash\npython -m pipeline.export_vllm --heads <this folder> --out <vllm folder>\n"
            f"python -m vllm.entrypoints.openai.api_server --model {base} \\\n    --speculative-config '{spec}'\n```\n\n"
            "vLLM drafts a chain of top-1 tokens (each head's most likely token; no trees). Its output is the "
            "base's greedy output.\n")


def recipe_cost_sentence(cost: dict | None) -> str:
    """What one hour of audio cost the recipe, from a ``tools.recipe_cost`` run (" ..."); "" without one."""
    if not cost:
        return ""
    steps = {s["step"]: s for s in cost["steps"]}
    per_hour = " and ".join(f"{name} {s['seconds_per_audio_hour'] / 60:.1f} min" for name, s in steps.items()
                            if s["seconds_per_audio_hour"] is not None)
    peak = max(s["gpu_memory_peak_gib"] or 0 for s in cost["steps"])
    collected = sum(s["disk_gib_per_audio_hour"] or 0 for s in cost["steps"])
    kept = (steps["train"]["disk_mib"] + steps["export"]["disk_mib"]) / 1024
    tokens, epochs = cost["env"].get("MAX_NEW_TOKENS"), cost["env"].get("EPOCHS")
    settings = ([f"{tokens} tokens a clip"] if tokens else []) + ([f"{epochs} epochs"] if epochs else [])
    run = device_label(cost) + (f" ({', '.join(settings)})" if settings else "")
    return (f" On an {run} an hour of audio took {per_hour}, export {steps['export']['seconds'] / 60:.1f} min. "
            f"It peaked at {peak:.0f} GiB of GPU memory, writing {collected:.1f} GiB an hour plus {kept:.1f} GiB of "
            "checkpoints.")


def _extra(cfg: dict, untrained: bool, recipe_cost: dict | None = None) -> str:
    """Extra sections: serving residual-block heads with vLLM; the root card's commands, training the heads (with
    what it cost where measured), and running past one process."""
    if not untrained:
        if cfg.get("head_kind", "medusa") == "medusa":
            return vllm_section(cfg.get("base_model_name_or_path", ""), cfg.get("medusa_num_heads", 0))
        return ""
    base = cfg.get("base_model_name_or_path", "")
    return f"""
## Train the heads

Train MERaLiON-2's heads on your own recordings (a folder, a `manifest.jsonl` or an HF dataset; no transcripts) with
one command, on transformers 4.51 (`requirements-meralion2.txt`) and a GPU; `TRUST_BASE_CODE=1` lets MERaLiON-2's
own code run:

```bash
AUDIO=recordings/ HEADS=path DEVICE=cuda TRUST_BASE_CODE=1 pipeline/train_heads.sh {base}
```

It collects the base's own outputs (without `AUDIO`, on synthesised speech), trains path heads and
exports the artifact to `work_data/artifacts/{base.split('/')[-1]}`. At the 3B shape with random weights, its artifact
decodes exactly as its base (`benchmarks/recipe/`).{recipe_cost_sentence(recipe_cost)}
[`docs/DEVELOPING.md`](docs/DEVELOPING.md) explains each step.

## Commands

```bash
make demo   # transcribe a generated clip, print the speed-up
make test   # the tests under transformers 5.x (Whisper) and 4.51.3 (MERaLiON-2), and the linter
```

`python -m tools.transcribe FILES --format srt --output subs/` transcribes files and folders
([`docs/USAGE.md`](docs/USAGE.md)). [`docs/RESULTS.md`](docs/RESULTS.md) also times
MERaLiON-2-3B and -10B at full size on random weights, for speed only.

## Past one process

- `python -m tools.bulk --help`: many files on Ray Data.
- `python -m tools.serve --help`: an OpenAI-compatible `/v1/audio/transcriptions` endpoint on Ray Serve.
- `python -m pipeline.export_vllm --help`: residual-block heads in vLLM's Medusa format.
"""
