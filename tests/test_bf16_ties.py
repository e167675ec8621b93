"""The bf16 near-tie rule itself: it accepts a divergence at a base near-tie and nothing else."""

import torch

from pipeline.bf16_ties import bf16_ulp, check_bf16_row


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
