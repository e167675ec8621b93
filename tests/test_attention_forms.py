"""MERaLiON-2's grouped-query attention in its two forms (query heads as rows of one product, or the cache broadcast
over them: what compiled rounds run) against a reference that repeats every key/value head for its query heads."""

import json

import pytest
import torch

from backbone_meralion2 import grouped_attention
from conftest import ROOT


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the folded form runs on a CUDA GPU in half precision")
@pytest.mark.parametrize("batch,heads,n", [(1, 6, 1), (1, 6, 2), (1, 6, 33), (4, 6, 17), (4, 6, 33), (64, 6, 17),
                                           (4, 8, 65)])
def test_attention_to_the_speech_folds_queries_into_heads_without_changing_it(batch, heads, n):
    """attend_memory: queries folded into grouped-query heads (or FlashAttention where cpu_kernels.folds_queries
    says no: 4 x 8 heads x 65) give SDPA's attention, [B, heads, n, D] as a verify pass makes it."""
    from cpu_kernels import attend_memory

    torch.manual_seed(n)
    query = torch.randn(batch, n, heads, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    keys, values = (torch.randn(batch, heads, 1500, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    want = torch.nn.functional.scaled_dot_product_attention(query.float(), keys.float(), values.float(), scale=0.125)
    got = attend_memory(query, keys, values, scale=0.125)
    assert got.shape == query.shape
    assert torch.allclose(got.float(), want, atol=2e-3, rtol=2e-2)


def test_the_folding_rule_picks_the_faster_form_measured_on_the_gpu():
    """cpu_kernels.folds_queries against the committed timings of both forms (tools.memory_attention): wherever one
    form was clearly the faster (by more than a tenth), the rule picks it."""
    from cpu_kernels import folds_queries

    rows = json.loads((ROOT / "benchmarks/round_cost/h100_memory_attention_batches.json").read_text())["rows"]
    clear = [r for r in rows if r["queries"] > 1 and abs(r["folded"]["us"] / r["flash"]["us"] - 1) > 0.1]
    assert len(clear) >= 20
    for r in clear:
        assert folds_queries(r["batch"], r["heads"], r["queries"]) == (r["folded"]["us"] < r["flash"]["us"]), r


@pytest.mark.parametrize("batch,heads,n,length", [(1, 6, 1, 1500), (1, 6, 5, 1500), (2, 8, 33, 1500), (1, 4, 3, 100),
                                                  (1, 2, 4, 97)])
def test_float32_attention_to_the_speech_sums_slices_of_frames_to_the_same_result(batch, heads, n, length):
    """The float32 GPU form of attend_memory (sums over slices of the frames, then added): the same attention as
    SDPA's, whatever the length (a prime length runs as one product). Checked here on the CPU: the form is plain
    tensor arithmetic, the device only chooses it."""
    from cpu_kernels import _attend_memory_float32, _memory_chunks

    torch.manual_seed(n + length)
    query = torch.randn(batch, heads, n, 64)
    keys, values = torch.randn(batch, heads, length, 64), torch.randn(batch, heads, length, 64)
    got = _attend_memory_float32(query, keys, values, 0.125)
    want = torch.nn.functional.scaled_dot_product_attention(query, keys, values, scale=0.125)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-5)
    assert _memory_chunks(1500) == 15 and _memory_chunks(97) == 1


def test_float32_attention_to_the_speech_traces_as_one_graph():
    """A compiled float32 GPU round runs this form: a graph break inside it left the whole decoder pass eager
    (unfused layer norms and adds in the round's kernels). Dynamo traces the same Python on the CPU."""
    import torch._dynamo

    from cpu_kernels import _attend_memory_float32

    query, keys, values = torch.randn(1, 6, 5, 64), torch.randn(1, 6, 1500, 64), torch.randn(1, 6, 1500, 64)
    explained = torch._dynamo.explain(_attend_memory_float32)(query, keys, values, 0.125)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
