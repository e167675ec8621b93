"""Export residual-block heads to vLLM's Medusa draft-model format.

    python -m pipeline.export_vllm --heads heads/whisper-base-vllm --out work_data/vllm/whisper-base-medusa
    python -m vllm.entrypoints.openai.api_server --model openai/whisper-base \\
        --speculative-config '{"method": "medusa", "model": "work_data/vllm/whisper-base-medusa",
                               "num_speculative_tokens": 4}'

``--heads`` is an artifact written by ``pipeline.export`` whose heads are of the residual-block kind
(``head_kind: "medusa"``: the ``medusa`` recipe of ``pipeline/train_heads.sh``). vLLM's Medusa model builds K
heads of ``num_hidden_layers`` blocks ``x + SiLU(W x + b)`` on the target's last hidden state and projects each
through its own ``lm_heads.{i}`` or, with ``original_lm_head``, one shared head; it drafts the chain of each
head's top-1 token. The export writes that one shared head: the base's output projection over the whole
vocabulary, so vLLM's drafts may use tokens outside heads' draft vocabulary; with ``--token-map`` its draft rows
only (``token_map`` holds their token ids and ``truncated_vocab_size`` their number, and vLLM scores only those
rows: our drafts exactly), which vLLM 0.32's loader rejects (it registers token_map as a parameter it never
marks loaded). Path heads (each depth reads the token
drafted before it, and the speech) have no counterpart there: they are refused.

The folder: ``config.json`` (``model_type: "medusa"``), ``model.safetensors``, ``export_info.json`` (where the
heads came from) and a short README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

from pipeline.collect import import_medusa, run_cli
from pipeline.export import install_folder
from tools.files import apply_umask, write_atomic

WEIGHTS_FILE = "model.safetensors"
INFO_FILE = "export_info.json"
EXPORTABLE_RECIPE = "HEADS=medusa pipeline/train_heads.sh BASE (pipeline.train without --head-kind path)"


def read_artifact_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise SystemExit(f"{path}: cannot read a heads artifact's config ({err}); pass a folder written by "
                         "pipeline.export") from None


def check_exportable(folder: str, config: dict) -> None:
    """vLLM loads residual-block heads only."""
    kind = config.get("head_kind", "medusa")
    if config.get("model_type") != "medusa_asr":
        raise SystemExit(f"{folder} is not a heads artifact (model_type {config.get('model_type')!r}); pass a "
                         "folder written by pipeline.export")
    if kind != "medusa":
        raise SystemExit(f"{folder} holds {kind} heads, which vLLM cannot load (it takes residual-block Medusa "
                         f"heads only); train exportable heads with {EXPORTABLE_RECIPE}")


def load_heads(folder: str, base: str | None):
    """The artifact on its base (float32, CPU): the heads and the base's output projection they share."""
    return import_medusa().MedusaForASR.from_pretrained(folder, base_model_name_or_path=base).float()


def vllm_tensors(model, dtype: str = "float32", token_map: bool = False) -> dict:
    """``blocks.{i}.layers.{j}.weight|bias`` and the one shared ``lm_heads.0.weight``: the base's output projection,
    or with ``token_map`` (heads with a draft vocabulary) its draft rows and ``token_map``; floating-point tensors
    in ``dtype``."""
    import torch

    projection = model.backbone.output_projection
    if getattr(projection, "bias", None) is not None:
        raise SystemExit("the base's output projection has a bias, which vLLM's Medusa heads cannot hold; "
                         "this base cannot be served with exported heads")
    tensors = {name: t.detach().float().contiguous() for name, t in model.medusa_heads.state_dict().items()}
    restrict = token_map and model.draft_vocab is not None
    rows = model.draft_projection().weight() if restrict else projection.weight
    tensors["lm_heads.0.weight"] = rows.detach().float().contiguous()
    if restrict:
        tensors["token_map"] = model.draft_vocab.detach().to("cpu").long().contiguous()
    cast = getattr(torch, dtype)
    return {name: (t.to(cast) if t.is_floating_point() else t).to("cpu") for name, t in tensors.items()}


