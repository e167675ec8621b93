"""Drafting from heads: which token lands on which tree node, for both kinds of heads."""

import pytest
import torch

from draft_trees import DraftTree
from kv_cache import DecodeState
from medusa_heads import DraftProjection, MedusaDrafter, PathDrafter, PathHeads

VOCAB, HIDDEN = 32, 8
TREE = DraftTree.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0]])


class CountingBackbone:
    """An output projection whose logits for state s rank token (s[0] + r + 1) % V at rank r: a head whose
    state carries the parent's token id then drafts ``parent + rank + 1``."""

    def __init__(self):
        weight = torch.zeros(VOCAB, HIDDEN)
        self.output_projection = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        self.output_projection.weight.data = weight

    def embed(self, tokens):  # the token id itself, in every component
        return tokens[..., None].float().expand(*tokens.shape, HIDDEN)


def expected_counting_tokens(root: int) -> list[int]:
    """Node with rank path (r1, ..., rd) holds root + sum(r_i + 1)."""
    return [root] + [(root + sum(r + 1 for r in path)) % VOCAB for path in TREE.paths]


def test_path_drafter_gives_every_node_its_own_continuation():
    backbone = CountingBackbone()
    heads = PathHeads(num_heads=3, num_layers=1, hidden_size=HIDDEN)

    class Counting(torch.nn.Module):  # a block that puts its node's token id in the state
        def forward(self, state, token_embedding, speech=None):
            return token_embedding

    heads.blocks = torch.nn.ModuleList(Counting() for _ in range(3))

    class Projection(DraftProjection):
        def logits(self, states):  # token t + r + 1 at rank r
            ids = torch.arange(VOCAB)
            distance = (ids - states[..., :1].long() - 1) % VOCAB
            return -distance.float()

    drafter = PathDrafter(TREE, "cpu", heads, Projection(backbone, None), backbone.embed)
    roots = torch.tensor([3, 5])
    state = DecodeState(cache=None, lengths=None, first_slot=None, hidden=torch.zeros(2, HIDDEN), next_token=roots)
    chunk = drafter(state)
    assert chunk[0].tolist() == expected_counting_tokens(3)
    assert chunk[1].tolist() == expected_counting_tokens(5)


def test_medusa_drafter_puts_head_d_rank_r_on_the_nodes_at_depth_d_plus_1():
    logits = torch.zeros(1, 3, VOCAB)
    for head in range(3):
        for rank in range(3):
            logits[0, head, 10 * head + rank] = 10.0 - rank
    drafter = MedusaDrafter(TREE, "cpu", lambda hidden: logits)
    state = DecodeState(cache=None, lengths=None, first_slot=None, hidden=torch.zeros(1, HIDDEN),
                        next_token=torch.tensor([7]))
    chunk = drafter(state)[0].tolist()
    assert chunk == [7] + [10 * (len(path) - 1) + path[-1] for path in TREE.paths]


def test_draft_projection_maps_draft_vocabulary_indices_to_token_ids():
    backbone = CountingBackbone()
    backbone.output_projection.weight.data = torch.randn(VOCAB, HIDDEN)
    ids = torch.tensor([4, 9, 17, 30])
    projection = DraftProjection(backbone, ids)
    states = torch.randn(5, HIDDEN)
    full = states @ backbone.output_projection.weight.T
    assert torch.allclose(projection.logits(states), full[:, ids])
    best = projection.token_ids(projection.logits(states).argmax(-1))
    assert torch.equal(best, ids[full[:, ids].argmax(-1)])


def test_best_indices_are_topk_best_first_for_every_k():
    """Iterated argmax (k <= 8) and torch.topk (beyond) give the same indices, best first."""
    from medusa_heads import ITERATED_ARGMAX_MAX_K, best_indices

    logits = torch.randn(2, 3, 500, generator=torch.Generator().manual_seed(0))  # distinct values: no ties
    for k in range(1, ITERATED_ARGMAX_MAX_K + 3):
        assert torch.equal(best_indices(logits, k), logits.topk(k, dim=-1).indices), k


