"""What "lossless in bfloat16" means, as a check.

Verifying several tokens in one decoder pass sums in another order than the base's one-token steps, so
two logits that are equal to within bf16 rounding may come out in the other order. Medusa's output must
therefore equal the base's own bf16 greedy output, except that it may leave it at a position where the
base itself had a near-tie: there the base's top-2 logits were within ``TIE_ULPS`` units in the last
place of bf16, and Medusa took the other one of the tied tokens. Everything before that position must be
identical; after it the two continuations are different texts and nothing more is required.
"""

from __future__ import annotations

import math

import torch

TIE_ULPS = 2  # one rounding in each of the two computations
BF16_MANTISSA_BITS = 7


def bf16_ulp(value: float) -> float:
    """Spacing of bfloat16 numbers next to ``value``."""
    magnitude = max(abs(value), 2.0**-126)
    return 2.0 ** (math.floor(math.log2(magnitude)) - BF16_MANTISSA_BITS)


def first_divergence(expected: list[int], got: list[int]) -> int | None:
    for index, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return index
    return None if len(expected) == len(got) else min(len(expected), len(got))


def check_bf16_row(expected: list[int], got: list[int], step_scores: list[torch.Tensor]) -> str | None:
    """None when ``got`` is the base's bf16 greedy row ``expected`` or leaves it only at a base near-tie;
    otherwise a message saying where and by how much. ``step_scores[i]`` are the base's own processed
    scores [V] when it chose ``expected[i]`` (``generate(output_scores=True)``)."""
    index = first_divergence(expected, got)
    if index is None:
        return None
    if index >= len(expected) or index >= len(got):
        return f"one output stops early at {index} without a differing token (lengths {len(expected)}/{len(got)})"
    if index >= len(step_scores):
        return f"diverges at new token {index}, past the {len(step_scores)} steps the base's scores cover (not checked)"
    scores = step_scores[index].float()
    best = float(scores.max())
    taken = float(scores[got[index]])
    tolerance = TIE_ULPS * bf16_ulp(best)
    if best - taken <= tolerance:
        return None
    return (f"diverges at new token {index}: base {expected[index]} (score {best:.5g}), Medusa {got[index]} "
            f"(score {taken:.5g}); margin {best - taken:.3g} exceeds the bf16 tie tolerance {tolerance:.3g}")


def check_bf16_batch(expected_rows: list[list[int]], got_rows: list[list[int]], scores) -> list[str]:
    """``scores``: the base's per-step score tensors [B, V] (``generate(...).scores``). Returns the
    problems found (empty: lossless under the bf16 near-tie rule)."""
    problems = []
    for row, (expected, got) in enumerate(zip(expected_rows, got_rows)):
        problem = check_bf16_row(expected, got, [step[row] for step in scores[: len(expected)]])
        if problem:
            problems.append(f"row {row}: {problem}")
    return problems
