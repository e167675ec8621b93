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


def quantised_medusa(folder, config, keep_projection: bool):
    from transformers import TorchAoConfig

    from modeling_medusa import MedusaForASR

    skip = ["proj_out"] if keep_projection else None
    return MedusaForASR.from_base(str(folder), quantization_config=TorchAoConfig(quant_type=config,
                                                                                 modules_to_not_convert=skip))


def assert_medusa_equals_own_greedy(model, batch: int):
    """Medusa itself (no fallback warning) gives the quantised base's own greedy ids: random heads, 5 inputs, a
    chain and a tree."""
    randomize_heads(model, 1)
    for seed in range(5):
        features = random_features(batch, seed)
        expected = model.generate(input_features=features, max_new_tokens=14, use_medusa=False)
        for draft in ("chain", [[0], [1], [0, 0], [1, 0], [0, 0, 0]]):
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)
                got = model.generate(input_features=features, max_new_tokens=14, draft=draft, cuda_graph=False)
            assert torch.equal(expected, got), (seed, draft)


@pytest.mark.parametrize("keep_projection", [True, False], ids=["16-bit-projection", "int8-projection"])
def test_int8_weight_only_base_is_decoded_exactly(keep_projection, tmp_path):
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig

    model = quantised_medusa(build_tiny_whisper(tmp_path, seed=2), Int8WeightOnlyConfig(), keep_projection)
    fc1 = model.base.model.decoder.layers[0].fc1.weight
    assert type(fc1).__name__ != "Parameter", "the base was not quantised"
    assert_medusa_equals_own_greedy(model, batch=2)


def test_activation_quantised_base_falls_back_to_its_own_generate(tmp_path):
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    model = quantised_medusa(build_tiny_whisper(tmp_path, seed=2), Int8DynamicActivationInt8WeightConfig(), True)
    randomize_heads(model, 1)
    features = random_features(2, 0)
    expected = model.generate(input_features=features, max_new_tokens=14, use_medusa=False)
    with pytest.warns(UserWarning, match="quantised activations"):
        got = model.generate(input_features=features, max_new_tokens=14, draft="chain")
    assert torch.equal(expected, got)


def test_w4a16_compressed_tensors_base_is_decoded_exactly(tmp_path):
    """A compressed-tensors W4A16 base (Breeze-ASR-26's quantised format): loaded with its 4-bit values
    decompressed (said in a warning: the packed layers do not run in transformers' forward here), and Medusa
    equals that base's own greedy generate, token for token, for chains and trees."""
    pytest.importorskip("compressed_tensors")
    from modeling_medusa import MedusaForASR
    from tiny_models import build_tiny_w4a16_whisper

    folder = build_tiny_w4a16_whisper(tmp_path, seed=2)
    with pytest.warns(UserWarning, match="compressed-tensors weights .* decompressed"):
        model = MedusaForASR.from_base(str(folder))
    fc1 = model.base.model.decoder.layers[0].fc1.weight.detach()
    assert all(len(group.unique()) <= 16 for group in fc1.view(-1, 16)), "not the 4-bit values"
    randomize_heads(model, 1)
    accepted = 0
    for seed in range(5):
        features = random_features(2, seed)
        expected = model.generate(input_features=features, max_new_tokens=14, use_medusa=False)
        for draft in ("chain", [[0], [1], [0, 0], [1, 0], [0, 0, 0]]):
            got, stats = model.generate(input_features=features, max_new_tokens=14, draft=draft, cuda_graph=False,
                                        return_stats=True)
            assert torch.equal(expected, got), (seed, draft)
            accepted += stats["accepted_tokens"]
    assert accepted > 0


@pytest.mark.parametrize("scheme", ["int8", "nf4"])
@pytest.mark.parametrize("batch", [1, 2])
def test_bitsandbytes_base_is_decoded_exactly(scheme, batch, tmp_path):
    """A bitsandbytes base (LLM.int8 or NF4 weights, ``BitsAndBytesConfig``) on the CPU: our decoder calls its
    ``Linear8bitLt`` / ``Linear4bit`` layers, and Medusa equals the quantised base's own greedy generate for chains
    and trees. bitsandbytes is optional here (not in the requirements: its CPU kernels differ by CPU, its one-row
    4-bit product runs in bf16 on CPUs with AVX-512 BF16); 128 wide, as its 4-bit blocks of 64 need."""
    pytest.importorskip("bitsandbytes")
    from transformers import BitsAndBytesConfig

    from modeling_medusa import MedusaForASR

    config = (BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=["proj_out"]) if scheme == "int8" else
              BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32,
                                 llm_int8_skip_modules=["proj_out"]))
    model = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path, seed=2, width=128)), quantization_config=config)
    layer = type(model.base.model.decoder.layers[0].fc1).__name__
    assert layer == {"int8": "Linear8bitLt", "nf4": "Linear4bit"}[scheme], layer
    assert_medusa_equals_own_greedy(model, batch)


def test_a_base_in_compressed_tensors_offload_cache_moves_with_the_model():
    """compressed-tensors 0.19 under transformers 5.17 (the lent GPU's) keeps a decompressed base's layers in its CPU
    offload cache, which ``.to(device)`` cannot move: the loader makes them ordinary parameters again."""
    offload = pytest.importorskip("compressed_tensors.offload")
    from base_loading import _undo_compressed_tensors_offloading

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    weight = model[0].weight.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        offload.offload_model(model, onload_device="cpu", offload_device="cpu")
    assert isinstance(model[0]._parameters, offload.OffloadCache)
    _undo_compressed_tensors_offloading(model)
    assert torch.equal(model[0].weight, weight)
    model.to("meta")  # what .to("cuda") does to the parameters; the offload cache raises here
    assert {p.device.type for p in model.parameters()} == {"meta"}
