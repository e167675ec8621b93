"""Replaying a drafter on recorded greedy transcripts gives exactly the tokens per round generate
measures: how head variants and draft trees are compared without running the base."""

import random

import pytest

from conftest import requires_transformers5
from oracle import OracleDrafter, randomize_heads
from tiny_models import build_tiny_whisper, random_features

pytestmark = requires_transformers5


@pytest.mark.parametrize("kind", ["medusa", "path", "oracle"])
def test_replayed_tokens_per_round_equal_generate(kind, tmp_path_factory):
    from configuration_medusa import MedusaConfig
    from draft_trees import DraftTree
    from modeling_medusa import MedusaForASR
    from pipeline.acceptance import Recording, tokens_per_round

    fresh = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path_factory.mktemp("replay"), seed=5)))
    config = MedusaConfig(**{**fresh.config.to_dict(), "head_kind": "path" if kind == "path" else "medusa",
                             "speech_attention": kind == "path"})
    model = MedusaForASR(config, base=fresh.base, processor=fresh.processor).eval()
    randomize_heads(model, 2, std=0.4)
    rng = random.Random(3)
    clips = [random_features(1, rng.randint(0, 999)) for _ in range(6)]
    if kind == "oracle":  # drafts the true continuation 70 % of the time: long acceptances happen
        rows = [row for f in clips for row in model.collect_hidden_states(input_features=f, max_new_tokens=40)]
        model.drafter = OracleDrafter(model, rows, model.backbone.vocab_size, 0.3, seed=1)
    for draft in (DraftTree.chain(3), DraftTree.from_paths([[0], [1], [2], [0, 0], [1, 0], [0, 0, 0], [0, 1]])):
        recordings, emitted, row_rounds = [], 0, 0
        for features in clips:
            (tokens, hiddens), = model.collect_hidden_states(input_features=features, max_new_tokens=30)
            speech = model.backbone.speech_memory(model.backbone.prefill(
                {"input_features": features}, 30, 1, model.backbone.make_logits_processor(None))[0])
            recordings.append(Recording(tokens, hiddens, (speech[0][0], speech[1][0])))
            _, stats = model.generate(input_features=features, max_new_tokens=30, draft=[list(p) for p in draft.paths],
                                      return_stats=True, cuda_graph=False)
            emitted += stats["emitted_tokens"]
            row_rounds += stats["row_rounds"]
        replay = tokens_per_round(model.make_drafter(draft, "cpu"), draft, recordings)
        assert (replay["tokens"], replay["rounds"]) == (emitted, row_rounds)
        if kind == "oracle":
            assert replay["tokens_per_round"] > 1.5
