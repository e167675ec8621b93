"""The MERaLiON-2 stand-in (tests/standin.py + tests/meralion2_standin/) is faithful under transformers 4.51.

Checked against docs/meralion2.md: loading through the Auto classes offline with
remote code, config fields, module names and state-dict prefixes, the processor's
chunking and placeholder expansion, the forward's scatter of 100 speech vectors per
30 s chunk (and its placeholder-count errors), and greedy ``generate`` (HybridCache,
left padding) against a cache-free "gold" argmax loop.
"""

import math

import numpy as np
import pytest
import transformers
from packaging.version import Version

if Version(transformers.__version__) >= Version("4.52"):
    pytest.skip(
        f"MERaLiON-2's remote code (and so this stand-in) runs on transformers ~4.51 only; found "
        f"{transformers.__version__} (docs/meralion2.md section 7: HybridCache/mask internals changed or are gone)",
        allow_module_level=True,
    )

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, AutoModelForSpeechSeq2Seq, HybridCache

from standin import (
    BOS_ID,
    END_OF_TURN_ID,
    EOS_ID,
    PAD_ID,
    SAMPLING_RATE,
    build_meralion2_standin,
    load_meralion2_processor,
    make_meralion2_inputs,
)

torch.set_num_threads(1)

CHUNK = 30 * SAMPLING_RATE
PREFIXES = {"speech_encoder", "ln_speech", "speech_audio_adapter", "text_decoder"}


