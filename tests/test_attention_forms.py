"""MERaLiON-2's grouped-query attention in its two forms (query heads as rows of one product, or the cache broadcast
over them: what compiled rounds run) against a reference that repeats every key/value head for its query heads."""

import pytest
import torch

from backbone_meralion2 import grouped_attention


def reference(query, keys, values, mask, scaling, softcap):
    groups = query.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    scores = query @ keys.transpose(-1, -2) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    probs = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)
    out = probs @ values
    return out.transpose(1, 2).flatten(2)


@pytest.mark.parametrize("broadcast_cache", [False, True])
@pytest.mark.parametrize("batch,heads,kv_heads,n,softcap", [(1, 8, 4, 1, 50.0), (3, 8, 2, 5, None), (2, 4, 4, 17, 30.0)])
def test_grouped_attention_equals_attention_with_repeated_heads(broadcast_cache, batch, heads, kv_heads, n, softcap):
    torch.manual_seed(n)
    dim, length = 16, 40
    # query heads as a verify pass makes them: [B, T, H, D] transposed to [B, H, T, D] (not contiguous)
    query = torch.randn(batch, n, heads, dim).transpose(1, 2)
    cache = torch.randn(2, batch, kv_heads, 64, dim)
    keys, values = cache[0, :, :, :length], cache[1, :, :, :length]  # slices of a larger cache, as in decoding
    mask = torch.rand(batch, 1, n, length) < 0.7
    mask[..., 0] = True  # every query sees at least one key
    got = grouped_attention(query, keys, values, mask, 0.25, softcap, broadcast_cache=broadcast_cache)
    assert got.shape == (batch, n, heads * dim)
    assert torch.allclose(got, reference(query, keys, values, mask, 0.25, softcap), atol=1e-5, rtol=1e-5)
