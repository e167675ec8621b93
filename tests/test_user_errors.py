"""Mistakes a user can make in what they point the commands at: each one line naming the problem and the fix,
exit status 2, no traceback (a missing --base folder, a corrupt draft vocabulary or draft_candidates in an
artifact, an unusable MEDUSA_ASR_CACHE, a downloaded artifact whose base is nowhere here)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from tiny_models import build_tiny_whisper

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from modeling_medusa import MedusaForASR

    base = build_tiny_whisper(tmp_path_factory.mktemp("whisper"), seed=4)
    folder = tmp_path_factory.mktemp("artifact") / "heads"
    MedusaForASR.from_base(str(base), medusa_num_heads=2).save_pretrained(folder)
    return folder


def edited(artifact: Path, folder: Path, **config_changes) -> Path:
    shutil.copytree(artifact, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **config_changes}))
    return folder


def transcribe_error(tmp_path, capsys, *argv) -> str:
    """The one error line of ``tools.transcribe`` on a short clip with ``argv``, which must exit 2."""
    from tools import transcribe

    sf.write(tmp_path / "a.wav", np.zeros(1600, np.float32), 16000)
    capsys.readouterr()
    code = transcribe.main([str(tmp_path / "a.wav"), "--quiet", *map(str, argv)])
    err = capsys.readouterr().err
    assert code == transcribe.EXIT_USER_ERROR, err
    lines = [line for line in err.splitlines() if line.startswith("error")]  # (besides transformers' progress bars)
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_collect_names_a_missing_base_folder(tmp_path, capsys):
    from pipeline import collect

    (tmp_path / "audio").mkdir()
    sf.write(tmp_path / "audio" / "a.wav", np.zeros(1600, np.float32), 16000)
    code = collect.run_cli(collect.main, ["--base", str(tmp_path / "nonexistent"), "--audio", str(tmp_path / "audio"),
                                          "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"there is no folder {tmp_path / 'nonexistent'}" in err[0] and "--base" in err[0]
    assert "Repo id" not in err[0]


def test_a_draft_vocabulary_with_an_id_outside_the_base_is_named(artifact, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from modeling_medusa import HEADS_FILE

    folder = edited(artifact, tmp_path / "vocab")
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    heads = load_file(str(folder / HEADS_FILE))
    save_file({**heads, "draft_vocab": torch.tensor([0, 5, vocab_size + 7])}, str(folder / HEADS_FILE))
    line = transcribe_error(tmp_path, capsys, "--model", folder)
    assert f"token id {vocab_size + 7}" in line and "export them again" in line


@pytest.mark.parametrize("candidates", ["not a list", [{"paths": "x", "tokens_per_round": 2.0}],
                                        [{"paths": [[0]]}], [{"paths": [[-1]], "tokens_per_round": 1.5}]])
def test_malformed_draft_candidates_are_refused_at_load(artifact, tmp_path, capsys, candidates):
    from configuration_medusa import MedusaConfig

    with pytest.raises(ValueError, match="draft_candidates must be a list of"):
        MedusaConfig(base_family="whisper", draft_candidates=candidates)
    line = transcribe_error(tmp_path, capsys, "--model", edited(artifact, tmp_path / "c", draft_candidates=candidates))
    assert "draft_candidates must be" in line and "pipeline.export" in line


def test_an_unusable_cache_folder_names_the_variable(artifact, tmp_path, capsys, monkeypatch):
    """(A base named by Hub id is looked for among the converted copies in that folder first.)"""
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("MEDUSA_ASR_CACHE", str(tmp_path / "a_file" / "x"))
    folder = edited(artifact, tmp_path / "hub_named", base_model_name_or_path="openai/whisper-tiny.en")
    line = transcribe_error(tmp_path, capsys, "--model", folder)
    assert f"MEDUSA_ASR_CACHE={tmp_path / 'a_file' / 'x'}" in line and "writable folder" in line


def test_a_downloaded_artifact_without_its_base_says_how_to_get_it(artifact, tmp_path, capsys, monkeypatch):
    """``python example_inference.py speech.wav`` in a folder as published, offline, the base it names neither
    converted nor in the Hugging Face cache: one line with the commands that get it."""
    import example_inference

    folder = edited(artifact, tmp_path / "published", base_model_name_or_path="openai/whisper-tiny.en")
    monkeypatch.setenv("MEDUSA_ASR_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hub"))
    sf.write(tmp_path / "a.wav", np.zeros(1600, np.float32), 16000)
    assert example_inference.main([str(tmp_path / "a.wav"), str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "hf download openai/whisper-tiny.en" in err[0] and "python -m tools.real_whisper" in err[0]
    assert "base_model_name_or_path" in err[0]


def test_a_float32_model_on_a_gpu_is_told_once_in_one_line_about_bfloat16():
    """A float32 model on CUDA (transformers' default for Whisper) hears once, in one line, that bfloat16 decodes
    faster; bfloat16 on CUDA and float32 on a CPU hear nothing. The check itself needs no GPU."""
    import warnings

    from modeling_medusa import Float32OnGPU, _suggest_bfloat16

    def decode_once(on_cuda, dtype):
        _suggest_bfloat16(on_cuda, dtype)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            decode_once(True, torch.float32)
            decode_once(True, torch.bfloat16)
            decode_once(False, torch.float32)
    notes = [w for w in caught if issubclass(w.category, Float32OnGPU)]
    assert len(notes) == 1 and "\n" not in str(notes[0].message) and "dtype=torch.bfloat16" in str(notes[0].message)
