"""pipeline.quantise's options (without llm-compressor, which lives in its own environment): the GPTQ recipe
it passes on, the packing of calibration clips into Whisper windows, and the command line reaching both."""

from __future__ import annotations

import json
import os
import sys
import types

import numpy as np
import pytest
import soundfile as sf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pipeline import quantise  # noqa: E402


def test_recipe_stays_w4a16_on_every_linear_but_proj_out_and_checks_its_options():
    recipe = quantise.gptq_recipe()
    assert {k: recipe[k] for k in quantise.RECIPE} == quantise.RECIPE
    assert recipe["scheme"] == "W4A16" and recipe["ignore"] == ["proj_out"]
    assert quantise.gptq_recipe(actorder="none")["actorder"] is None
    assert quantise.gptq_recipe(actorder="weight", dampening_frac=0.1)["dampening_frac"] == 0.1
    for bad in ({"actorder": "group"}, {"weight_observer": "nope"}, {"dampening_frac": 0.0}):
        with pytest.raises(ValueError):
            quantise.gptq_recipe(**bad)


def test_clips_pack_into_windows_of_speech_with_a_gap_between_two(tmp_path):
    clips = [{"duration": d, "text": t} for d, t in ((10.0, "a"), (10.0, "b"), (10.0, "c"), (25.0, "d"), (2.0, "e"))]
    assert [[c["text"] for c in w] for w in quantise.pack_clips(clips, 0)] == [["a"], ["b"], ["c"], ["d"], ["e"]]
    assert [[c["text"] for c in w] for w in quantise.pack_clips(clips, 28)] == [["a", "b"], ["c"], ["d", "e"]]
    rate = 16000
    rows = []
    for name, seconds, value in (("x", 1.0, 0.25), ("y", 0.5, -0.5)):
        sf.write(tmp_path / f"{name}.wav", np.full(int(seconds * rate), value, dtype=np.float32), rate)
        rows.append({"audio": str(tmp_path / f"{name}.wav"), "text": f" {name} ", "duration": seconds})
    samples, text = quantise.window_audio(rows, gap=0.3)
    assert text == "x y"
    assert len(samples) == int(1.8 * rate)
    assert np.allclose(samples[: rate], 0.25, atol=1e-3) and np.allclose(samples[int(1.3 * rate):], -0.5, atol=1e-3)
    assert np.all(samples[rate: int(1.3 * rate)] == 0)


def test_command_line_passes_its_gptq_options_on_and_rejects_bad_ones_before_loading(tmp_path, monkeypatch):
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps({"audio": "a.wav", "text": "hello", "duration": 3.0}) + "\n")
    seen = {}

    def fake_quantise(base, out, manifest, samples, recipe, seed, pack_seconds):
        seen.update(samples=samples, recipe=recipe, seed=seed, pack_seconds=pack_seconds)
        return {"calibration": {"clips": samples, "windows": 1}, "gptq_seconds": 0.0}

    monkeypatch.setitem(sys.modules, "llmcompressor", types.ModuleType("llmcompressor"))
    monkeypatch.setattr(quantise, "quantise", fake_quantise)
    args = ["openai/whisper-tiny.en", str(tmp_path / "out"), "--calibration", str(manifest)]
    assert quantise.main(args) == 0
    assert seen == {"samples": quantise.DEFAULTS["samples"], "seed": 0, "pack_seconds": quantise.DEFAULTS["pack_seconds"],
                    "recipe": quantise.gptq_recipe()}
    assert {k: seen["recipe"][k] for k in ("actorder", "dampening_frac", "weight_observer")} == {
        k: quantise.DEFAULTS[k] for k in ("actorder", "dampening_frac", "weight_observer")}
    assert quantise.main([*args, "--actorder", "weight", "--dampening-frac", "0.05", "--weight-observer",
                          "memoryless_mse", "--pack-seconds", "20", "--samples", "8", "--seed", "3"]) == 0
    assert seen == {"samples": 8, "seed": 3, "pack_seconds": 20.0,
                    "recipe": quantise.gptq_recipe("weight", 0.05, "memoryless_mse")}
    seen.clear()
    with pytest.raises(SystemExit) as refused:  # argparse's range check (tools.cli_args), before any model loads
        quantise.main([*args, "--dampening-frac", "2"])
    assert refused.value.code == 2 and not seen