def _audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLING_RATE)) / SAMPLING_RATE
    tone = 0.3 * np.sin(2 * np.pi * (200 + 100 * seed) * t)
    return (tone + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


def _load(folder, **kwargs):
    kwargs.setdefault("attn_implementation", "eager")
    model = AutoModelForSpeechSeq2Seq.from_pretrained(folder, trust_remote_code=True, local_files_only=True, **kwargs)
    return model.eval()


def _gold_greedy(model, batch, max_new_tokens, eos_ids=(EOS_ID, END_OF_TURN_ID)):
    """Cache-free greedy loop: one full forward over prompt + generated tokens per step."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    scores, done = [], torch.zeros(ids.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids,
                input_features=batch["input_features"],
                feature_attention_mask=batch["feature_attention_mask"],
                use_cache=False,
            ).logits[:, -1]
        scores.append(logits)
        nxt = torch.where(done, torch.full_like(done, PAD_ID, dtype=torch.long), logits.argmax(-1))
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(nxt[:, None])], dim=1)
        done |= torch.isin(nxt, torch.tensor(eos_ids))
        if done.all():
            break
    return ids, torch.stack(scores, dim=1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_meralion2_standin(tmp_path_factory.mktemp("meralion2") / "standin", seed=0)


@pytest.fixture(scope="module")
def model(folder):
    return _load(folder)


@pytest.fixture(scope="module")
def processor(folder):
    return load_meralion2_processor(folder)


@pytest.fixture(scope="module")
def batch_1chunk(processor):
    return make_meralion2_inputs(processor, _audio(5.0, seed=1))


# ----------------------------------------------------------------------------- loading & config
def test_loads_through_auto_classes_offline(folder, model, processor):
    assert type(model).__name__ == "MERaLiON2ForConditionalGeneration"
    assert type(model).__module__.startswith("transformers_modules.")  # the folder's own remote code
    assert type(processor).__name__ == "MERaLiON2Processor"
    assert type(processor).__module__.startswith("transformers_modules.")

    config = AutoConfig.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
    assert config.model_type == "meralion2"
    assert config.architectures == ["MERaLiON2ForConditionalGeneration"]
    assert set(config.auto_map) == {"AutoConfig", "AutoModelForSpeechSeq2Seq"}  # no AutoModel, like upstream
    with pytest.raises(ValueError):
        AutoModel.from_pretrained(folder, trust_remote_code=True, local_files_only=True)

    _, info = AutoModelForSpeechSeq2Seq.from_pretrained(
        folder, trust_remote_code=True, local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert list(model.generation_config.eos_token_id) == [EOS_ID, END_OF_TURN_ID]
    assert model.text_decoder.config._attn_implementation == "eager"


def test_default_load_gives_sdpa_which_drops_attention_softcap(folder, model, batch_1chunk):
    """transformers 4.51: without attn_implementation the sub-models get SDPA, which ignores Gemma2's soft-cap."""
    sdpa = _load(folder, attn_implementation=None)
    assert sdpa.config._attn_implementation == "sdpa"
    assert sdpa.text_decoder.config._attn_implementation == "sdpa"
    with torch.no_grad():
        eager_logits = model(**batch_1chunk).logits
        sdpa_logits = sdpa(**batch_1chunk).logits
    assert (eager_logits - sdpa_logits).abs().max() > 1e-2


def test_config_fields(model):
    cfg, text, speech = model.config, model.config.text_config, model.config.speech_config
    assert type(text).__name__ == "Gemma2Config" and type(speech).__name__ == "WhisperConfig"
    assert not cfg.sub_configs  # like upstream: no sub_configs mapping
    assert cfg.speech_mlp_scale_factor == 15
    assert cfg.speech_token_index == text.vocab_size - 1 == 299
    for name in ("sliding_window", "hidden_size", "num_attention_heads", "num_hidden_layers",
                 "num_key_value_heads", "head_dim", "intermediate_size"):
        assert getattr(cfg, name) == getattr(text, name), name
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (32, 4, 4, 2)
    assert (text.head_dim, text.intermediate_size, text.sliding_window) == (8, 64, 16)
    assert text.final_logit_softcapping == 30.0 and text.attn_logit_softcapping == 50.0
    assert text.query_pre_attn_scalar == text.head_dim
    assert text.cache_implementation == "hybrid" and text.use_cache is False
    assert (text.bos_token_id, text.eos_token_id, text.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    assert speech.num_mel_bins == 128 and speech.max_source_positions == 1500 and not speech.scale_embedding


# ----------------------------------------------------------------------------- modules
def test_module_names_and_state_dict_prefixes(folder, model):
    assert [name for name, _ in model.named_children()] == [
        "speech_encoder", "ln_speech", "speech_audio_adapter", "text_decoder"]
    assert type(model.speech_encoder) is transformers.models.whisper.modeling_whisper.WhisperEncoder
    assert type(model.text_decoder) is transformers.models.gemma2.modeling_gemma2.Gemma2ForCausalLM
    assert isinstance(model.ln_speech, torch.nn.LayerNorm)

    d, k, hidden = model.config.speech_config.d_model, 15, model.config.text_config.hidden_size
    adapter = model.speech_audio_adapter
    assert [type(m).__name__ for m in adapter.mlp_adapter] == ["Linear", "SiLU", "Dropout"]
    assert adapter.mlp_adapter[0].weight.shape == (5 * d, k * d)
    assert adapter.gate_proj.weight.shape == adapter.pool_proj.weight.shape == (5 * d, 5 * d)
    assert adapter.out_proj.weight.shape == (hidden, 5 * d)

    decoder = model.text_decoder
    assert {n for n, _ in decoder.model.named_children()} == {"embed_tokens", "layers", "norm", "rotary_emb"}
    for i, layer in enumerate(decoder.model.layers):  # sliding window on even layers
        assert layer.is_sliding == (i % 2 == 0)
        assert layer.self_attn.sliding_window == (16 if i % 2 == 0 else None)

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert {key.split(".")[0] for key in saved} == PREFIXES
    assert {key.split(".")[0] for key in model.state_dict()} == PREFIXES
    assert "text_decoder.lm_head.weight" in saved  # untied by default
    assert not model.text_decoder.config.tie_word_embeddings
    assert model.text_decoder.lm_head.weight.data_ptr() != decoder.model.embed_tokens.weight.data_ptr()
    assert "speech_encoder.conv1.weight" in saved and "speech_encoder.layer_norm.weight" in saved
    assert "speech_audio_adapter.mlp_adapter.0.weight" in saved


def test_tied_embeddings_option(tmp_path):
    folder = build_meralion2_standin(tmp_path / "tied", seed=1, tie_word_embeddings=True, num_hidden_layers=2)
    m, info = AutoModelForSpeechSeq2Seq.from_pretrained(
        folder, trust_remote_code=True, local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert m.text_decoder.lm_head.weight is m.text_decoder.model.embed_tokens.weight
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert not any("lm_head" in key for key in f.keys())


# ----------------------------------------------------------------------------- processor
def test_processor_prompt_and_features(processor, batch_1chunk):
    tok = processor.tokenizer
    assert processor.feature_extractor.feature_size == 128
    assert processor.speech_token == "<SpeechHere>" and processor.speech_token_index == 299
    assert tok.convert_tokens_to_ids(["<bos>", "<eos>", "<pad>", "<end_of_turn>"]) == [BOS_ID, EOS_ID, PAD_ID, 107]

    b = batch_1chunk
    assert b["input_features"].shape == (1, 128, 3000) and b["input_features"].dtype == torch.float32
    assert b["feature_attention_mask"].shape == (1, 3000)
    ids = b["input_ids"][0]
    assert (ids == 299).sum() == 100
    assert ids[0] == BOS_ID and (ids == BOS_ID).sum() == 1  # chat template's bos, add_special_tokens=False
    text = tok.decode(ids)
    expected_user = "Instruction: Transcribe the speech \nFollow the text instruction based on the following audio: "
    assert text == (
        "<bos><start_of_turn>user\n" + expected_user + "<SpeechHere>" * 100 + "<end_of_turn>\n<start_of_turn>model\n"
    )
    # Gemma-like: the tokenizer itself would add a second <bos>
    assert tok("<bos>hi")["input_ids"][:2] == [BOS_ID, BOS_ID]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # normalising the empty extra chunk of an exact 30 s
@pytest.mark.parametrize("seconds, chunks", [(0.5, 1), (29.9, 1), (30.0, 2), (31.0, 2)])
def test_processor_chunking(processor, seconds, chunks):
    """len // 480000 + 1 chunks (an exact multiple of 30 s gets an extra, empty one, as upstream)."""
    out = processor(text="a <SpeechHere> b", audios=_audio(seconds, seed=0), sampling_rate=SAMPLING_RATE)
    assert out["input_features"].shape == (chunks, 128, 3000)
    assert torch.isfinite(out["input_features"]).all()
    assert out["feature_attention_mask"].shape == (chunks, 3000)
    assert int((out["input_ids"] == 299).sum()) == 100 * chunks


def test_processor_caps_at_ten_chunks(processor):
    assert processor.number_chunk_limit == 10
    out = processor(text="<SpeechHere>", audios=np.zeros(10 * CHUNK + 5, np.float32), sampling_rate=SAMPLING_RATE)
    assert out["input_features"].shape[0] == 10 and int((out["input_ids"] == 299).sum()) == 1000


def test_processor_batch_is_left_padded(processor):
    b = make_meralion2_inputs(processor, [_audio(2.0, seed=1), _audio(31.0, seed=2)])
    assert b["input_features"].shape == (3, 128, 3000)  # chunks of both audios, in order
    ids, mask = b["input_ids"], b["attention_mask"]
    assert (ids == 299).sum(-1).tolist() == [100, 200]
    assert mask[0, :100].sum() == 0 and (ids[0, :100] == PAD_ID).all() and mask[0, 100:].all() and mask[1].all()


# ----------------------------------------------------------------------------- forward
def test_forward_shapes_and_speech_scatter(model, batch_1chunk):
    b = batch_1chunk
    seq_len = b["input_ids"].shape[1]
    with torch.no_grad():
        out = model(**b, output_hidden_states=True)
    assert out.logits.shape == (1, seq_len, 300)
    assert len(out.hidden_states) == model.config.text_config.num_hidden_layers + 1
    assert out.logits.abs().max() <= 30.0  # final soft-cap
    with torch.no_grad():
        loss = model(**b, labels=b["input_ids"]).loss  # shifted CE of the text decoder
    ref_loss = torch.nn.functional.cross_entropy(out.logits[0, :-1], b["input_ids"][0, 1:])
    torch.testing.assert_close(loss, ref_loss)

    # Rebuild the speech vectors from the weights: 15 consecutive encoder frames are stacked
    # (frame order), mlp_adapter -> SiLU(gate) * pool -> out_proj; 100 vectors per chunk.
    with torch.no_grad():
        frames = model.ln_speech(model.speech_encoder(b["input_features"]).last_hidden_state)
        assert frames.shape == (1, 1500, model.config.speech_config.d_model)
        stacked = torch.cat([frames[:, j::15] for j in range(15)], dim=-1)
        a = model.speech_audio_adapter
        x = torch.nn.functional.silu(a.mlp_adapter[0](stacked))
        speech = a.out_proj(torch.nn.functional.silu(a.gate_proj(x)) * a.pool_proj(x))
        assert speech.shape == (1, 100, 32)
        torch.testing.assert_close(speech, a(frames))

        embeds = model.text_decoder.get_input_embeddings()(b["input_ids"])
        embeds[b["input_ids"] == 299] = speech.reshape(-1, 32)
        # Gemma2Model scales *all* inputs_embeds (speech included) by sqrt(hidden)
        ref = model.text_decoder(inputs_embeds=embeds, attention_mask=b["attention_mask"]).logits
    torch.testing.assert_close(out.logits, ref)
    assert out.hidden_states[0].sub(embeds * math.sqrt(32)).abs().max() < 1e-4
    torch.testing.assert_close(out.hidden_states[-1], model.text_decoder.model(inputs_embeds=embeds).last_hidden_state)


def test_forward_placeholder_mismatch(model, batch_1chunk):
    b = dict(batch_1chunk)
    ids = b["input_ids"]
    more = ids.clone()
    more[0, -3] = 299  # 101 placeholders for 100 speech vectors
    with pytest.raises(RuntimeError):
        model(**{**b, "input_ids": more})
    fewer = ids.clone()
    fewer[0, (ids[0] == 299).nonzero()[0]] = 50  # 99 placeholders: silently truncated, as upstream
    with torch.no_grad():
        assert model(**{**b, "input_ids": fewer}).logits.shape == (1, ids.shape[1], 300)
    with pytest.raises(AttributeError):  # feature_attention_mask is required with input_features
        model(**{**b, "feature_attention_mask": None})
    with pytest.raises(ValueError):  # the Whisper encoder takes exactly 3000 frames
        model(**{**b, "input_features": b["input_features"][..., :2999]})


# ----------------------------------------------------------------------------- generation
def test_prepare_inputs_for_generation(model, batch_1chunk):
    b = batch_1chunk
    seq_len = b["input_ids"].shape[1]
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), b["attention_mask"]], dim=1)  # 3 left pads
    ids = torch.cat([torch.zeros(1, 3, dtype=torch.long), b["input_ids"]], dim=1)
    cache = HybridCache(model.text_decoder.config, max_batch_size=1, max_cache_len=seq_len + 10, dtype=torch.float32)
    first = model.prepare_inputs_for_generation(
        ids, attention_mask=mask, input_features=b["input_features"], feature_attention_mask=b["feature_attention_mask"],
        past_key_values=cache, cache_position=torch.arange(seq_len + 3), use_cache=True,
    )
    assert first["input_features"] is b["input_features"] and torch.equal(first["input_ids"], ids)
    assert first["position_ids"][0, :4].tolist() == [1, 1, 1, 0]  # cumsum of the mask, pads filled with 1
    assert first["attention_mask"].shape == (1, 1, seq_len + 3, seq_len + 10)  # 4-D, as wide as the cache

    ids2 = torch.cat([ids, torch.tensor([[42]])], dim=1)
    mask2 = torch.cat([mask, torch.ones(1, 1, dtype=torch.long)], dim=1)
    step = model.prepare_inputs_for_generation(
        ids2, attention_mask=mask2, input_features=b["input_features"], feature_attention_mask=b["feature_attention_mask"],
        past_key_values=cache, cache_position=torch.tensor([seq_len + 3]), use_cache=True,
    )
    assert "input_features" not in step and "feature_attention_mask" not in step  # only on the first step
    assert step["input_ids"].tolist() == [[42]] and step["position_ids"].tolist() == [[seq_len]]
    assert step["attention_mask"].shape == (1, 1, 1, seq_len + 10)


