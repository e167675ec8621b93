"""Hierarchical speculative decoding, SpecMQuant's scheme for 4-bit targets: on 4-bit weights one verify pass
costs more the more tokens it carries (``benchmarks/quantised``), so a Medusa tree stops paying there. Instead, a
small 16-bit *intermediate* model of the same family (same tokenizer, same prompt) runs Medusa rounds with its own
heads and its own tree, where verification is cheap, and the tokens it emits go to the 4-bit *target* as one
chain of ``gamma`` drafts. The target keeps the longest prefix equal to its own argmax and adds its own next
token, exactly as in a Medusa round, so the output is the target's greedy output whatever the intermediate
drafts; the intermediate then rewinds to what the target kept.

The intermediate's and the target's state live in their own caches (``CapturedRounds`` each, one CUDA graph per
round on a GPU). Between target passes the host reads one small result per round, as ``run_rounds`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kv_cache import DecodeState
from medusa_decoding import MedusaStats, finished, record_round
from medusa_fast import CapturedRounds


def slots_past_max_new(gamma: int, tree) -> tuple[int, int]:
    """Cache slots past the prompt and ``max_new_tokens`` that the (target, intermediate) may write, which are also
    the output indices the intermediate may reach past ``max_new_tokens``: the target's last pass may overshoot by
    ``gamma`` tokens and writes ``gamma`` + 1; the intermediate runs up to ``gamma`` + depth + 1 tokens past the
    target, then writes a whole tree."""
    return 2 * gamma + 2, 2 * gamma + tree.depth + tree.num_nodes + 2


class ChainFromBuffer:
    """The target's drafter: the root (the target's own last token) and the ``gamma`` tokens the intermediate
    emitted after it, copied into ``tokens`` before each target pass."""

    def __init__(self, batch: int, gamma: int, device):
        self.tokens = torch.zeros(batch, gamma, dtype=torch.long, device=device)

    def __call__(self, state: DecodeState) -> torch.Tensor:
        return torch.cat([state.next_token[:, None], self.tokens], dim=1)


class IntermediateRounds(CapturedRounds):
    """The intermediate's Medusa rounds, which also keep every emitted token and the hidden state of its
    position, by token index, so that after the target's verdict the heads draft again from the position the
    target kept (``follow``). Slot ``i`` of ``tokens_at`` holds token ``i`` of the output (0: the prefill's
    first token); slot ``i + 1`` of ``hidden_at`` the hidden state that token ``i`` produced (slot 0: the
    prompt's last)."""

    def __init__(self, backbone, drafter, process_logits, state: DecodeState, tree, max_tokens: int, **kwargs):
        batch, hidden_size = state.hidden.shape
        device = state.hidden.device
        self.tokens_at = torch.zeros(batch, max_tokens + 1, dtype=torch.long, device=device)
        self.hidden_at = torch.zeros(batch, max_tokens + 2, hidden_size, dtype=state.hidden.dtype, device=device)
        self.prompt_lengths = state.lengths.clone()
        self.hidden_at[:, 0].copy_(state.hidden)
        super().__init__(backbone, drafter, process_logits, state, tree, **kwargs)

    def _advance(self, step):
        rows = torch.arange(step.emitted.shape[0], device=step.emitted.device)[:, None]
        index = self.num_generated[:, None] + torch.arange(step.path.shape[1], device=step.path.device)[None, :]
        index = torch.where(self.active[:, None], index, self.tokens_at.shape[1] - 1)  # frozen rows: a spare slot
        index = index.clamp(max=self.tokens_at.shape[1] - 1)
        # the tokens in output order: the accepted drafts, then the model's own next token (slots past it are
        # overwritten when reached)
        own_next = torch.arange(step.emitted.shape[1], device=index.device)[None, :] == step.accepted[:, None]
        self.tokens_at[rows, index] = torch.where(own_next, step.emitted[:, -1:], step.emitted)
        self.hidden_at[rows, index] = step.hidden[rows, step.path]
        super()._advance(step)

    def load(self, state: DecodeState):
        super().load(state)
        self.prompt_lengths.copy_(state.lengths)
        self.hidden_at[:, 0].copy_(state.hidden)

    def drafts(self, confirmed: torch.Tensor, gamma: int) -> torch.Tensor:
        """The ``gamma`` tokens emitted after the first ``confirmed`` [B] tokens."""
        index = confirmed[:, None] + torch.arange(gamma, device=confirmed.device)[None, :]
        return self.tokens_at.gather(1, index.clamp(max=self.tokens_at.shape[1] - 1))

    def follow(self, target: CapturedRounds):
        """Rewind to the target's output: the first ``target.num_generated`` tokens are the target's, of which
        all but the last are in this cache already (``run_hierarchical`` sends only drafts it has cached)."""
        confirmed, st = target.num_generated, self.state
        self.num_generated.copy_(confirmed)
        st.lengths.copy_(self.prompt_lengths + confirmed - 1)
        st.next_token.copy_(target.state.next_token)
        st.hidden.copy_(self.hidden_at[torch.arange(confirmed.shape[0], device=confirmed.device), confirmed - 1])


@dataclass
class HierarchicalStats(MedusaStats):
    """``rounds`` are the target's verify passes; ``intermediate_rounds`` the intermediate's."""

    intermediate_rounds: int = 0

    def as_dict(self) -> dict:
        rounds = self.rounds or 1
        return {**super().as_dict(), "intermediate_rounds": self.intermediate_rounds,
                "intermediate_rounds_per_target_pass": self.intermediate_rounds / rounds}


def check_pair(target: CapturedRounds, intermediate: CapturedRounds):
    """The two models must share a vocabulary and the per-row rules' history must be empty (the intermediate
    rewinds its cache and counts, not a rules history)."""
    if target.backbone.vocab_size != intermediate.backbone.vocab_size:
        raise ValueError(f"hierarchical decoding needs one vocabulary: target {target.backbone.vocab_size} tokens, "
                         f"intermediate {intermediate.backbone.vocab_size}")
    if target.state.history or intermediate.state.history:
        raise ValueError("hierarchical decoding supports logits rules without a per-row history "
                         "(e.g. not Whisper's timestamp rules)")


def run_hierarchical(target: CapturedRounds, intermediate: IntermediateRounds, first_tokens: list[int],
                     max_new_tokens: int, eos_token_ids, stats: HierarchicalStats | None = None) -> list[list[int]]:
    """Greedy decoding of the target after both prefills (both runners ``load``ed; ``target.drafter`` a
    ``ChainFromBuffer``): the intermediate runs rounds until every live row has emitted ``gamma`` + 1 tokens past
    the target's, so the ``gamma`` it sends are all in its cache; one target pass verifies them as a chain; the
    intermediate follows. Returns the target's greedy tokens per row, as ``run_rounds`` does."""
    check_pair(target, intermediate)
    stats = stats if stats is not None else HierarchicalStats()
    gamma = target.tree.depth
    eos = set(int(e) for e in eos_token_ids)
    outputs = [[int(t)] for t in first_tokens]
    active = [not finished(o, eos, max_new_tokens) for o in outputs]
    intermediate.follow(target)
    while any(active):
        ahead = [0] * len(outputs)
        while min(a for a, live in zip(ahead, active) if live) < gamma + 1:
            result = intermediate.step(active)
            stats.intermediate_rounds += 1
            ahead = [a + (r + 1 if live else 0) for a, r, live in zip(ahead, result.accepted, active)]
        target.drafter.tokens.copy_(intermediate.drafts(target.num_generated, gamma))
        result = target.step(active)
        stats.rounds += 1
        for row, live in enumerate(active):
            if live:
                record_round(outputs[row], result.accepted[row], result.emitted[row], eos, max_new_tokens, stats)
                active[row] = not finished(outputs[row], eos, max_new_tokens)
        intermediate.follow(target)
    stats.new_tokens += sum(len(o) for o in outputs)
    return outputs
