"""MERaLiON-2 (tiny faithful stand-in, transformers 4.51): Medusa output == the base's own greedy
generate over many random cases, including prompts far past the sliding window."""

import logging
import random

import numpy as np
import pytest
import torch

from tools.bf16_ties import check_bf16_batch
from conftest import transformers_below_452
from oracle import OracleDrafter, randomize_heads

pytestmark = pytest.mark.skipif(
    not transformers_below_452(),
    reason="MERaLiON-2's remote code runs on transformers ~4.51 only (5.x cannot import it); "
    "this suite runs in CI's transformers 4.51.3 environment.",
)

CASES = 45


@pytest.fixture(scope="module")
def meralion_medusa(tmp_path_factory):
    from modeling_medusa import MedusaForASR
    from standin import build_meralion2_standin

    folder = build_meralion2_standin(tmp_path_factory.mktemp("meralion2") / "standin", seed=0)
    return MedusaForASR.from_base(str(folder), family="meralion2", trust_base_remote_code=True, medusa_num_heads=4)


def make_inputs(model, rng: random.Random, batch: int):
    from standin import make_meralion2_inputs

    audios = []
    for _ in range(batch):
        seconds = rng.choice([0.7, 3.0, 11.0, 29.0, 31.0, 65.0])
        gen = np.random.default_rng(rng.randint(0, 10_000))
        audios.append((gen.standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32))
    return make_meralion2_inputs(model.processor, audios)


def test_medusa_equals_base_greedy_on_random_cases(meralion_medusa):
    model = meralion_medusa
    rng = random.Random(7)
    accepted_any = False
    for index in range(CASES):
        inputs = make_inputs(model, rng, rng.randint(1, 2))
        kwargs = {"max_new_tokens": rng.choice([1, 2, 4, 7, 12, 20, 30])}
        if rng.random() < 0.25:
            kwargs["min_new_tokens"] = rng.choice([2, 5])
        expected = model.generate(**inputs, use_medusa=False, **kwargs)
        randomize_heads(model, index)
        draft = rng.choice(["chain", "chain", [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]])
        drafter = rng.choice(["random", "oracle", "noisy"])
        if drafter != "random":
            rows = model.collect_hidden_states(**inputs, max_new_tokens=kwargs["max_new_tokens"] + 8)
            model.drafter = OracleDrafter(model, rows, model.backbone.vocab_size,
                                              0.0 if drafter == "oracle" else 0.4, seed=index)
        try:
            got, stats = model.generate(**inputs, draft=draft, return_stats=True,
                                        cuda_graph=rng.random() < 0.3, **kwargs)
        finally:
            model.drafter = None
        assert torch.equal(expected, got), f"case {index}: base {expected.tolist()} medusa {got.tolist()}"
        accepted_any |= stats["accepted_tokens"] > 0
    assert accepted_any


def test_collected_tokens_are_the_base_greedy_output(meralion_medusa):
    inputs = make_inputs(meralion_medusa, random.Random(3), 2)
    expected = meralion_medusa.generate(**inputs, use_medusa=False, max_new_tokens=15)
    rows = meralion_medusa.collect_hidden_states(**inputs, max_new_tokens=15)
    prompt = inputs["input_ids"].shape[1]
    for row, (tokens, hiddens) in enumerate(rows):
        assert tokens.tolist() == expected[row, prompt:prompt + len(tokens)].tolist()
        assert hiddens.shape == (len(tokens), meralion_medusa.config.hidden_size)


