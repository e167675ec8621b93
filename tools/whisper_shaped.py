"""Whisper-large-v3-shaped models with random weights (large-v3: 32 decoder layers; large-v3-turbo: 4), the
library's own ``WhisperForConditionalGeneration`` built on the device, and the replayed acceptance that drives
their drafts: the shipped whisper-base heads' measured per-head top-k (``heads/whisper-base/config.json``), put
on the known continuation as ``tools.meralion2_shaped`` does for MERaLiON-2. What ``benchmark_gpu --shape
whisper-large-v3*`` times; speed only, never draft quality."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tools.meralion2_shaped import rank_profile

LARGE_V3 = {"vocab_size": 51866, "d_model": 1280, "encoder_layers": 32, "encoder_attention_heads": 20,
            "decoder_attention_heads": 20, "encoder_ffn_dim": 5120, "decoder_ffn_dim": 5120, "num_mel_bins": 128,
            "max_source_positions": 1500, "max_target_positions": 448}
SHAPES = {"whisper-large-v3": {"decoder_layers": 32}, "whisper-large-v3-turbo": {"decoder_layers": 4}}
TINY = {"d_model": 64, "encoder_layers": 1, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128, "decoder_ffn_dim": 128}  # ``tiny``: the same code path in seconds on a CPU
# large-v3's special tokens (its tokenizer): <|endoftext|>, <|startoftranscript|>, <|en|>, the tasks, <|notimestamps|>
EOT, SOT, EN, TRANSLATE, TRANSCRIBE, NO_TIMESTAMPS = 50257, 50258, 50259, 50359, 50360, 50364
MEASURED_HEADS = Path(__file__).resolve().parent.parent / "heads" / "whisper-base" / "config.json"
PROFILE = "whisper_base_measured"  # the replayed profile's name in the rows


def whisper_config(shape: str, decoder_layers: int | None = None, tiny: bool = False):
    """The real large-v3 config with ``shape``'s decoder depth (``decoder_layers``: fewer; ``tiny``: small widths
    and one encoder layer, for a smoke test), SDPA attention as the library loads it."""
    from transformers import WhisperConfig

    sizes = {**LARGE_V3, **SHAPES[shape], **(TINY if tiny else {})}
    if decoder_layers:
        sizes["decoder_layers"] = decoder_layers
    config = WhisperConfig(**sizes, decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=EOT, bos_token_id=EOT)
    config._attn_implementation = "sdpa"
    return config


def generation_config():
    """large-v3's generation settings for English transcription without timestamps (the decoder prompt
    <|startoftranscript|><|en|><|transcribe|><|notimestamps|>, as people call it with ``language="en"``)."""
    from transformers import GenerationConfig

    return GenerationConfig(decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=EOT, max_length=448,
                            begin_suppress_tokens=[220, EOT], suppress_tokens=[1, 2, 7, 8, 9, 10, 14, 25, 26, 27],
                            no_timestamps_token_id=NO_TIMESTAMPS, is_multilingual=True, lang_to_id={"<|en|>": EN},
                            task_to_id={"translate": TRANSLATE, "transcribe": TRANSCRIBE}, language="en",
                            task="transcribe", forced_decoder_ids=None)


def build_model(device, dtype, shape: str, decoder_layers: int | None = None, tiny: bool = False):
    """A random-weight ``WhisperForConditionalGeneration`` of ``shape``, made on ``device`` in ``dtype`` (no slow
    CPU initialisation of 1.5 billion parameters)."""
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = WhisperForConditionalGeneration(whisper_config(shape, decoder_layers, tiny))
    finally:
        torch.set_default_dtype(default)
    model = model.to(dtype).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.generation_config = generation_config()
    return model


def decoder_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.model.decoder.parameters())


def make_prompt(model, batch, device) -> dict:
    """One 30 s window of log-mel features per row (random: speed does not depend on them)."""
    return {"input_features": torch.randn(batch, model.config.num_mel_bins, 3000, device=device, dtype=model.dtype)}


def hf_generate(model, inputs: dict, new_tokens: int, cache=None, encoded=None):
    """The library's own Whisper ``generate``, greedy, exactly ``new_tokens`` per row: dynamic cache, or ``cache``
    (``hf_static_cache``, reset here, so that every length replays the decoder step the library compiled for it
    on a GPU). ``encoded``: the encoder's output, given so that the call times the decoder alone."""
    from transformers.modeling_outputs import BaseModelOutput

    kwargs = {}
    if cache is not None:
        cache.reset()
        kwargs["past_key_values"] = cache
    if encoded is not None:
        kwargs["encoder_outputs"] = BaseModelOutput(last_hidden_state=encoded)
    else:
        kwargs["input_features"] = inputs["input_features"]
    return model.generate(**kwargs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                          num_beams=1)


def hf_static_cache(model, capacity: int):
    """One static cache for the decoder's own keys and values (``capacity`` slots) and the cross-attention's
    (one window), as ``cache_implementation="static"`` builds it, made once for every length of a batch size."""
    from transformers import EncoderDecoderCache, StaticCache

    config = model.config.get_text_config(decoder=True)
    return EncoderDecoderCache(StaticCache(config=config, max_cache_len=capacity),
                               StaticCache(config=config, max_cache_len=model.config.max_source_positions))


def measured_profile(path: Path = MEASURED_HEADS, ranks: int = 4):
    """(name, per-head rank probabilities) from an artifact's measured ``head_accuracy.topk``: the shipped
    whisper-base path heads' held-out top-k per head (each head's accuracy given the tokens before it)."""
    accuracy = json.loads(Path(path).read_text())["head_accuracy"]
    return PROFILE, rank_profile([a[0] for a in accuracy["topk"]], accuracy["topk"], ranks)


def measured_rounds(path: Path = MEASURED_HEADS) -> list[dict]:
    """What the real heads' drafts gave, for comparison with the replay's ``tokens_per_round`` (the replay draws each
    head's rank on its own, so it accepts more than the real heads, whose misses come together): per draft size,
    tokens per round on the held-out split and on real speech (``draft_candidates`` of the artifact's config)."""
    candidates = json.loads(Path(path).read_text()).get("draft_candidates", [])
    return [{"nodes": c["nodes"], "held_out": c["tokens_per_round"],
             "real_speech": (c.get("eval_tokens_per_round") or {}).get("collect_real")} for c in candidates]

