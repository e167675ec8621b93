"""The speech encoder's residual stream laid out contiguously (``backbone.encoder_output``): the library's own
values, bit for bit, with every layer receiving a contiguous stream."""

import torch

from backbone import _contiguous_first_argument, backs, encoder_output, fused_attention_projections


def tiny_encoder(layers: int = 2):
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    config = WhisperConfig(d_model=32, encoder_layers=layers, encoder_attention_heads=2, encoder_ffn_dim=64,
                           num_mel_bins=80, max_source_positions=1500)
    return WhisperEncoder(config).eval()


def stream_layouts(encoder, run) -> list[bool]:
    """Whether each layer's norm received a contiguous stream during ``run()``."""
    seen = []
    handles = [layer.self_attn_layer_norm.register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
               for layer in encoder.layers]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return seen


@torch.no_grad()
def test_the_encoder_gives_the_librarys_values_with_a_contiguous_stream():
    encoder = tiny_encoder()
    features = torch.randn(2, 80, 3000)
    want = encoder(features).last_hidden_state
    got = encoder_output(encoder, features)
    assert torch.equal(got, want)
    assert stream_layouts(encoder, lambda: encoder(features)) == [False, False]  # the library's own layout
    assert stream_layouts(encoder, lambda: encoder_output(encoder, features)) == [True, True]
    assert not encoder.layers[0]._forward_pre_hooks  # nothing left on the base's module


def test_a_stream_passed_by_name_is_made_contiguous_too():
    stream = torch.randn(2, 32, 1500).transpose(1, 2)
    args, kwargs = _contiguous_first_argument(None, (), {"hidden_states": stream, "attention_mask": None})
    assert args == () and kwargs["hidden_states"].is_contiguous() and torch.equal(kwargs["hidden_states"], stream)
    assert _contiguous_first_argument(None, (), {}) is None


@torch.no_grad()
def test_a_cpu_encoder_runs_one_attention_product_a_layer_with_the_librarys_values():
    encoder = tiny_encoder()
    features = torch.randn(1, 80, 3000)
    want = encoder(features).last_hidden_state
    assert torch.equal(encoder_output(encoder, features), want)  # bit for bit, the fused product's columns included
    attn = encoder.layers[0].self_attn
    fused_weight = attn._medusa_fused_qkv[0]
    assert backs(fused_weight, attn.q_proj) and attn.k_proj.weight.data_ptr() > fused_weight.data_ptr()
    assert not any("forward" in vars(linear) for layer in encoder.layers
                   for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj))
    assert torch.equal(encoder(features).last_hidden_state, want)  # the library's own forward, on the fused views
    assert torch.equal(encoder_output(encoder, features), want)  # fused once, kept


def test_the_projections_stay_the_librarys_where_they_cannot_share_a_product():
    encoder = tiny_encoder().to(torch.float64)
    with fused_attention_projections(encoder):
        assert not any("forward" in vars(layer.self_attn.q_proj) for layer in encoder.layers)
    assert not hasattr(encoder.layers[0].self_attn, "_medusa_fused_qkv")
