"""Hierarchical decoding (``tools.hierarchical``, SpecMQuant's scheme): an intermediate model's Medusa rounds draft
a chain that the target verifies. Whatever the intermediate drafts, the output is the target's own greedy
``generate``, float32 exact; an intermediate that agrees with the target has every chain accepted, and the
benchmark's replayed agreement (``ReplayedVerdicts``) behaves as its profile says."""

import pytest

from conftest import requires_transformers5
from tiny_models import build_tiny_whisper, random_features

pytestmark = requires_transformers5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from modeling_medusa import MedusaForASR

    folder = tmp_path_factory.mktemp("hierarchical")
    return {seed: MedusaForASR.from_base(str(build_tiny_whisper(folder / str(seed), seed=seed)), medusa_num_heads=3)
            for seed in (3, 5)}


def decode_pair(target_model, intermediate_model, features, max_new, gamma, tree, min_new=None, replay=None):
    """The target's tokens per row through ``run_hierarchical`` (``replay``: the intermediate's choices)."""
    from medusa_fast import CapturedRounds
    from draft_trees import DraftTree
    from tools.hierarchical import (ChainFromBuffer, HierarchicalStats, IntermediateRounds, run_hierarchical,
                                    slots_past_max_new)
    from tools.meralion2_shaped import ReplayedVerdicts

    target_backbone, intermediate_backbone = target_model.backbone, intermediate_model.backbone
    target_rules = target_backbone.make_logits_processor(min_new)
    intermediate_rules = intermediate_backbone.make_logits_processor(min_new)
    target_extra, intermediate_extra = slots_past_max_new(gamma, tree)
    target_state, _, _ = target_backbone.prefill(features, max_new, target_extra, target_rules)
    intermediate_state, _, _ = intermediate_backbone.prefill(features, max_new, intermediate_extra, intermediate_rules)
    batch = target_state.next_token.shape[0]
    target = CapturedRounds(target_backbone, ChainFromBuffer(batch, gamma, "cpu"), target_rules, target_state,
                            DraftTree.chain(gamma), use_graph=False)
    verdicts = intermediate_backbone if replay is None else ReplayedVerdicts(intermediate_backbone, replay)
    intermediate = IntermediateRounds(verdicts, intermediate_model.make_drafter(tree, "cpu"), intermediate_rules,
                                      intermediate_state, tree, max_new + intermediate_extra, use_graph=False)
    stats = HierarchicalStats()
    out = run_hierarchical(target, intermediate, target_state.next_token.tolist(), max_new,
                           target_backbone.eos_token_ids, stats)
    return out, stats


def assert_equals_generate(out, expected, pad):
    for row, tokens in zip(expected.tolist(), out):
        assert row[: len(tokens)] == tokens
        assert all(t == pad for t in row[len(tokens):])  # a row that stopped at EOS is padded by generate


@pytest.mark.parametrize("batch, gamma, tree", [(1, 2, "chain"), (2, 4, "tree"), (2, 7, "chain")])
@pytest.mark.parametrize("stop_at_eos", [False, True])
def test_the_output_is_the_targets_greedy_whatever_the_intermediate(models, batch, gamma, tree, stop_at_eos):
    from draft_trees import DraftTree

    target, max_new = models[3], 24
    draft = DraftTree.chain(3) if tree == "chain" else DraftTree.from_paths([[0], [1], [0, 0], [1, 0], [0, 0, 0]])
    min_new = None if stop_at_eos else max_new
    for case in range(2):
        features = {"input_features": random_features(batch, 10 * case + batch)}
        expected = target.generate(**features, max_new_tokens=max_new, min_new_tokens=min_new or 0, use_medusa=False)
        for seed, intermediate in models.items():
            out, stats = decode_pair(target, intermediate, features, max_new, gamma, draft, min_new)
            assert_equals_generate(out, expected, target.backbone.pad_token_id)
            if intermediate is target:  # it drafts the target's own tokens: every chain is accepted (a row's
                assert stats.accepted_tokens >= stats.drafted_tokens - gamma * batch  # last may be cut short)
            assert stats.intermediate_rounds >= stats.rounds


def test_models_of_two_vocabularies_are_refused(models, tmp_path):
    from draft_trees import DraftTree
    from modeling_medusa import MedusaForASR

    other = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path, seed=1, timestamps=1501)), medusa_num_heads=3)
    with pytest.raises(ValueError, match="one vocabulary: target 120 tokens, intermediate 1618"):
        decode_pair(models[3], other, {"input_features": random_features(1, 0)}, 8, 2, DraftTree.chain(3), 8)


@pytest.mark.parametrize("agreement", [1.0, 0.0])
def test_replayed_agreement_sets_what_the_target_accepts(models, agreement):
    """The benchmark's intermediate with random weights: its choices replayed from the target's continuation
    (``own_continuation``), so full agreement accepts every draft and none accepts none, the output exact."""
    from draft_trees import DraftTree
    from tools.meralion2_shaped import own_continuation

    target, max_new, gamma = models[3], 20, 3
    features = {"input_features": random_features(1, 7)}
    expected = target.generate(**features, max_new_tokens=max_new, min_new_tokens=max_new, use_medusa=False)
    continuation = expected[:, -max_new:]
    own = own_continuation(continuation, agreement, max_new + 16, target.backbone.vocab_size, seed=1)
    out, stats = decode_pair(target, models[5], features, max_new, gamma, DraftTree.chain(3), max_new, replay=own)
    assert out[0] == continuation[0].tolist()
    if agreement:
        assert stats.accepted_tokens >= stats.drafted_tokens - gamma  # the last pass may be cut short
    else:
        assert stats.accepted_tokens == 0


def test_the_report_compares_the_best_configuration_per_agreement_with_medusa_on_the_target():
    from tools.benchmark_hierarchical_gpu import comparison

    rows = [{"method": "ours_greedy", "draft": "none", "loop_tok_per_s": 100.0, "call_tok_per_s": 80.0, "exact": True},
            {"method": "ours", "draft": "chain-4", "loop_tok_per_s": 200.0, "call_tok_per_s": 150.0, "exact": True},
            {"method": "ours", "draft": "tree-16", "loop_tok_per_s": 300.0, "call_tok_per_s": 200.0, "exact": False}]
    for gamma, rate in ((3, 150.0), (5, 180.0)):
        rows.append({"method": "hierarchical", "draft": f"tree-16 -> chain-{gamma}", "agreement": 0.9,
                     "loop_tok_per_s": rate, "call_tok_per_s": rate / 2, "tokens_per_round": gamma, "exact": True})
    table = comparison(rows)
    assert list(table) == ["0.9"]
    best = table["0.9"]
    assert best["best"] == "tree-16 -> chain-5" and best["medusa_on_target"] == "chain-4"  # a row that left it: out
    assert best["vs_own_greedy_loop"] == 1.8 and best["vs_medusa_on_target_loop"] == 0.9
