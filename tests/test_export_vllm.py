"""pipeline.export_vllm: residual-block heads in vLLM's Medusa format (names, shapes, config), and vLLM's way of
drafting over the exported tensors (re-implemented below from vllm/model_executor/models/medusa.py and
vllm/v1/spec_decode/medusa.py) proposes the same top-1 chain as our heads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from conftest import requires_transformers5, transformers_below_452
from oracle import randomize_heads
from pipeline import export_vllm

HEADS, LAYERS = 3, 2


def vllm_drafts(tensors: dict, config: dict, hidden: torch.Tensor) -> torch.Tensor:
    """vLLM's Medusa proposal for hidden states [N, H] -> [N, num_heads]: each head's residual blocks, the
    (shared) lm head, logits scattered into the full vocabulary through token_map (-inf elsewhere), argmax."""
    lm_head = tensors["lm_heads.0.weight"]
    drafts = []
    for i in range(config["num_heads"]):
        x = hidden
        for j in range(config["num_hidden_layers"]):
            x = x + F.silu(F.linear(x, tensors[f"blocks.{i}.layers.{j}.weight"], tensors[f"blocks.{i}.layers.{j}.bias"]))
        logits = F.linear(x, tensors.get(f"lm_heads.{i}.weight", lm_head) if not config["original_lm_head"] else lm_head)
        if config["truncated_vocab_size"] < config["vocab_size"]:
            full = torch.full((*logits.shape[:-1], config["vocab_size"]), -torch.inf)
            full[..., tensors["token_map"]] = logits
            logits = full
        drafts.append(logits.argmax(-1))
    return torch.stack(drafts, dim=1)


def our_drafts(model, hidden: torch.Tensor, draft_vocab: bool = True) -> torch.Tensor:
    """Our heads' top-1 chain: over their draft vocabulary, or (``draft_vocab=False``) the base's whole one."""
    if not draft_vocab:
        return model.backbone.output_projection(model.medusa_heads(hidden)).argmax(-1)
    top = model.head_logits(hidden).argmax(-1)
    return top if model.draft_vocab is None else model.draft_vocab[top]


def artifact(model, folder, draft_vocab=None):
    randomize_heads(model, seed=3, std=0.3)
    model.set_draft_vocab(draft_vocab)
    model.save_pretrained(folder)
    return folder


def check_export(model, folder, out, hidden_size: int, token_map: bool = True) -> dict:
    config = export_vllm.export(str(folder), str(out), token_map=token_map)
    assert json.loads((out / "config.json").read_text()) == config
    tensors = load_file(out / export_vllm.WEIGHTS_FILE)
    vocab = model.config.vocab_size
    draft = vocab if model.draft_vocab is None or not token_map else len(model.draft_vocab)
    assert config == {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": hidden_size,
                      "vocab_size": vocab, "num_heads": HEADS, "num_hidden_layers": LAYERS,
                      "truncated_vocab_size": draft, "medusa_fc_bias": True, "original_lm_head": True}
    blocks = {f"blocks.{i}.layers.{j}.{p}" for i in range(HEADS) for j in range(LAYERS) for p in ("weight", "bias")}
    extra = {"token_map"} if model.draft_vocab is not None and token_map else set()
    assert set(tensors) == blocks | {"lm_heads.0.weight"} | extra
    assert tensors["blocks.2.layers.1.weight"].shape == (hidden_size, hidden_size)
    assert tensors["blocks.2.layers.1.bias"].shape == (hidden_size,)
    assert tensors["lm_heads.0.weight"].shape == (draft, hidden_size)
    if extra:
        assert torch.equal(tensors["token_map"], model.draft_vocab.cpu())
    hidden = torch.randn(300, hidden_size, generator=torch.Generator().manual_seed(0)) * 2
    with torch.no_grad():
        ours = our_drafts(model, hidden, draft_vocab=token_map)
    assert len(set(ours[:, 0].tolist())) > 5  # varied drafts, not one token everywhere
    assert torch.equal(vllm_drafts(tensors, config, hidden), ours)
    return config


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory):
    from modeling_medusa import MedusaForASR
    from tiny_models import build_tiny_whisper

    base = build_tiny_whisper(tmp_path_factory.mktemp("vllm") / "base", seed=4, multilingual=True)
    return MedusaForASR.from_base(str(base), medusa_num_heads=HEADS, medusa_num_layers=LAYERS)


@requires_transformers5
@pytest.mark.parametrize("draft_vocab, token_map", [(None, False), (list(range(0, 120, 3)), True),
                                                    (list(range(0, 120, 3)), False)])
def test_export_names_shapes_config_and_vllm_drafts_equal_ours(tiny_whisper, tmp_path, draft_vocab, token_map):
    """With token_map vLLM drafts exactly ours; without, over the whole vocabulary (what vLLM 0.32 loads)."""
    folder = artifact(tiny_whisper, tmp_path / "heads", draft_vocab)
    check_export(tiny_whisper, folder, tmp_path / "vllm", hidden_size=32, token_map=token_map)
    assert (tmp_path / "vllm" / "README.md").is_file()
    export_vllm.export(str(folder), str(tmp_path / "vllm"), dtype="bfloat16", token_map=token_map)  # replaced
    halves = load_file(tmp_path / "vllm" / export_vllm.WEIGHTS_FILE)
    assert halves["lm_heads.0.weight"].dtype == torch.bfloat16
    assert not (draft_vocab and token_map) or halves["token_map"].dtype == torch.int64


@requires_transformers5
def test_path_heads_and_foreign_folders_are_refused_in_one_line(tmp_path, capsys):
    from modeling_medusa import MedusaForASR
    from tiny_models import build_tiny_whisper

    base = build_tiny_whisper(tmp_path / "base", seed=1)
    MedusaForASR.from_base(str(base), head_kind="path", medusa_num_heads=2).save_pretrained(tmp_path / "path")
    capsys.readouterr()  # (saving's progress bars)
    assert export_vllm.run_cli(export_vllm.main, ["--heads", str(tmp_path / "path"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "path heads" in err and "HEADS=medusa" in err
    assert not (tmp_path / "o").exists()

    MedusaForASR.from_base(str(base), medusa_num_heads=2).save_pretrained(tmp_path / "medusa")
    capsys.readouterr()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert export_vllm.run_cli(export_vllm.main, ["--heads", str(tmp_path / "medusa"), "--out", str(tmp_path / "busy")]) == 2
    assert "not a previous vLLM export" in capsys.readouterr().err
    assert export_vllm.run_cli(export_vllm.main, ["--heads", str(base), "--out", str(tmp_path / "o")]) == 2
    assert "not a heads artifact" in capsys.readouterr().err


@pytest.mark.skipif(not transformers_below_452(), reason="MERaLiON-2's remote code runs on transformers ~4.51 only")
def test_meralion2_standin_heads_export(tmp_path):
    from modeling_medusa import MedusaForASR
    from standin import build_meralion2_standin

    base = build_meralion2_standin(tmp_path / "standin", seed=0)
    model = MedusaForASR.from_base(str(base), family="meralion2", medusa_num_heads=HEADS, medusa_num_layers=LAYERS,
                                   trust_base_remote_code=True)
    folder = artifact(model, tmp_path / "heads", draft_vocab=list(range(0, model.config.vocab_size, 2)))
    check_export(model, folder, tmp_path / "vllm", hidden_size=model.config.hidden_size)


def test_card_of_residual_heads_says_how_vllm_serves_them():
    from pipeline.model_card import render_model_card

    config = {"base_model_name_or_path": "openai/whisper-base", "base_family": "whisper", "medusa_num_heads": 4,
              "hidden_size": 512, "head_kind": "medusa"}
    card = render_model_card(config)
    assert "## Serving with vLLM" in card and "vLLM drafts a chain of top-1 tokens" in card
    assert '"num_speculative_tokens": 4' in card and "pipeline.export_vllm" in card
    assert "## Serving with vLLM" not in render_model_card({**config, "head_kind": "path"})


@requires_transformers5
@pytest.mark.skipif(os.environ.get("MEDUSA_ASR_TEST_BASE") != "1", reason="base only with MEDUSA_ASR_TEST_BASE=1")
def test_shipped_whisper_base_vllm_heads_export(tmp_path):
    """heads/whisper-base-vllm (trained residual-block heads) on the real converted base: the export with
    --token-map holds the draft vocabulary, and vLLM's drafting over it equals ours on the base's real hidden states."""
    from modeling_medusa import MedusaForASR

    folder = Path(__file__).resolve().parents[1] / "heads" / "whisper-base-vllm"
    model = MedusaForASR.from_pretrained(str(folder))
    assert model.config.head_kind == "medusa" and model.draft_vocab is not None
    config = export_vllm.export(str(folder), str(tmp_path / "vllm"), token_map=True)
    tensors = load_file(tmp_path / "vllm" / export_vllm.WEIGHTS_FILE)
    assert config["truncated_vocab_size"] == len(model.draft_vocab) < config["vocab_size"] == 51865
    hidden = model.backbone.output_projection.weight[:400].detach().float()  # real-scale states: token embeddings
    with torch.no_grad():
        assert torch.equal(vllm_drafts(tensors, config, hidden), our_drafts(model, hidden))


def test_vllm_suite_row_counts_tokens_per_verify_pass_and_identity():
    """The suite's summary row: vLLM's tokens per verify pass from its spec-decode counters (each draft pass emits
    its accepted drafts and one token of the base), beside ours; identical only when vLLM equals both greedy runs."""
    from tools import vllm_medusa as suite

    ref = {"base": "openai/whisper-base", "tokens_per_pass": 1.5, "clips": [{}, {}]}
    counters = {"num_drafts": 40, "num_draft_tokens": 160, "num_accepted_tokens": 30}
    row = suite.vllm_row(ref, True, True, counters, 4.0, "cmd")
    assert row["tokens_per_pass"]["vllm"] == 1.75 and row["tokens_per_pass"]["ours_same_heads_chain"] == 1.5
    assert row["engine"] == "vllm" and row["clips"] == 2 and row["clips_per_s"] == 0.5
    assert row["identical_to_single_process"] is True
    assert suite.vllm_row(ref, True, False, counters, 4.0, "cmd")["identical_to_single_process"] is False
    assert suite.text_ids([50258, 50259, 11, 22, 50257], eot=50257) == [11, 22]
