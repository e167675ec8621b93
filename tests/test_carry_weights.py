"""tools.carry_weights: a base folder split into (mostly float16) parts joins back to the same values, or says why not."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tools import carry_weights


def _base_folder(path, state):
    path.mkdir()
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    return path


def _half_exact(*shape):
    return torch.randn(*shape).to(torch.float16).to(torch.float32)


def test_split_then_join_gives_back_every_value_and_the_small_files(tmp_path):
    state = {"embed.weight": _half_exact(300, 16), "layer.bias": _half_exact(16), "positions": torch.arange(7),
             "empty": torch.zeros(0)}
    base = _base_folder(tmp_path / "base", state)
    parts = carry_weights.split(str(base), str(tmp_path / "part"), parts=3)
    assert len(parts) == 3  # (the embedding straddles parts: cuts fall inside tensors)
    out = carry_weights.join(parts, str(tmp_path / "joined"))
    joined = load_file(f"{out}/model.safetensors")
    assert joined.keys() == state.keys()
    assert all(joined[k].dtype == state[k].dtype and torch.equal(joined[k], state[k]) for k in state)
    assert json.loads((tmp_path / "joined" / "config.json").read_text()) == {"model_type": "whisper"}


def test_weights_float16_would_change_travel_in_their_own_dtype(tmp_path):
    state = {"scale": torch.tensor([1.0 + 2.0 ** -20, 3.0]), "packed": torch.randint(-2**31, 2**31 - 1, (5, 4),
             dtype=torch.int32), "w": _half_exact(8, 4)}
    base = _base_folder(tmp_path / "base", state)
    parts = carry_weights.split(str(base), str(tmp_path / "part"), parts=2)
    index = {e["key"]: e["carried"] for e in json.loads((tmp_path / "part1" / "weights_index.json").read_text())["tensors"]}
    assert index == {"scale": "float32", "packed": "int32", "w": "float16"}
    joined = load_file(f"{carry_weights.join(parts, str(tmp_path / 'joined'))}/model.safetensors")
    assert all(joined[k].dtype == state[k].dtype and torch.equal(joined[k], state[k]) for k in state)


def test_parts_out_of_order_are_refused(tmp_path):
    base = _base_folder(tmp_path / "base", {"w": _half_exact(64, 8)})
    first, second = carry_weights.split(str(base), str(tmp_path / "part"), parts=2)
    (tmp_path / "swapped").mkdir()
    for name in ("weights_index.json", "config.json"):
        (tmp_path / "swapped" / name).write_bytes((tmp_path / "part1" / name).read_bytes())
    (tmp_path / "swapped" / "weights.part").write_bytes((tmp_path / "part2" / "weights.part").read_bytes())
    (tmp_path / "rest").mkdir()
    (tmp_path / "rest" / "weights.part").write_bytes((tmp_path / "part1" / "weights.part").read_bytes())
    with pytest.raises(SystemExit, match="differ from the original"):
        carry_weights.join([str(tmp_path / "swapped"), str(tmp_path / "rest")], str(tmp_path / "joined"))