def test_compiled_prefill_and_rounds_equal_the_base_greedy(meralion_medusa):
    """``compile=True`` compiles the prefill's speech encoder and prompt pass as well as the rounds (on CPU without a
    CUDA graph): the same ids as the base, for prompts of two lengths and batch sizes (each its own compile), oracle
    drafts accepted, and the compiled prompt pass's hidden state equal to the eager one within fp32 rounding."""
    from kv_cache import CachePool

    model = meralion_medusa
    rng = random.Random(5)
    accepted = 0
    for index in range(2):
        inputs = make_inputs(model, rng, index + 1)
        expected = model.generate(**inputs, use_medusa=False, max_new_tokens=10)
        rows = model.collect_hidden_states(**inputs, max_new_tokens=18)
        model.drafter = OracleDrafter(model, rows, model.backbone.vocab_size, 0.2, seed=index)
        try:
            got, stats = model.generate(**inputs, max_new_tokens=10, draft="chain", compile=True, cuda_graph=False,
                                        return_stats=True)
        finally:
            model.drafter = None
        assert torch.equal(expected, got), f"call {index}: base {expected.tolist()} compiled {got.tolist()}"
        accepted += stats["accepted_tokens"]
    assert accepted > 0 and model.backbone._compiled_prompt is not None

    backbone, process = model.backbone, model.backbone.make_logits_processor(None)
    hidden = {compiled: backbone.prefill(inputs, 4, 4, process, cache_pool=CachePool(), compile=compiled)[0].hidden
              for compiled in (False, True)}
    torch.testing.assert_close(hidden[True], hidden[False], rtol=1e-4, atol=1e-4)


def test_layer_regions_trace_one_layer_for_all_and_equal_the_base_greedy(meralion_medusa, caplog):
    """``KernelOptions(layer_regions=True)``, compiled: Dynamo traces a decoder layer once and reuses it for the
    others (the 3B shape's compile time), which it does only for inputs it can compare: tensors, constants, modules,
    never views of one tensor (so the projections stay unfused). The ids stay the base's, one token a pass and more."""
    import dataclasses

    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(meralion_medusa.config.base_model_name_or_path, family="meralion2",
                                   trust_base_remote_code=True, medusa_num_heads=4)
    model.backbone.kernels = dataclasses.replace(model.backbone.kernels, layer_regions=True)
    inputs = make_inputs(model, random.Random(7), 1)
    expected = model.generate(**inputs, use_medusa=False, max_new_tokens=8)
    torch._logging.set_logs(hierarchical_compile=True)
    try:
        with caplog.at_level(logging.DEBUG):
            for draft in ("none", "chain"):
                got = model.generate(**inputs, max_new_tokens=8, draft=draft, compile=True, cuda_graph=False)
                assert torch.equal(expected, got), f"{draft}: base {expected.tolist()} regions {got.tolist()}"
    finally:
        torch._logging.set_logs()
    assert model.backbone.fused is None
    assert "reusing subgraph" in caplog.text and "not eligible" not in caplog.text


def test_bfloat16_equals_the_base_bfloat16_greedy_up_to_its_own_near_ties(meralion_medusa, tmp_path):
    """bf16: every row equals the base's own bf16 greedy output, or leaves it only where the base's top-2
    scores were within bf16 rounding and Medusa took the other tied token (see bf16_ties.py)."""
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(meralion_medusa.config.base_model_name_or_path, family="meralion2",
                                   trust_base_remote_code=True, torch_dtype=torch.bfloat16)
    rng = random.Random(11)
    diverged = 0
    for index in range(12):
        inputs = make_inputs(model, rng, rng.randint(1, 2))
        inputs["input_features"] = inputs["input_features"].to(torch.bfloat16)
        expected = model.generate(**inputs, use_medusa=False, max_new_tokens=16)
        scores = model.base.generate(**inputs, max_new_tokens=16, output_scores=True,
                                     return_dict_in_generate=True).scores
        randomize_heads(model, index, std=0.05)
        draft = rng.choice(["chain", [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]])
        got = model.generate(**inputs, max_new_tokens=16, draft=draft)
        prompt = inputs["input_ids"].shape[1]
        problems = check_bf16_batch(expected[:, prompt:].tolist(), got[:, prompt:].tolist(), scores)
        assert not problems, f"case {index}: {problems}"
        diverged += not torch.equal(expected, got)
    print(f"bf16: {diverged}/12 cases left the base's output at one of its own near-ties")


