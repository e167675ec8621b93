"""Draft functions for property tests: random heads, and an oracle that drafts the true continuation."""

from __future__ import annotations

import torch


def randomize_heads(model, seed: int, std: float = 0.3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.medusa_heads.named_parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * std)


class OracleDrafter:
    """Drafts the base's own greedy continuation, found by matching the hidden state against the
    states recorded by a plain greedy run; ``error_rate`` corrupts each draft independently. Its output
    depends on the hidden state only (the noise is seeded by the recorded state it matched), so it drafts
    the same tokens whenever it sees the same state."""

    def __init__(self, model, rows, vocab_size: int, error_rate: float = 0.0, seed: int = 0):
        self.keys, self.futures = [], []
        for tokens, hiddens in rows:
            for t in range(len(tokens)):
                self.keys.append(hiddens[t].float())
                self.futures.append(tokens[t + 1:].tolist())
        self.keys = torch.stack(self.keys)
        self.num_heads = model.config.medusa_num_heads
        self.vocab_size = vocab_size
        self.error_rate = error_rate
        self.seed = seed

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., K, V]"""
        flat = hidden.reshape(-1, hidden.shape[-1])
        nearest = torch.cdist(flat.float(), self.keys).argmin(dim=1).tolist()
        logits = torch.empty(flat.shape[0], self.num_heads, self.vocab_size)
        for row, key in enumerate(nearest):
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + key)
            logits[row] = torch.randn(self.num_heads, self.vocab_size, generator=gen)
            future = self.futures[key]
            for head in range(min(self.num_heads, len(future))):
                if torch.rand((), generator=gen) >= self.error_rate:
                    logits[row, head, future[head]] = 1e4
        return logits.reshape(*hidden.shape[:-1], self.num_heads, self.vocab_size).to(hidden.device, hidden.dtype)
