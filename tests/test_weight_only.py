"""Weight-only quantised layers (tools.weight_only): they multiply the packed weights, match their own
dequantised weights, and replace a model's linears in place."""

import pytest
import torch

from tools.weight_only import Int8WeightOnlyLinear, _int4_quantise, module_bytes, quantise_linears


def test_int8_layer_multiplies_its_packed_weights_like_their_dequantised_copy():
    torch.manual_seed(0)
    dense = torch.nn.Linear(256, 64)  # widths in multiples of 16 (see int8_drafting_supported)
    layer = Int8WeightOnlyLinear(dense)
    x = torch.randn(3, 5, 256)
    dequantised = layer.weight_int8.float() * layer.scales[:, None]
    assert torch.allclose(layer(x), x @ dequantised.T + dense.bias, atol=1e-4)
    assert (dequantised - dense.weight).abs().max() <= layer.scales.max() / 2 + 1e-6  # rounding to the nearest step
    assert not hasattr(layer, "weight")  # no dense copy kept


def test_int4_groups_round_to_the_nearest_of_sixteen_levels():
    torch.manual_seed(0)
    weight = torch.randn(8, 256)
    q, scale, lo = _int4_quantise(weight, 128)
    assert q.min() >= 0 and q.max() <= 15 and scale.shape == (8, 2)
    dequantised = (lo[..., None] + q.reshape(8, 2, 128) * scale[..., None]).reshape(8, 256)
    assert ((dequantised - weight).abs() <= scale.repeat_interleave(128, dim=1) / 2 + 1e-6).all()


def test_quantise_linears_replaces_every_linear_but_the_skipped_and_shrinks_the_weights():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    model.lm_head = torch.nn.Linear(64, 32)
    before = module_bytes(model)
    assert quantise_linears(model, "int8") == 2
    assert type(model[0]) is Int8WeightOnlyLinear and type(model.lm_head) is torch.nn.Linear
    assert module_bytes(model) < before / 2
    assert quantise_linears(model, "bf16") == 0
    with pytest.raises(ValueError, match="use one of bf16, int8, int4"):
        quantise_linears(model, "int3")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the int4 tinygemm kernel is CUDA-only")
def test_int4_layer_multiplies_its_packed_weights_like_their_dequantised_copy():
    from tools.weight_only import Int4WeightOnlyLinear

    torch.manual_seed(0)
    dense = torch.nn.Linear(256, 64, bias=False).cuda().bfloat16()
    layer = Int4WeightOnlyLinear(dense)
    q, scale, lo = _int4_quantise(dense.weight, 128)
    dequantised = (lo[..., None] + q.reshape(64, 2, 128) * scale[..., None]).reshape(64, 256)
    x = torch.randn(7, 256, device="cuda", dtype=torch.bfloat16)
    assert torch.allclose(layer(x).float(), x.float() @ dequantised.T, atol=0.05, rtol=0.02)


def assert_medusa_equals_the_base(model, cases: int):
    """Medusa's ids equal the (quantised) base's own greedy generate on ``cases`` random inputs, chains and a tree,
    with drafts from the base's own continuation, some of them wrong, and some accepted."""
    from oracle import OracleDrafter
    from tiny_models import random_features

    accepted = 0
    for case in range(cases):
        inputs = {"input_features": random_features(1 + case % 2, case), "max_new_tokens": 16}
        expected = model.generate(**inputs, use_medusa=False)
        model.drafter = OracleDrafter(model, model.collect_hidden_states(**inputs), model.backbone.vocab_size,
                                      0.3, seed=case)
        for draft in ("chain", [[0], [1], [0, 0], [0, 1], [0, 0, 0]]):
            got, stats = model.generate(**inputs, draft=draft, return_stats=True)
            assert torch.equal(got, expected)
            accepted += stats["accepted_tokens"]
        model.drafter = None
    assert accepted > 0


def test_a_base_with_int8_weight_only_layers_is_decoded_exactly(tmp_path):
    """The decode loop calls the base's own (here int8 weight-only) layers: Medusa's ids equal that quantised base's
    own greedy generate, float32 on the CPU, chains and trees, with drafts accepted."""
    from modeling_medusa import MedusaForASR
    from tiny_models import build_tiny_whisper

    model = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path / "w", seed=4)), medusa_num_heads=3)
    assert quantise_linears(model.base.model.decoder, "int8") > 0  # widths 32 / 64: multiples of 16
    assert_medusa_equals_the_base(model, cases=4)