def test_generate_equals_cache_free_gold(model, batch_1chunk):
    b = batch_1chunk
    seq_len = b["input_ids"].shape[1]
    assert seq_len > 10 * model.config.sliding_window  # the prompt is far past the window
    with torch.no_grad():
        gen = model.generate(**b, max_new_tokens=24, output_scores=True, return_dict_in_generate=True)
    sequences = gen.sequences
    assert sequences.shape[1] > seq_len and torch.equal(sequences[:, :seq_len], b["input_ids"])  # prompt + new
    gold_ids, gold_scores = _gold_greedy(model, b, 24)
    assert torch.equal(sequences, gold_ids)
    torch.testing.assert_close(torch.stack(gen.scores, 1), gold_scores, atol=1e-4, rtol=1e-4)
    assert len(set(sequences[0, seq_len:].tolist())) > 3  # not degenerate


def test_generate_batch_left_padding(model, processor):
    audios = [_audio(2.0, seed=3), _audio(31.0, seed=4)]  # 1 and 2 chunks -> 100 pad tokens on row 0
    b = make_meralion2_inputs(processor, audios)
    with torch.no_grad():
        gen = model.generate(**b, max_new_tokens=8, output_scores=True, return_dict_in_generate=True)
    gold_ids, gold_scores = _gold_greedy(model, b, 8)
    assert torch.equal(gen.sequences, gold_ids)
    torch.testing.assert_close(torch.stack(gen.scores, 1), gold_scores, atol=1e-4, rtol=1e-4)
    # each row equals the same audio generated alone, without padding
    new = gen.sequences[:, b["input_ids"].shape[1]:]
    for row, audio in enumerate(audios):
        single = make_meralion2_inputs(processor, audio)
        with torch.no_grad():
            alone = model.generate(**single, max_new_tokens=8)[0, single["input_ids"].shape[1]:]
        assert new[row, : alone.shape[0]].tolist() == alone.tolist()