def vllm_config(model, tensors: dict) -> dict:
    """vLLM's MedusaConfig. Its loader renames every key holding "num" and "heads" (or "layers") to
    num_heads (num_hidden_layers): nothing else here may hold those words."""
    cfg = model.config
    return {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": int(cfg.hidden_size),
        "vocab_size": int(cfg.vocab_size),
        "num_heads": int(cfg.medusa_num_heads),
        "num_hidden_layers": int(cfg.medusa_num_layers),
        "truncated_vocab_size": int(tensors["lm_heads.0.weight"].shape[0]),
        "medusa_fc_bias": True,
        "original_lm_head": True,
    }


def export_info(folder: str, config: dict, model) -> dict:
    source = read_artifact_config(folder)
    keep = ("base_model_name_or_path", "base_family", "head_accuracy", "training_data", "draft_vocab_size")
    return {"exported_from": os.path.abspath(folder), "base": model.config.base_model_name_or_path,
            "drafts": "a chain of each head's top-1 token (vLLM's Medusa proposer)",
            **{k: source[k] for k in keep if k in source}, "vllm_config": config}


def model_card(config: dict, info: dict) -> str:
    base = info["base"]
    spec = json.dumps({"method": "medusa", "model": "THIS_FOLDER", "num_speculative_tokens": config["num_heads"]})
    return (
        f"# Medusa heads for {base}, in vLLM's format\n\n"
        f"{config['num_heads']} residual-block heads ({config['num_hidden_layers']} block each) exported by "
        "`python -m pipeline.export_vllm` from a medusa-asr artifact. vLLM drafts a chain of each head's top-1 "
        "token and verifies it with the base: the output is the base's own greedy output.\n\n"
        f"```bash\npython -m vllm.entrypoints.openai.api_server --model {base} \\\n"
        f"    --speculative-config '{spec}'\n```\n"
    )


def check_target(out: str, force: bool) -> None:
    if force or not os.path.exists(out) or (os.path.isdir(out) and not os.listdir(out)):
        return
    if not os.path.isfile(os.path.join(out, INFO_FILE)):
        raise SystemExit(f"{out} is not empty and is not a previous vLLM export (no {INFO_FILE}); choose another "
                         "--out, or pass --force")


def write_folder(out: str, config: dict, tensors: dict, info: dict) -> None:
    from safetensors.torch import save_file

    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    staged = tempfile.mkdtemp(dir=parent, prefix=".export-vllm-")
    try:
        save_file(tensors, os.path.join(staged, WEIGHTS_FILE), metadata={"format": "pt"})
        write_atomic(os.path.join(staged, "config.json"), json.dumps(config, indent=2) + "\n")
        write_atomic(os.path.join(staged, INFO_FILE), json.dumps(info, indent=2) + "\n")
        write_atomic(os.path.join(staged, "README.md"), model_card(config, info))
        apply_umask(staged)
        install_folder(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def export(folder: str, out: str, base: str | None = None, force: bool = False, dtype: str = "float32",
           token_map: bool = False) -> dict:
    """Write ``folder``'s heads in vLLM's Medusa format into ``out``; returns the vLLM config."""
    check_exportable(folder, read_artifact_config(folder))
    check_target(out, force)
    model = load_heads(folder, base)
    tensors = vllm_tensors(model, dtype, token_map)
    config = vllm_config(model, tensors)
    write_folder(out, config, tensors, export_info(folder, config, model))
    return config


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--heads", required=True, help="artifact folder with residual-block heads (pipeline.export)")
    p.add_argument("--out", required=True, help="folder for vLLM's Medusa checkpoint")
    p.add_argument("--base", help="load the base from here instead of the artifact's base_model_name_or_path")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="weights' dtype in the file (vLLM casts them to the target's); bfloat16 halves a large "
                        "vocabulary's shared head (MERaLiON-2: 256k x 2304)")
    p.add_argument("--token-map", action="store_true",
                   help="write the heads' draft vocabulary as token_map (vLLM 0.32 cannot load it: 'Following weights "
                        "were not initialized from checkpoint: {token_map}'); default: the full output projection")
    args = p.parse_args(argv)
    config = export(args.heads, args.out, args.base, args.force, args.dtype, args.token_map)
    print(f"[export_vllm] {args.out}: {config['num_heads']} heads x {config['num_hidden_layers']} block(s), "
          f"draft vocabulary {config['truncated_vocab_size']} of {config['vocab_size']}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
