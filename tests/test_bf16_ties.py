"""The bf16 near-tie rule itself: it accepts a divergence at a base near-tie and nothing else."""

import pytest
import torch

from conftest import requires_transformers5
from tools.bf16_ties import bf16_ulp, check_bf16_row


def scores_with(top: float, runner_up: float, vocab: int = 8) -> torch.Tensor:
    scores = torch.full((vocab,), -10.0)
    scores[3], scores[5] = top, runner_up
    return scores


def test_identical_rows_pass():
    assert check_bf16_row([1, 2, 3], [1, 2, 3], [scores_with(1, 0)] * 3) is None


def test_divergence_at_an_exact_bf16_tie_passes():
    step = scores_with(9.0625, 9.0625)
    assert check_bf16_row([7, 3, 1], [7, 5, 2], [scores_with(1, 0), step, scores_with(1, 0)]) is None


def test_divergence_within_two_ulps_passes_and_beyond_fails():
    ulp = bf16_ulp(9.0)
    assert check_bf16_row([3], [5], [scores_with(9.0, 9.0 - 2 * ulp)]) is None
    problem = check_bf16_row([3], [5], [scores_with(9.0, 9.0 - 3 * ulp)])
    assert problem and "exceeds the bf16 tie tolerance" in problem


def test_a_token_outside_the_near_tie_fails():
    problem = check_bf16_row([3, 4], [6, 4], [scores_with(9.0, 9.0), scores_with(1, 0)])
    assert problem and "diverges at new token 0" in problem


def test_stopping_early_without_a_different_token_fails():
    assert "stops early" in check_bf16_row([3, 4], [3], [scores_with(1, 0)] * 2)


def test_a_divergence_past_the_base_scores_is_reported_unchecked_not_passed():
    """Where the base's scores do not reach the divergence (seen with Whisper's timestamped generate on the
    H200: its rows and its scores do not line up), the row counts as left, not as a near-tie."""
    problem = check_bf16_row([3, 4, 5], [3, 4, 6], [scores_with(1, 0)] * 2)
    assert problem and "not checked" in problem


@requires_transformers5
@pytest.mark.parametrize("timestamps, seed", [(False, 2), (True, 1)])
def test_the_benchmark_reads_the_base_scores_of_the_tokens_it_chose(tmp_path, timestamps, seed):
    """The bf16 check compares each row with the base's scores at the same new token: with Whisper timestamps the
    base's generate returns them inside its segments, window by window (here two windows of 30 s), and they must be
    read there (with the timestamp options of the call being checked): each step's best score is the token the base
    chose."""
    from tiny_models import build_tiny_whisper, random_features
    from tools.benchmark import base_step_scores
    from transformers import WhisperForConditionalGeneration

    folder = build_tiny_whisper(tmp_path, seed=seed, timestamps=1501 if timestamps else 0, timestamp_scale=0.7)
    base = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    options = {"return_timestamps": True} if timestamps else {}
    features = random_features(2, 0)
    sequences = base.generate(input_features=features, max_new_tokens=20, **options)
    result = base.generate(input_features=features, max_new_tokens=20, output_scores=True,
                           return_dict_in_generate=True, **options)
    scores = base_step_scores(result, 2)
    for row, tokens in zip(scores, sequences.tolist()):
        while tokens and tokens[-1] == base.generation_config.pad_token_id:  # a shorter row is padded
            tokens.pop()
        chosen = min(len(row), len(tokens))  # (the scores may also hold the EOS step, which the sequences leave out)
        assert chosen >= 12
        assert [int(step.argmax()) for step in row[:chosen]] == tokens[:chosen]
