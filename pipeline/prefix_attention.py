"""Prefix attention for path heads (Hydra++'s, an EAGLE-like layer): a training and replay experiment.

One causal self-attention layer over the base's last hidden states of the transcript so far; its output at the
root replaces the base's hidden as the path heads' first state. The decoder does not run it yet (it would keep
this layer's keys and values for every accepted token), so ``pipeline.train --prefix-attention`` measures what it
buys by replay (``pipeline.acceptance``: the states a live decoder would have) and export refuses such heads.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

PREFIX = "prefix."  # the layer's parameter names in a heads checkpoint


class PrefixAttention(nn.Module):
    """h' = h + out(causal attention over norm(h[0..t])); ``out`` zero-initialised, so it starts as the identity."""

    def __init__(self, hidden_size: int, head_width: int = 64):
        super().__init__()
        self.num_heads = max(1, hidden_size // head_width)
        self.norm = nn.LayerNorm(hidden_size)
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, T, H] -> [B, T, H]; position t sees 0..t only (padding after an utterance's end is never seen)."""
        batch, length, width = hidden.shape
        qkv = self.qkv(self.norm(hidden)).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        return hidden + self.out(attended.transpose(1, 2).reshape(batch, length, width))


def root_states(heads: nn.Module, hiddens: torch.Tensor) -> torch.Tensor:
    """The path heads' first states: the base's hiddens, through the heads' prefix attention where they have one."""
    prefix = getattr(heads, "prefix", None)
    return hiddens if prefix is None else prefix(hiddens)


def prefixed_recordings(heads: nn.Module, recordings: list, device, dtype) -> list:
    """``pipeline.acceptance.Recording`` s whose hiddens went through the heads' prefix attention (as is without)."""
    if getattr(heads, "prefix", None) is None:
        return recordings
    return [dataclasses.replace(r, hiddens=heads.prefix(r.hiddens[None].to(device, dtype))[0]) for r in recordings]