def test_blocked_best_indices_equal_iterated_argmax_ties_and_ragged_blocks_included():
    """The blocked search compiled GPU rounds use over a wide vocabulary: the same indices in the same order as k
    argmax passes, lowest index first among equal logits, also where the last block holds fewer than k tokens."""
    from medusa_heads import blocked_best_indices, iterated_argmax

    generator = torch.Generator().manual_seed(0)
    for vocab in (641, 777, 4096):  # 641 = 10 blocks of 64 + 1 token
        ties = torch.randint(0, 6, (2, 3, vocab), generator=generator).float()
        distinct = torch.randn(2, 3, vocab, generator=generator)
        for k in range(1, 9):
            assert torch.equal(blocked_best_indices(ties, k, 64), iterated_argmax(ties, k)), (vocab, k)
            half = distinct.bfloat16()  # (bf16's ties too)
            assert torch.equal(blocked_best_indices(half, k, 64), iterated_argmax(half, k)), (vocab, k)
            assert torch.equal(blocked_best_indices(distinct, k, 64), distinct.topk(k, dim=-1).indices), (vocab, k)
    compiled = torch.compile(blocked_best_indices, dynamic=False)
    assert torch.equal(compiled(ties, 4, 64), iterated_argmax(ties, 4))


def test_int8_drafting_copy_keeps_the_heads_outputs_within_int8_rounding_and_leaves_them_as_they_are():
    from medusa_heads import Int8Linear, int8_drafting_copy, int8_drafting_supported

    if not int8_drafting_supported("cpu"):
        pytest.skip("this torch has no CPU int8 weight-only kernel")
    torch.manual_seed(0)
    heads = PathHeads(num_heads=2, num_layers=1, hidden_size=64, speech_heads=4)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.1)
    frozen = int8_drafting_copy(heads)
    assert all(isinstance(m, Int8Linear) for m in frozen.modules() if "Linear" in type(m).__name__)
    assert all(isinstance(m, torch.nn.Linear) for m in heads.modules() if "Linear" in type(m).__name__)
    hidden, tokens = torch.randn(1, 3, 64), torch.randn(1, 3, 2, 64)
    speech = (torch.randn(1, 4, 50, 16), torch.randn(1, 4, 50, 16))
    with torch.no_grad():
        exact, approximate = heads.teacher_forced(hidden, tokens, speech), frozen.teacher_forced(hidden, tokens, speech)
    assert (approximate - exact).norm() / exact.norm() < 0.02  # bf16 activations, int8 weights


def test_int8_draft_projection_ranks_like_the_float_projection():
    from medusa_heads import int8_drafting_supported

    if not int8_drafting_supported("cpu"):
        pytest.skip("this torch has no CPU int8 weight-only kernel")
    backbone = CountingBackbone()
    backbone.output_projection.weight.data = torch.randn(VOCAB, HIDDEN)
    ids = torch.tensor([4, 9, 17, 30, 2, 11, 23, 5])
    states = torch.randn(50, HIDDEN)
    exact = DraftProjection(backbone, ids).logits(states)
    approximate = DraftProjection(backbone, ids, int8=True).logits(states)
    assert (approximate - exact).abs().max() < 0.05 * exact.abs().max()
    assert (approximate.argmax(-1) == exact.argmax(-1)).float().mean() > 0.9


def test_padded_projection_rows_give_the_same_logits_in_the_first_columns():
    """A GPU projection with a vocabulary that is not a multiple of 8 multiplies a padded copy (aligned
    rows for cuBLAS); its first ``vocab`` columns are the logits."""
    from cpu_kernels import pad_rows

    weight, bias, hidden = torch.randn(51, 16), torch.randn(51), torch.randn(3, 16)
    padded_weight, padded_bias = pad_rows(weight, bias, 64)
    assert padded_weight.shape == (64, 16) and padded_bias.shape == (64,)
    assert not padded_weight[51:].any() and not padded_bias[51:].any()
    logits = torch.nn.functional.linear(hidden, padded_weight, padded_bias)[..., :51]
    assert torch.allclose(logits, torch.nn.functional.linear(hidden, weight, bias))
    assert pad_rows(weight, None, 64)[1] is None