def test_right_padding_tokenizer_is_left_padded_or_refused(meralion_medusa):
    """A tokenizer that pads on the right would make the shorter rows' last prompt positions padding:
    prepare_audio_inputs pads on the left whatever the tokenizer says, and collect_hidden_states refuses
    right-padded inputs instead of recording hidden states of padding."""
    from standin import make_meralion2_inputs

    model = meralion_medusa
    tokenizer = model.processor.tokenizer
    audios = [np.random.default_rng(seed).normal(0, 0.1, int(16000 * seconds)).astype(np.float32)
              for seed, seconds in ((1, 3.0), (2, 40.0))]
    tokenizer.padding_side = "right"
    try:
        right = make_meralion2_inputs(model.processor, audios)
        inputs = model.prepare_audio_inputs(audios)
    finally:
        tokenizer.padding_side = "left"
    assert bool((right["attention_mask"][:, -1] == 0).any())
    with pytest.raises(ValueError, match="right padding"):
        model.collect_hidden_states(**right, max_new_tokens=6)
    assert bool((inputs["attention_mask"][:, -1] == 1).all())
    expected = model.generate(**inputs, use_medusa=False, max_new_tokens=6)
    prompt = inputs["input_ids"].shape[1]
    for row, (tokens, _) in enumerate(model.collect_hidden_states(**inputs, max_new_tokens=6)):
        assert tokens.tolist() == expected[row, prompt:prompt + len(tokens)].tolist()


def test_missing_input_is_a_clear_error(meralion_medusa):
    inputs = make_inputs(meralion_medusa, random.Random(1), 1)
    del inputs["input_features"]
    with pytest.raises(ValueError, match="input_features"):
        meralion_medusa.generate(**inputs, max_new_tokens=3)


def test_speech_encoder_attends_through_sdpa_unless_asked_otherwise(meralion_medusa):
    """Loaded by us, the speech encoder's attention is SDPA (MERaLiON-2's code would hand it the decoder's eager
    attention), over the same weights, giving the eager encoder's output to float32 rounding; the decoder stays eager
    (soft-capping); an ``attn_implementation`` the caller names is left as asked."""
    from transformers.models.whisper.modeling_whisper import WhisperAttention

    from modeling_medusa import MedusaForASR

    base = meralion_medusa.backbone.base
    assert base.text_decoder.config._attn_implementation == "eager"
    assert {type(layer.self_attn).__name__ for layer in base.speech_encoder.layers} == {"WhisperSdpaAttention"}
    asked = MedusaForASR.from_base(meralion_medusa.config.base_model_name_or_path, family="meralion2",
                                   trust_base_remote_code=True, attn_implementation="eager").backbone.base
    assert all(type(layer.self_attn) is WhisperAttention for layer in asked.speech_encoder.layers)
    features = make_inputs(meralion_medusa, random.Random(2), 2)["input_features"]
    with torch.no_grad():
        sdpa, eager = (b.speech_encoder(features).last_hidden_state for b in (base, asked))
    torch.testing.assert_close(sdpa, eager, rtol=1e-4, atol=1e-4)