def test_manual_hybridcache_decode_through_text_decoder(model, batch_1chunk):
    """Prefill the full model into a HybridCache, then decode token by token through text_decoder
    with a full-length 2-D mask and explicit cache_position: equals the cache-free gold."""
    b, steps = batch_1chunk, 10
    seq_len = b["input_ids"].shape[1]
    text_cfg = model.text_decoder.config
    cache = HybridCache(text_cfg, max_batch_size=1, max_cache_len=seq_len + steps, dtype=torch.float32)
    gold_ids, gold_scores = _gold_greedy(model, b, steps, eos_ids=())
    with torch.no_grad():
        out = model(**b, past_key_values=cache, use_cache=True, cache_position=torch.arange(seq_len))
        logits = [out.logits[:, -1]]
        tokens = [int(out.logits[0, -1].argmax())]
        for pos in range(seq_len, seq_len + steps - 1):
            out = model.text_decoder(
                input_ids=torch.tensor([[tokens[-1]]]),
                attention_mask=torch.ones(1, pos + 1, dtype=torch.long),
                past_key_values=cache,
                use_cache=True,
                cache_position=torch.tensor([pos]),
            )
            logits.append(out.logits[:, -1])
            tokens.append(int(out.logits[0, -1].argmax()))
    assert tokens == gold_ids[0, seq_len:].tolist()
    torch.testing.assert_close(torch.stack(logits, 1), gold_scores, atol=1e-4, rtol=1e-4)


