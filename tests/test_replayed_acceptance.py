"""The GPU benchmark's replayed acceptance (``tools.meralion2_shaped``; random weights cannot draft): drafts built
from the known continuation at sampled ranks must follow the decode, so a perfect profile accepts every draft and a
zero profile none, and the output stays the base's greedy continuation either way."""

import pytest
import torch

from conftest import requires_transformers5
from tiny_models import build_tiny_whisper, random_features

pytestmark = requires_transformers5


@pytest.mark.parametrize("cost", ["replay", "heads"])
@pytest.mark.parametrize("top1, expect", [(1.0, "all"), (0.0, "none")])
def test_replayed_drafts_follow_the_decode(top1, expect, cost, tmp_path):
    """Also at trained heads' cost (``HeadsCostDrafter``: heads and a draft-vocabulary projection run, the replayed
    ranks written over their logits): the same acceptance."""
    from tools.meralion2_shaped import HeadsCostDrafter, ReplayDrafter, rank_profile
    from draft_trees import DraftTree
    from medusa_decoding import MedusaStats, run_rounds
    from medusa_fast import CapturedRounds
    from medusa_heads import MedusaDrafter
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path, seed=3)))
    backbone, max_new = model.backbone, 24
    features = {"input_features": random_features(1, 4)}
    greedy = model.generate(**features, max_new_tokens=max_new, min_new_tokens=max_new, use_medusa=False)
    process = backbone.make_logits_processor(max_new)
    state, _, _ = backbone.prefill(features, max_new, 10, process)
    continuation = torch.cat([state.next_token[:, None], greedy[:, 1:]], dim=1)
    profile = rank_profile([top1] * 4, [[top1] * 4] * 4)
    if cost == "heads":  # (a draft vocabulary smaller than the base's, so the columns are mapped)
        drafter = HeadsCostDrafter(backbone, continuation, profile, seed=0, draft_vocab=backbone.vocab_size // 2)
        assert len(drafter.vocab_ids) == backbone.vocab_size // 2
    else:
        drafter = ReplayDrafter(backbone, continuation, profile, seed=0)
    tree = DraftTree.chain(4)
    rounds = CapturedRounds(backbone, MedusaDrafter(tree, "cpu", drafter, drafter.token_ids), process, state, tree,
                            use_graph=False, num_generated=drafter.num_generated)
    stats = MedusaStats()
    out = run_rounds(rounds, state.next_token.tolist(), max_new, backbone.eos_token_ids, stats)
    assert out[0] == continuation[0, :max_new].tolist()
    if expect == "all":
        assert stats.rounds == -(-(max_new - 1) // 5)  # every round emits 4 drafts + the base's token
    else:
        assert stats.accepted_tokens == 0