def test_fused_projections_share_memory_and_keep_the_output(meralion_medusa):
    """q/k/v and gate/up fused into one weight each: the base's layers become views of it (no extra
    memory), the base's own generate is unchanged, and Medusa still equals it; new weight tensors
    (what ``.to()`` makes) are fused anew instead of stale weights used."""
    from backbone import backs
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(meralion_medusa.config.base_model_name_or_path, family="meralion2",
                                   trust_base_remote_code=True)
    backbone = model.backbone
    rng = random.Random(21)
    cases = [(make_inputs(model, rng, rng.randint(1, 2)), rng.choice(["chain", [[0], [1], [0, 0], [0, 0, 0]]]))
             for _ in range(6)]
    expected = [model.generate(**inputs, use_medusa=False, max_new_tokens=12) for inputs, _ in cases]
    bytes_before = sum(p.numel() * p.element_size() for p in model.base.parameters())
    assert backbone.fuse_projections()
    layer = backbone.model.layers[1]
    qkv, gate_up = backbone.fused[1]
    assert layer.self_attn.k_proj.weight.data_ptr() == qkv[layer.self_attn.q_proj.out_features].data_ptr()
    assert layer.mlp.up_proj.weight.data_ptr() == gate_up[layer.mlp.gate_proj.out_features].data_ptr()
    assert sum(p.numel() * p.element_size() for p in model.base.parameters()) == bytes_before
    for index, ((inputs, draft), want) in enumerate(zip(cases, expected)):
        assert torch.equal(model.generate(**inputs, use_medusa=False, max_new_tokens=12), want)
        randomize_heads(model, index)
        assert torch.equal(model.generate(**inputs, draft=draft, max_new_tokens=12, cuda_graph=index % 2 == 0), want)
    for param in model.base.parameters():  # what .to(device/dtype) does: every parameter gets a new tensor
        param.data = param.data.clone()
    inputs, _ = cases[0]
    stale = backbone.fused
    assert torch.equal(model.generate(**inputs, draft="chain", max_new_tokens=12), expected[0])
    qkv, _ = backbone.fused[0]  # fused again, over the new tensors
    assert backbone.fused is not stale and backs(qkv, backbone.model.layers[0].self_attn.q_proj)


def test_fusing_keeps_the_captures_of_later_calls(meralion_medusa):
    """Fusing gives the layers new weight tensors: the round cache records those as the weights its captures use,
    so a later call keeps every capture instead of dropping them as stale and fusing again."""
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(meralion_medusa.config.base_model_name_or_path, family="meralion2",
                                   trust_base_remote_code=True)
    model._captured_calls(fuse=True)
    fused = model.backbone.fused
    assert fused is not None
    model.round_cache.calls.graphs["kept"] = None  # (stands for a capture an earlier call kept)
    model._captured_calls(fuse=True)
    assert "kept" in model.round_cache.calls.graphs and model.backbone.fused is fused
    for param in model.base.parameters():  # new weight tensors (.to(), a reload): the captures go
        param.data = param.data.clone()
    model._captured_calls(fuse=False)
    assert "kept" not in model.round_cache.calls.graphs


def test_rotary_table_gives_the_base_rotary_values_and_output(meralion_medusa):
    """On a GPU the passes gather cos/sin from a table made at prefill by the base's own rotary module: forced on
    here (CPU), the gathered values equal the module's at the same positions and the output stays the base's."""
    from medusa_options import KernelOptions

    backbone, kernels = meralion_medusa.backbone, meralion_medusa.options.kernels
    meralion_medusa.set_options(kernels=KernelOptions(rope_table_devices=("cpu",)))
    rng = random.Random(5)
    for index in range(4):
        inputs = make_inputs(meralion_medusa, rng, rng.randint(1, 2))
        expected = meralion_medusa.generate(**inputs, use_medusa=False, max_new_tokens=10)
        randomize_heads(meralion_medusa, index)
        assert torch.equal(meralion_medusa.generate(**inputs, draft="chain", max_new_tokens=10), expected)
        assert backbone._rope_table is not None  # (made by the prefill)
    hidden = torch.zeros(2, 3, backbone.hidden_size)
    positions = torch.tensor([[0, 7, 700], [5, 6, 4000]])
    for gathered, computed in zip(backbone._rotary(hidden, positions), backbone.model.rotary_emb(hidden, positions)):
        assert torch.equal(gathered, computed)
    meralion_medusa.set_options(kernels=kernels)
    meralion_medusa.generate(**inputs, draft="chain", max_new_tokens=1)  # back to computed cos/sin
    assert backbone._rope_table is None
