"""The speech encoder's residual stream laid out contiguously (``backbone.encoder_output``): the library's own
values, bit for bit, with every layer receiving a contiguous stream."""

import torch

from backbone import _contiguous_first_argument, encoder_output


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
def test_a_compiled_encoder_output_traces_as_one_graph():
    """Compiled (the MERaLiON-2 prompt pass compiles ``encoder_output``), registering the layout hook broke the graph
    and left the function eager; there Inductor lays the stream out itself."""
    import torch._dynamo

    encoder, features = tiny_encoder(), torch.randn(1, 80, 3000)
    torch._dynamo.reset()
    compiled = torch.compile(encoder_output, backend="eager", fullgraph=True)  # (a graph break raises)
    assert torch.equal(compiled(encoder, features), encoder_output(encoder, features))
    assert not encoder.layers[0]._forward_pre_hooks