def test_hybridcache_window_crossed_during_decode_drifts_in_4_51(tmp_path, processor):
    """Documents a transformers 4.51 HybridCache quirk the real model shares: when the prompt is
    *shorter* than the sliding window and decoding crosses it, the sliding layers' rolling buffer
    drops a position one step early (at query position window - 1), so generate drifts from gold.
    With the prompt past the window (the other tests; real 3B: window 4096) it is exact."""
    prompt_len = make_meralion2_inputs(processor, _audio(5.0, seed=1))["input_ids"].shape[1]
    window = prompt_len + 4
    folder = build_meralion2_standin(tmp_path / "w", seed=0, sliding_window=window, num_hidden_layers=2)
    m = _load(folder)
    b = make_meralion2_inputs(processor, _audio(5.0, seed=1))
    with torch.no_grad():
        gen = m.generate(**b, max_new_tokens=8, eos_token_id=None, output_scores=True, return_dict_in_generate=True)
    _, gold_scores = _gold_greedy(m, b, 8, eos_ids=())
    diff = (torch.stack(gen.scores, 1) - gold_scores).abs().amax(dim=(0, 2))
    first_bad = window - 1 - (prompt_len - 1)  # score index whose query sits at position window - 1
    assert diff[:first_bad].max() < 1e-4
    assert diff[first_bad:].max() > 1e-3


def test_full_size_is_the_documented_3b_shape():
    """``python tests/standin.py --shape meralion2-3b``: Whisper-large-v3's encoder and Gemma2's 3B decoder, as
    docs/meralion2.md gives them (every size one the stand-in takes)."""
    from standin import MERALION2_STANDIN_DEFAULTS, full_size_overrides

    sizes = full_size_overrides("meralion2-3b")
    assert set(sizes) <= set(MERALION2_STANDIN_DEFAULTS)
    assert sizes == {"speech_d_model": 1280, "speech_layers": 32, "speech_heads": 20, "speech_ffn_dim": 5120,
                     "vocab_size": 256000, "hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
                     "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216, "sliding_window": 4096,
                     "query_pre_attn_scalar": 256}
