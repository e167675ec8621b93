"""Tokens per round of a drafter, replayed exactly on recorded greedy transcripts.

Greedy decoding is deterministic, so a round that starts after token ``t`` of a recorded transcript
(hidden state ``hiddens[t]``, which produced ``tokens[t]``) drafts from exactly what the live decoder would
have, and accepts the longest tree path equal to ``tokens[t+1:]``; the next round starts after the last
emitted token. Replaying that over held-out recordings gives the tokens per round ``generate`` would
measure on the same audio, without running the base: how variants and tree shapes are compared and how
an exported artifact records what each draft buys (``draft_candidates``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Recording:
    """One utterance as recorded by collect: tokens [T] (EOS included), hiddens [T, H] (``hiddens[i]``
    produced ``tokens[i]``), and optionally the speech memory (keys, values [heads, L, D]) of its call."""

    tokens: torch.Tensor
    hiddens: torch.Tensor
    speech: tuple | None = None


class _ReplayState:
    """The part of a decode state a drafter reads: the root's hidden and token, the speech memory."""

    def __init__(self, hidden, next_token, speech):
        self.hidden, self.next_token = hidden, next_token
        self.extra = {"cross_keys": speech[0][None], "cross_values": speech[1][None]} if speech else {}
        self.speech_frames = None  # every frame, as the heads were trained


def accepted_drafts(chunk: torch.Tensor, truth: torch.Tensor, tt) -> torch.Tensor:
    """chunk [B, N] drafted tree tokens (root first), truth [B, depth] the recorded continuation (-1 past
    the end) -> accepted draft count per row: the depth of the deepest node whose whole path matches."""
    depths = tt.depths  # [N]
    expected = torch.where(depths[None, :] > 0, truth.gather(1, (depths - 1).clamp(min=0)[None].expand(len(chunk), -1)),
                           chunk[:, :1].expand(-1, len(depths)))
    correct = chunk == expected  # root trivially
    on_path = (correct[:, None, :] | ~tt.ancestors[None]).all(dim=-1)
    return torch.where(on_path, depths[None, :], torch.zeros_like(depths)[None, :]).max(dim=-1).values


@torch.no_grad()
def tokens_per_round(drafter, tree, recordings: list[Recording], batch_size: int = 256,
                     device: str | torch.device = "cpu", dtype=None, round_ends: bool = False) -> dict:
    """Replay ``drafter`` (``drafter(state) -> chunk [B, N]`` for ``tree``) over ``recordings``.

    Returns ``{"tokens_per_round", "rounds", "tokens", "per_recording": [tokens/round, ...], "rounds_per_recording",
    "tokens_per_recording"}``; tokens are those the rounds emit (the first token is the prefill's, not a round's). With
    ``round_ends``, also ``"round_ends"``: per recording, the index of the token each round's base emitted itself."""
    tt = tree.tensors(device)
    rounds_per, tokens_per, ends_per = [], [], []
    for start in range(0, len(recordings), batch_size):
        group = recordings[start:start + batch_size]
        r, t, e = _replay_group(drafter, tree, tt, group, device, dtype, round_ends)
        rounds_per += r
        tokens_per += t
        ends_per += e
    rounds, tokens = sum(rounds_per), sum(tokens_per)
    return {"tokens_per_round": tokens / rounds if rounds else 0.0, "rounds": rounds, "tokens": tokens,
            "per_recording": [t / r if r else None for t, r in zip(tokens_per, rounds_per)],
            "rounds_per_recording": rounds_per, "tokens_per_recording": tokens_per,
            **({"round_ends": ends_per} if round_ends else {})}


def _replay_group(drafter, tree, tt, group, device, dtype, round_ends: bool = False):
    lengths = torch.tensor([len(rec.tokens) for rec in group], device=device)
    longest = int(lengths.max())
    tokens = torch.full((len(group), longest + tree.depth + 1), -1, dtype=torch.long, device=device)
    hiddens = torch.zeros(len(group), longest, group[0].hiddens.shape[-1], device=device,
                          dtype=dtype or group[0].hiddens.dtype)
    for i, rec in enumerate(group):
        tokens[i, :len(rec.tokens)] = rec.tokens.to(device)
        hiddens[i, :len(rec.tokens)] = rec.hiddens.to(device, hiddens.dtype)
    speech = None
    if group[0].speech is not None:
        speech = tuple(torch.stack([rec.speech[j] for rec in group]).to(device, hiddens.dtype) for j in range(2))
    position = torch.zeros(len(group), dtype=torch.long, device=device)
    rounds = torch.zeros(len(group), dtype=torch.long, device=device)
    rows = torch.arange(len(group), device=device)
    offsets = torch.arange(1, tree.depth + 1, device=device)
    ends = [[] for _ in group]
    while True:
        active = position < lengths - 1  # the last recorded token (EOS or the limit) ends the row
        if not bool(active.any()):
            break
        live = rows[active]
        at = position[live]
        state = _ReplayState(hiddens[live, at], tokens[live, at],
                             (speech[0][live], speech[1][live]) if speech else None)
        chunk = drafter(state) if tree.num_nodes > 1 else tokens[live, at][:, None]
        truth = tokens[live[:, None], at[:, None] + offsets[None, :]]
        accepted = accepted_drafts(chunk, truth, tt) if tree.num_nodes > 1 else torch.zeros_like(at)
        remaining = lengths[live] - 1 - at  # tokens still to emit; a round never emits past the end
        position[live] = at + torch.minimum(accepted + 1, remaining)
        rounds[live] += 1
        if round_ends:  # (a host sync a round: for analysis only)
            for row, end in zip(live.tolist(), position[live].tolist()):
                ends[row].append(end)
    return rounds.tolist(), (lengths - 1).tolist(), ends
