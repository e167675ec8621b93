"""tools.recipe_cost: each step train_heads.sh logs becomes a row of time, GPU memory and disk per hour of audio."""

import json
import os

import pytest

from tools import recipe_cost

FAKE_PYTHON = """#!/usr/bin/env python3
import json, os, sys, time
args = sys.argv[1:]
out = args[args.index("--out") + 1]
os.makedirs(out, exist_ok=True)
time.sleep(0.2)
if "pipeline.collect" in args:
    info = {"n_utterances": 3, "n_tokens": 90, "audio_seconds": 1800.0}
    json.dump(info, open(os.path.join(out, "collect_info.json"), "w"))
    open(os.path.join(out, "shard_00000.safetensors"), "wb").write(b"x" * 3 * 2**20)
else:
    open(os.path.join(out, "weights.bin"), "wb").write(b"x" * 2**20)
"""


def test_rows_per_step_and_per_audio_hour(tmp_path, monkeypatch):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    result = recipe_cost.main(["--base", "/models/MERaLiON-2-3B", "--work", "work", "--audio", "/data/calls",
                               "--env", f"PYTHON={fake}", "--env", "HEADS=path", "--out", "cost.json"])
    assert json.loads((tmp_path / "cost.json").read_text()) == result
    assert result["env"] == {"PYTHON": str(fake), "HEADS": "path"} and "--audio /data/calls" in result["command"]
    assert (result["clips"], result["tokens"], result["audio_hours"], result["tokens_per_audio_hour"]) == (3, 90, 0.5,
                                                                                                         180)
    steps = {row["step"]: row for row in result["steps"]}
    assert list(steps) == ["collect", "train", "export"]
    for name in ("collect", "train"):  # (their time grows with the audio; export's is the same for any amount)
        row = steps[name]
        assert row["seconds"] >= 0.2 and row["seconds_per_audio_hour"] == pytest.approx(2 * row["seconds"], abs=0.2)
    assert steps["export"]["seconds"] >= 0.2 and steps["export"]["seconds_per_audio_hour"] is None
    assert steps["collect"]["disk_mib"] == pytest.approx(3.0, abs=0.01)
    assert steps["collect"]["disk_gib_per_audio_hour"] == pytest.approx(6 / 1024, abs=1e-3)
    assert (steps["train"]["disk_mib"], steps["train"]["disk_gib_per_audio_hour"]) == (1.0, None)


def test_gpu_memory_peak_is_the_largest_sample_inside_a_step():
    sampler = recipe_cost.GpuMemorySampler(interval=1.0)
    sampler.samples = [(10.0, 500), (11.0, 9000), (12.0, 700), (20.0, 30000)]
    assert sampler.peak_mib(10.5, 12.5) == 9000
    assert sampler.peak_mib(13.0, 19.0) is None


def test_an_env_setting_without_a_value_is_refused(capsys):
    with pytest.raises(SystemExit):
        recipe_cost.parse_args(["--base", "b", "--work", "w", "--out", "o", "--env", "HEADS"])
    assert "NAME=VALUE" in capsys.readouterr().err


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """The rows' GPU memory is read with nvidia-smi; here there is none, whatever the machine has."""
    real_which = recipe_cost.shutil.which
    monkeypatch.setattr(recipe_cost.shutil, "which", lambda name: None if name == "nvidia-smi" else real_which(name))
    yield
    assert os.environ.get("STEP_LOG") is None  # the recipe's settings never leak into this process


def test_the_root_card_reads_a_gpu_run_per_hour_of_audio():
    from pipeline.model_card import recipe_cost_sentence

    cost = {"gpu": "NVIDIA H100 80GB HBM3", "env": {"MAX_NEW_TOKENS": "32", "EPOCHS": "15"}, "steps": [
        {"step": "collect", "seconds": 60.0, "seconds_per_audio_hour": 240.0, "gpu_memory_peak_gib": 9.5,
         "disk_mib": 100.0, "disk_gib_per_audio_hour": 0.2},
        {"step": "train", "seconds": 30.0, "seconds_per_audio_hour": 120.0, "gpu_memory_peak_gib": 12.2,
         "disk_mib": 972.0, "disk_gib_per_audio_hour": None},
        {"step": "export", "seconds": 30.0, "seconds_per_audio_hour": None, "gpu_memory_peak_gib": None,
         "disk_mib": 254.0, "disk_gib_per_audio_hour": None}]}
    assert recipe_cost_sentence(cost) == (
        " On an H100 (32 tokens a clip, 15 epochs) an hour of audio took collect 4.0 min and train 2.0 min, export"
        " 0.5 min. It peaked at 12 GiB of GPU memory, writing 0.2 GiB an hour plus 1.2 GiB of checkpoints.")
    assert recipe_cost_sentence({**cost, "env": {}}).startswith(" On an H100 an hour of audio took collect")
    assert recipe_cost_sentence(None) == ""