def test_a_gptq_w4a16_checkpoint_runs_on_the_int4_kernel_exactly(tmp_path):
    """A compressed-tensors W4A16 base (loaded decompressed) gets int4 kernel layers holding the checkpoint's own
    4-bit values and scales (its CPU port here): each layer multiplies like the decompressed one, and Medusa's ids
    equal that int4 base's own greedy generate, chains and trees, with drafts accepted."""
    import warnings

    pytest.importorskip("compressed_tensors")  # the checkpoint's format (the GPU image lacks it)
    from modeling_medusa import MedusaForASR
    from tiny_models import build_tiny_w4a16_whisper
    from tools.benchmark import int4_layers
    from tools.weight_only import Int4WeightOnlyLinear, repack_gptq_linears

    folder = build_tiny_w4a16_whisper(tmp_path, seed=4, group_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (decompressed at load: said in a warning)
        model = MedusaForASR.from_base(str(folder), medusa_num_heads=3)
    fc1 = model.base.model.decoder.layers[0].fc1
    x = torch.randn(5, fc1.in_features)
    dense_out = fc1(x)
    swapped = repack_gptq_linears(model.base, folder)
    assert swapped == sum(1 for m in model.base.modules() if type(m) is Int4WeightOnlyLinear) > 10
    assert int4_layers(model) == swapped  # (what the benchmark records of a --int4-kernel run)
    assert type(model.base.proj_out) is torch.nn.Linear  # kept 16-bit by the recipe
    # the same values but for the scales, which the kernels hold in bf16 (the checkpoint's are float32)
    bound = (x.abs() @ fc1.weight.abs().T) * 2.0**-8 + 1e-5
    assert ((model.base.model.decoder.layers[0].fc1(x) - dense_out).abs() <= bound).all()
    assert_medusa_equals_the_base(model, cases=3)


def _gemlite_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import gemlite  # noqa: F401
    except ImportError:
        return False
    return True


requires_gemlite = pytest.mark.skipif(not _gemlite_available(), reason="GemLite's kernels need CUDA and gemlite")


@requires_gemlite
@pytest.mark.parametrize("rows", [1, 5, 16, 64])  # GemLite's matrix-vector, split-K and GEMM kernels
def test_gemlite_layers_multiply_their_packed_weights_like_their_dequantised_copy(rows):
    from tools.weight_only import GemliteInt4Linear, GemliteInt8Linear

    torch.manual_seed(rows)
    dense = torch.nn.Linear(256, 128).cuda().bfloat16()
    x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
    q, scale, lo = _int4_quantise(dense.weight, 128)
    int4 = (lo[..., None] + q.reshape(128, 2, 128) * scale[..., None]).reshape(128, 256)
    weight = dense.weight.float()
    int8_scale = weight.abs().amax(dim=1, keepdim=True) / 127
    int8 = (weight / int8_scale).round() * int8_scale
    for layer, dequantised in ((GemliteInt4Linear(dense), int4), (GemliteInt8Linear(dense), int8)):
        expected = x.float() @ dequantised.T + dense.bias.float()
        assert torch.allclose(layer(x).float(), expected, atol=0.05, rtol=0.02), layer.kernel
        assert not any(p.shape == dense.weight.shape and p.is_floating_point() for p in layer.parameters())


@requires_gemlite
def test_a_base_on_gemlite_int4_layers_is_decoded_like_its_own_greedy_generate(tmp_path):
    """bf16 on the GPU, GemLite's 4-bit decoder layers (its kernel changes with the rows verified): each row equals
    that base's own greedy generate, or leaves it only at one of its own near-ties (bf16_ties.py); chains and a
    tree, batches of 1 and 2."""
    from modeling_medusa import MedusaForASR
    from oracle import OracleDrafter
    from tools.bf16_ties import check_bf16_batch
    from tiny_models import build_tiny_whisper, random_features

    folder = build_tiny_whisper(tmp_path / "w", seed=4, width=128)  # GemLite's 4-bit groups need 128 columns
    model = MedusaForASR.from_base(str(folder), medusa_num_heads=3, torch_dtype=torch.bfloat16, device_map="cuda")
    assert quantise_linears(model.base.model.decoder, "int4-gemlite") > 0
    accepted = 0
    for case in range(4):
        inputs = {"input_features": random_features(1 + case % 2, case).to("cuda", torch.bfloat16),
                  "max_new_tokens": 16}
        expected = model.generate(**inputs, use_medusa=False)
        scores = model.base.generate(**inputs, output_scores=True, return_dict_in_generate=True).scores
        model.drafter = OracleDrafter(model, model.collect_hidden_states(**inputs), model.backbone.vocab_size,
                                      0.3, seed=case)
        for draft in ("chain", [[0], [1], [0, 0], [0, 1], [0, 0, 0]]):
            got, stats = model.generate(**inputs, draft=draft, return_stats=True, cuda_graph=False)  # (host oracle)
            assert not check_bf16_batch(expected.tolist(), got.tolist(), scores)
            accepted += stats["accepted_tokens"]
        model.drafter = None
    assert accepted > 0
