"""Quantised bases through the same artifact: weight-only quantisation stays exact against the quantised
base's own greedy output (our decoder calls the base's quantised modules, so their kernels run); a base
with quantised activations falls back to its own generate (rounding activations to a few bits would turn
the last-bit differences of multi-token verification into different tokens)."""

import warnings

import pytest
import torch

from conftest import requires_transformers5
from oracle import randomize_heads
from tiny_models import build_tiny_whisper, random_features

pytestmark = requires_transformers5
torchao = pytest.importorskip("torchao")


def quantised_medusa(folder, config, keep_projection: bool):
    from transformers import TorchAoConfig

    from modeling_medusa import MedusaForASR

    skip = ["proj_out"] if keep_projection else None
    return MedusaForASR.from_base(str(folder), quantization_config=TorchAoConfig(quant_type=config,
                                                                                 modules_to_not_convert=skip))


@pytest.mark.parametrize("keep_projection", [True, False], ids=["16-bit-projection", "int8-projection"])
def test_int8_weight_only_base_is_decoded_exactly(keep_projection, tmp_path):
    from torchao.quantization import Int8WeightOnlyConfig

    model = quantised_medusa(build_tiny_whisper(tmp_path, seed=2), Int8WeightOnlyConfig(), keep_projection)
    fc1 = model.base.model.decoder.layers[0].fc1.weight
    assert type(fc1).__name__ != "Parameter", "the base was not quantised"
    randomize_heads(model, 1)
    for seed in range(5):
        features = random_features(2, seed)
        expected = model.generate(input_features=features, max_new_tokens=14, use_medusa=False)
        for draft in ("chain", [[0], [1], [0, 0], [1, 0], [0, 0, 0]]):
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)  # no fallback: Medusa itself decoded
                got = model.generate(input_features=features, max_new_tokens=14, draft=draft, cuda_graph=False)
            assert torch.equal(expected, got), (seed, draft)


def test_activation_quantised_base_falls_back_to_its_own_generate(tmp_path):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    model = quantised_medusa(build_tiny_whisper(tmp_path, seed=2), Int8DynamicActivationInt8WeightConfig(), True)
    randomize_heads(model, 1)
    features = random_features(2, 0)
    expected = model.generate(input_features=features, max_new_tokens=14, use_medusa=False)
    with pytest.warns(UserWarning, match="quantised activations"):
        got = model.generate(input_features=features, max_new_tokens=14, draft="chain")
    assert torch.equal(expected, got)
