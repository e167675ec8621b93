"""Tiny random-weight base models built locally (no network) for the tests."""

from __future__ import annotations

from pathlib import Path

import torch

WHISPER_VOCAB = 120  # ids: 0..111 text, 112 eot, 113 sot, then English-only: 116 notimestamps;
# multilingual: 114 <|en|>, 115 <|fr|>, 116 transcribe, 117 translate, 118 notimestamps


def build_tiny_whisper(folder: Path, seed: int = 0, logit_scale: float = 4.0, multilingual: bool = False,
                       hub_prompt: bool = False, timestamps: int = 0, timestamp_scale: float = 1.0,
                       width: int = 32) -> Path:
    """A 2-layer random Whisper saved with its generation config (English-only layout by default), ``width``
    wide (its feed-forward layers twice that).

    ``timestamps`` > 0: that many timestamp tokens right after <|notimestamps|> end the vocabulary (0 keeps
    the 120-token layout, whose last ids double as a few timestamps); ``timestamp_scale`` scales their output
    rows, so that text and timestamps both win now and then."""
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    eot, sot = 112, 113
    notimestamps = 118 if multilingual else 116
    vocab_size = notimestamps + 1 + timestamps if timestamps else WHISPER_VOCAB
    config = WhisperConfig(
        vocab_size=vocab_size, d_model=width, encoder_layers=1, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=2 * width, decoder_ffn_dim=2 * width,
        num_mel_bins=80, max_source_positions=1500, max_target_positions=64,
        decoder_start_token_id=sot, eos_token_id=eot, pad_token_id=eot, bos_token_id=eot,
        tie_word_embeddings=False,  # untied: a tied random model just repeats its last input token
    )
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # larger output scale: clear argmax margins, varied continuations
        for name, param in model.model.named_parameters():
            if ".layers." in name and param.dim() == 2:  # unit-gain layers: audio really steers the text
                param.normal_(0.0, param.shape[1] ** -0.5)
        model.model.decoder.embed_tokens.weight.normal_(0.0, 1.0)
        model.proj_out.weight.normal_(0.0, logit_scale / config.d_model**0.5)
        model.proj_out.weight[eot] *= 1.15  # EOS now and then, so stopping inside drafts is exercised
        if timestamps:
            model.proj_out.weight[notimestamps + 1:] *= timestamp_scale
    # hub_prompt: the legacy forced ids of the Hub's multilingual configs (detect the language, then transcribe)
    languages = {"lang_to_id": {"<|en|>": 114, "<|fr|>": 115}, "task_to_id": {"transcribe": 116, "translate": 117},
                 "forced_decoder_ids": [[1, None], [2, 116]] if hub_prompt else None,
                 } if multilingual else {"forced_decoder_ids": [[1, notimestamps]]}
    model.generation_config = GenerationConfig(
        decoder_start_token_id=sot, eos_token_id=eot, pad_token_id=eot, bos_token_id=eot,
        no_timestamps_token_id=notimestamps, max_length=64, suppress_tokens=[3, 5],
        begin_suppress_tokens=[eot, 7], is_multilingual=multilingual, **languages,
    )
    model.save_pretrained(folder)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(folder)
    return Path(folder)


def random_features(batch: int, seed: int, mel_bins: int = 80) -> torch.Tensor:
    """Per-row spectral shapes plus noise: plain noise averages out in cross-attention."""
    gen = torch.Generator().manual_seed(seed)
    shape = torch.randn(batch, mel_bins, 1, generator=gen) * 2.0
    return shape + 0.5 * torch.randn(batch, mel_bins, 3000, generator=gen)


def build_tiny_w4a16_whisper(folder: Path, seed: int = 0, group_size: int = 16) -> Path:
    """``build_tiny_whisper`` saved as a compressed-tensors W4A16 checkpoint (the format llm-compressor's GPTQ
    writes: 4-bit symmetric weights in groups, packed; ``proj_out`` kept dense), with round-to-nearest scales
    from compressed-tensors' own ``calculate_qparams`` (GPTQ itself needs llm-compressor, which pins an older
    transformers: pipeline.quantise)."""
    import shutil

    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 apply_quantization_config)
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import WhisperForConditionalGeneration

    dense = build_tiny_whisper(folder / "dense", seed=seed)
    model = WhisperForConditionalGeneration.from_pretrained(dense)
    weights = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size)
    scheme = QuantizationScheme(targets=["Linear"], weights=weights)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["proj_out"],
                                                        format="pack-quantized"))
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:
            groups = module.weight.detach().view(module.weight.shape[0], -1, group_size)
            scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), weights)
            module.weight_scale.data.copy_(scale.view_as(module.weight_scale))
            module.weight_zero_point.data.copy_(zero_point.view_as(module.weight_zero_point))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    out = folder / "w4a16"
    model.save_pretrained(out)
    compressor.update_config(str(out))
    for name in ("generation_config.json", "preprocessor_config.json"):
        if (dense / name).exists():
            shutil.copyfile(dense / name, out / name)
    return out