def test_padded_projection_returns_contiguous_logits_off_the_cpu():
    """The logits a padded (GPU) projection returns are contiguous: suppression rules fill ids with
    index_fill, whose decomposition copies a strided input into a fresh tensor, and a compiled round's
    functional graph rejects that copy. The meta device takes the non-CPU path without a GPU."""
    from cpu_kernels import Projection

    weight = torch.empty(51865, 16, device="meta")
    projection = Projection(lambda: weight)
    assert projection.prepare()[0].shape == (51904, 16)
    with torch.no_grad():
        for rows in (1, 17):
            logits = projection(torch.empty(1, rows, 16, device="meta"))
            assert logits.shape == (1, rows, 51865) and logits.stride() == (rows * 51865, 51865, 1)


def test_int8_matmul_takes_any_width_and_several_rows():
    """torch's CPU int8 kernel needs a width that is a multiple of 16 for several bf16 rows (it crashed on an
    AVX-512 AMD CPU otherwise): the rows are padded with zero columns, which change nothing."""
    from medusa_heads import int8_drafting_supported, int8_matmul, int8_rows

    if not int8_drafting_supported("cpu"):
        pytest.skip("this torch has no CPU int8 weight-only kernel")
    for width in (8, 24, 392):
        weight, x = torch.randn(40, width), torch.randn(5, width)
        rows, scales = int8_rows(weight)
        assert rows.shape[1] % 16 == 0
        dequantised = rows[:, :width].float() * scales.float()[:, None]
        expected = x.to(torch.bfloat16).float() @ dequantised.T
        assert torch.allclose(int8_matmul(x, rows, scales), expected, rtol=2e-2, atol=2e-2 * expected.abs().max())


@pytest.mark.parametrize("tree", [TREE, DraftTree.chain(3)], ids=["tree", "chain"])
@pytest.mark.parametrize("seed", range(3))
def test_fused_path_drafter_drafts_what_the_path_drafter_drafts(tree, seed):
    """FusedPathWeights' rearranged products (block-diagonal query + stack, [Wo; W1 Wo], token tables, the next
    merge's state half on the projection) give the PathDrafter's drafts (float32, random heads and speech)."""
    from medusa_heads import FusedPathDrafter, FusedPathWeights

    torch.manual_seed(seed)
    vocab, hidden = 64, 16
    heads = PathHeads(num_heads=3, num_layers=2, hidden_size=hidden, speech_heads=2)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.3)

    class Backbone:
        output_projection = torch.nn.Linear(hidden, vocab, bias=False)
        embedding = torch.nn.Embedding(vocab, hidden)

        def embed(self, tokens):
            return self.embedding(tokens)

    backbone = Backbone()
    vocab_ids = torch.randperm(vocab)[:24]
    projection = DraftProjection(backbone, vocab_ids)
    memory = tuple(torch.randn(2, 2, 30, hidden // 2) for _ in range(2))
    state = DecodeState(cache=None, lengths=None, first_slot=None, hidden=torch.randn(2, hidden),
                        next_token=torch.tensor([3, 40]))
    with torch.no_grad():
        weights = FusedPathWeights(heads, projection.weight(), vocab_ids, backbone.embed)
        plain = PathDrafter(tree, "cpu", heads, projection, backbone.embed, lambda s: memory)(state)
        fused = FusedPathDrafter(tree, "cpu", heads, projection, backbone.embed, lambda s: memory, weights)(state)
    assert FusedPathWeights.supports(heads, vocab_ids) and not FusedPathWeights.supports(heads, None)
    assert torch.equal(fused, plain)
