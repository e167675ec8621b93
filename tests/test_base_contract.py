"""Medusa keeps the base model's contract: it honours the base's generation config (or hands the call to the
base's own generate), refuses what the base refuses, and its Gemma2 forward is the library's. Runs in both
suites: Whisper under transformers 5.x, the MERaLiON-2 stand-in under 4.51."""

import types
import warnings

import numpy as np
import pytest
import torch

from conftest import transformers_below_452
from tiny_models import build_tiny_whisper, random_features

FAMILY = "meralion2" if transformers_below_452() else "whisper"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from modeling_medusa import MedusaForASR

    if FAMILY == "meralion2":
        from standin import build_meralion2_standin

        folder = build_meralion2_standin(tmp_path_factory.mktemp("m2") / "standin", seed=0)
    else:
        folder = build_tiny_whisper(tmp_path_factory.mktemp("whisper"), seed=1)
    return MedusaForASR.from_base(str(folder), family=FAMILY, trust_base_remote_code=True)


@pytest.fixture(scope="module")
def inputs(model):
    if FAMILY == "whisper":
        return {"input_features": random_features(2, 3)}
    audios = [(np.random.default_rng(i).standard_normal(16000 * s) * 0.1).astype(np.float32)
              for i, s in ((0, 3), (1, 11))]
    return model.prepare_audio_inputs(audios)


@pytest.fixture(scope="module")
def greedy(model, inputs):
    """The base's plain greedy output, new tokens only."""
    out = model.base.generate(**inputs, max_new_tokens=NEW_TOKENS)
    return out[:, inputs["input_ids"].shape[1]:] if FAMILY == "meralion2" else out


# (setting, value for the base's generation_config, whether Medusa must hand the call to the base's generate).
# "first"/"second" stand for the first two tokens of the base's greedy output, so the setting can change it.
HANDED_OVER = [("do_sample", True), ("num_beams", 3), ("repetition_penalty", 1.5), ("no_repeat_ngram_size", 1),
               ("bad_words_ids", [["second"]]), ("sequence_bias", {("first",): -30.0}), ("forced_eos_token_id", "eos"),
               ("exponential_decay_length_penalty", (2, 1.5)), ("min_length", 200)]
if FAMILY == "meralion2":  # its decoder applies no token suppression
    HANDED_OVER += [("suppress_tokens", ["second"]), ("begin_suppress_tokens", ["first"])]
KEPT = [("length_penalty", 3.0), ("temperature", 0.5), ("top_k", 3), ("top_p", 0.5)]  # greedy search ignores them
if FAMILY == "whisper":  # decoded by Medusa inside the base's own timestamp-aware generate
    KEPT += [("return_timestamps", True)]
SETTINGS = [(name, value, True) for name, value in HANDED_OVER] + [(name, value, False) for name, value in KEPT]


def resolve(value, greedy):
    """``value`` with the placeholders replaced by token ids."""
    ids = {"first": int(greedy[0, 0]), "second": int(greedy[0, 1]), "eos": 112 if FAMILY == "whisper" else 1}
    if isinstance(value, str):
        return ids.get(value, value)
    if isinstance(value, list):
        return [resolve(v, greedy) for v in value]
    if isinstance(value, dict):
        return {tuple(resolve(k, greedy) for k in key): v for key, v in value.items()}
    return value


def generate_both(model, inputs, **kwargs):
    """(Medusa's output, the warnings it gave, the base's own output), both drawn from the same random state."""
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = model.generate(**inputs, max_new_tokens=NEW_TOKENS, **kwargs)
    torch.manual_seed(0)
    expected = model.base.generate(**inputs, max_new_tokens=NEW_TOKENS, **kwargs)
    return got, [str(w.message) for w in caught if "Medusa decoding does not support" in str(w.message)], expected


@pytest.mark.parametrize("name, value, handed_over", SETTINGS, ids=[name for name, _, _ in SETTINGS])
def test_settings_in_the_base_generation_config_are_honoured(model, inputs, greedy, name, value, handed_over):
    config = model.base.generation_config
    before = getattr(config, name, None)
    setattr(config, name, resolve(value, greedy))
    try:
        got, fallbacks, expected = generate_both(model, inputs)
    finally:
        setattr(config, name, before)
    assert torch.equal(got, expected), f"{name}={value!r}: Medusa {got.tolist()} base {expected.tolist()}"
    if handed_over:
        assert len(fallbacks) == 1 and f"{name}=" in fallbacks[0] and "generation_config" in fallbacks[0]
    else:
        assert fallbacks == []


@pytest.mark.skipif(FAMILY != "whisper", reason="Whisper's own generate arguments")
@pytest.mark.parametrize("kwargs", [{"temperature": 0.7}, {"suppress_tokens": ["second"]}, {"repetition_penalty": 1.5}],
                         ids=["temperature", "suppress_tokens", "repetition_penalty"])
def test_whisper_call_settings_are_honoured(model, inputs, greedy, kwargs):
    """Whisper samples when its temperature argument is above 0 (whatever do_sample says); a call's own
    suppress_tokens replaces the config's ones the decoder applies."""
    kwargs = {k: resolve(v, greedy) for k, v in kwargs.items()}
    got, fallbacks, expected = generate_both(model, inputs, **kwargs)
    assert torch.equal(got, expected) and not torch.equal(expected, greedy)
    (name,) = kwargs
    assert len(fallbacks) == 1 and f"{name}=" in fallbacks[0]


@pytest.mark.parametrize("max_new_tokens", [0, -1])
def test_max_new_tokens_below_one_is_refused_like_the_base(model, inputs, max_new_tokens):
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.base.generate(**inputs, max_new_tokens=max_new_tokens)
    for use_medusa in (True, False):
        with pytest.raises(ValueError, match="max_new_tokens"):
            model.generate(**inputs, max_new_tokens=max_new_tokens, use_medusa=use_medusa)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.collect_hidden_states(**inputs, max_new_tokens=max_new_tokens)


def test_gemma2_decoder_forward_matches_the_library():
    """Our cache-owning Gemma2 forward (MERaLiON-2's text decoder) against the library's own Gemma2ForCausalLM
    on this transformers version: same logits, past the sliding window (5.x's embedding scales itself, 4.x's
    model scales after the lookup: scaled once either way)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, GenerationConfig

    from backbone_meralion2 import MERaLiON2Backbone
    from kv_cache import DecodeState, StaticKVCache

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                          sliding_window=4, final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
    config._attn_implementation = "eager"  # SDPA would drop the attention soft-cap
    lm = Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in lm.named_parameters():
            param.normal_(0.0, 0.2 if "norm" in name else param.shape[-1] ** -0.5)
    base = types.SimpleNamespace(text_decoder=lm, config=types.SimpleNamespace(text_config=config),
                                 generation_config=GenerationConfig(eos_token_id=1), device=torch.device("cpu"))
    backbone = MERaLiON2Backbone(base)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    zeros = torch.zeros(2, dtype=torch.long)
    state = DecodeState(StaticKVCache(2, 2, 2, 12, 8, torch.float32, "cpu"), zeros, zeros.clone(), hidden=None,
                        next_token=None)
    with torch.no_grad():
        ours = backbone.logits(backbone.decode(state, tokens, torch.arange(12), torch.ones(12, 12).tril().bool(), 12))
        theirs = lm(input_ids=tokens, use_cache=False).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
