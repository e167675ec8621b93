"""A base's own code runs only where its family needs it (MERaLiON-2; Whisper never) and the user agreed to that
base: the one the artifact names, or an explicit ``trust_base_remote_code=True`` / ``--trust-base-code``. A folder
whose config.json maps its classes to its own code is read as data, never imported, unless so agreed."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import requires_transformers5, transformers_below_452
from tiny_models import build_tiny_whisper

EVIL_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("the base's code ran")
from transformers import PretrainedConfig, WhisperConfig


class EvilConfig(PretrainedConfig):
    model_type = "evil"


class EvilWhisperConfig(WhisperConfig):
    pass
"""
EVIL_MAP = {name: "evil.EvilConfig" for name in ("AutoConfig", "AutoModel", "AutoModelForSpeechSeq2Seq",
                                                 "AutoProcessor", "AutoFeatureExtractor")}


def plant_code(folder: Path, marker: Path, config: dict) -> Path:
    """``folder`` with ``config`` merged into its config.json and an evil.py that writes ``marker`` when run."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    path = folder / "config.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**old, **config}))
    return folder


@pytest.fixture(scope="module")
def whisper_artifact(tmp_path_factory):
    from modeling_medusa import MedusaForASR

    base = build_tiny_whisper(tmp_path_factory.mktemp("whisper"), seed=4)
    folder = tmp_path_factory.mktemp("artifact") / "heads"
    MedusaForASR.from_base(str(base), medusa_num_heads=2).save_pretrained(folder)
    return folder, base


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text.strip(), text
    return text


@pytest.mark.parametrize("model_type", [None, "meralion2", "evil"])
def test_a_base_named_at_run_time_does_not_run_its_code(whisper_artifact, tmp_path, model_type):
    """The issue's folder (only ``auto_map``), and the same folder claiming to be MERaLiON-2 (whose family runs
    code) or an unknown type: refused in one line, its code never imported."""
    from transformers import AutoModel

    marker = tmp_path / "ran"
    evil = plant_code(tmp_path / "evil", marker, {"auto_map": EVIL_MAP, **({"model_type": model_type}
                                                                         if model_type else {})})
    artifact, _ = whisper_artifact
    with pytest.raises(ValueError) as caught:
        AutoModel.from_pretrained(str(artifact), trust_remote_code=True, base_model_name_or_path=str(evil))
    message = one_line(caught.value)
    assert not marker.exists()
    if model_type == "meralion2":
        assert "trust_base_remote_code=True" in message and "--trust-base-code" in message
    else:
        assert "supported bases are MERaLiON-2 and Whisper" in message


def test_from_base_and_an_adapter_do_not_run_a_base_code_unasked(tmp_path):
    """``from_base`` of a MERaLiON-2-typed folder, and a PEFT adapter whose adapter_config.json names it: refused
    before anything of the folder is imported."""
    from modeling_medusa import BaseCodeNotTrusted, MedusaForASR

    marker = tmp_path / "ran"
    evil = plant_code(tmp_path / "evil", marker, {"auto_map": EVIL_MAP, "model_type": "meralion2"})
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(evil),
                                                              "peft_type": "LORA"}))
    for name in (evil, adapter):
        with pytest.raises(BaseCodeNotTrusted):
            MedusaForASR.from_base(str(name))
    assert not marker.exists()


@requires_transformers5
def test_a_whisper_base_never_runs_its_code(whisper_artifact, tmp_path):
    """A Whisper base loads with transformers' own classes even where its config, feature extractor and tokenizer
    map to code of its folder, and even when the user trusts it: the ids are those of the base without the code."""
    from modeling_medusa import MedusaForASR

    artifact, base = whisper_artifact
    marker = tmp_path / "ran"
    copy = plant_code(shutil.copytree(base, tmp_path / "whisper"), marker, {"auto_map": EVIL_MAP})
    for name in ("preprocessor_config.json", "tokenizer_config.json"):
        if (copy / name).is_file():
            data = json.loads((copy / name).read_text())
            (copy / name).write_text(json.dumps({**data, "auto_map": EVIL_MAP}))
    planted = MedusaForASR.from_pretrained(str(artifact), base_model_name_or_path=str(copy),
                                           trust_base_remote_code=True)
    assert not marker.exists()
    plain = MedusaForASR.from_pretrained(str(artifact))
    features = torch.from_numpy(np.random.default_rng(0).normal(size=(1, 80, 3000)).astype(np.float32))
    assert torch.equal(planted.generate(input_features=features, max_new_tokens=8),
                       plain.generate(input_features=features, max_new_tokens=8))


def test_transcribe_refuses_a_code_running_base_in_one_line(whisper_artifact, tmp_path, capsys):
    import soundfile as sf

    from tools import transcribe

    marker = tmp_path / "ran"
    evil = plant_code(tmp_path / "evil", marker, {"auto_map": EVIL_MAP, "model_type": "meralion2"})
    sf.write(tmp_path / "a.wav", np.zeros(1600, np.float32), 16000)
    code = transcribe.main([str(tmp_path / "a.wav"), "--model", str(whisper_artifact[0]), "--base", str(evil),
                            "--quiet"])
    err = capsys.readouterr().err
    assert code == transcribe.EXIT_USER_ERROR
    assert "--trust-base-code" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()


meralion2_only = pytest.mark.skipif(not transformers_below_452(),
                                    reason="MERaLiON-2's remote code runs on transformers ~4.51 only")


@pytest.fixture(scope="module")
def meralion2_artifact(tmp_path_factory):
    from modeling_medusa import MedusaForASR
    from standin import build_meralion2_standin

    base = build_meralion2_standin(tmp_path_factory.mktemp("m2") / "standin", seed=0)
    folder = tmp_path_factory.mktemp("m2artifact") / "heads"
    MedusaForASR.from_base(str(base), family="meralion2", medusa_num_heads=2,
                           trust_base_remote_code=True).save_pretrained(folder)
    return folder, base


@meralion2_only
def test_meralion2_base_runs_its_code_when_named_by_the_heads_or_trusted(meralion2_artifact, tmp_path):
    """The base the artifact names loads as before; the same stand-in named at run time needs the opt-in, and
    with it loads; ``from_base`` needs it too."""
    from modeling_medusa import BaseCodeNotTrusted, MedusaForASR

    artifact, base = meralion2_artifact
    assert MedusaForASR.from_pretrained(str(artifact)).family == "meralion2"
    copy = shutil.copytree(base, tmp_path / "copy")
    with pytest.raises(BaseCodeNotTrusted) as caught:
        MedusaForASR.from_pretrained(str(artifact), base_model_name_or_path=str(copy))
    assert str(copy) in one_line(caught.value)
    with pytest.raises(BaseCodeNotTrusted):
        MedusaForASR.from_base(str(copy))
    trusted = MedusaForASR.from_pretrained(str(artifact), base_model_name_or_path=str(copy),
                                           trust_base_remote_code=True)
    assert trusted.family == "meralion2" and trusted.processor is not None


@meralion2_only
def test_meralion2_cli_base_needs_trust_base_code(meralion2_artifact, tmp_path, capsys):
    import soundfile as sf

    from tools import transcribe

    artifact, base = meralion2_artifact
    copy = shutil.copytree(base, tmp_path / "copy")
    noise = 0.1 * np.random.default_rng(0).standard_normal(16000).astype(np.float32)  # (silence fails as no text)
    sf.write(tmp_path / "a.wav", noise, 16000)
    cli = [str(tmp_path / "a.wav"), "--model", str(artifact), "--base", str(copy), "--max-new-tokens", "4", "--quiet"]
    assert transcribe.main(cli) == transcribe.EXIT_USER_ERROR
    assert "--trust-base-code" in capsys.readouterr().err
    # with consent the base loads and the file is decoded: a transcript (0), or none from random weights (1)
    assert transcribe.main(cli + ["--trust-base-code"]) in (0, 1)
    assert "--trust-base-code" not in capsys.readouterr().err
