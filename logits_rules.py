"""The base generate's logits processors as vectorised rules over a verify chunk, so the argmax at every
draft-tree node is the base's own choice (token suppression, min_new_tokens; Whisper's timestamp rules
live in its backbone)."""

from __future__ import annotations

import functools

from dataclasses import dataclass

import torch

try:
    from .draft_trees import TreeTensors
except ImportError:
    from draft_trees import TreeTensors


# --------------------------------------------------------------------------- logits rules


@dataclass
class ChunkPath:
    """What a logits rule may read about the tokens before each chunk node: the chunk itself (root = the last
    emitted token, then drafts), the tree it forms, and the per-row history the rules keep in the state."""

    tokens: torch.Tensor  # [B, N]
    tree: "TreeTensors"
    history: dict  # name -> [B] tensors (see LogitsRules.start)
    num_generated: torch.Tensor  # [B, N] tokens generated before the one each node predicts

    @property
    def parent_tokens(self) -> torch.Tensor:
        return self.tokens[:, self.tree.parents]

    def path_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens from the root to each node [B, N, depth+1], and which of them are generated tokens of this
        call on that node's path [B, N, depth+1] (the root is not one when nothing was generated yet)."""
        steps = torch.arange(self.tree.path_nodes.shape[1], device=self.tokens.device)
        on_path = steps[None, :] <= self.tree.depths[:, None]  # [N, D+1]
        root_generated = self.num_generated - self.tree.depths[None, :]  # [B, N]: generated up to the root
        generated = on_path[None] & (root_generated[..., None] + steps >= 1)
        return self.tokens[:, self.tree.path_nodes], generated


class LogitsRules:
    """The base generate's logits processors as one vectorised function over a verify chunk:
    ``rules(logits [B, T, V], num_generated [B, T], path) -> logits``. Rules that look back at the emitted
    tokens keep a small per-row history in ``DecodeState.history`` (fixed shapes, on the device, no host
    sync), made by ``start`` and carried over the accepted path by ``advance``. ``key`` names everything
    the rules depend on: a kept fixed-shape round is reused only for equal keys."""

    key: tuple = ()
    # whether the rules only block tokens (set them to -inf) and change no other logit: the base's argmax can then
    # be found through a screen of the output projection (cpu_kernels.ScreenedArgmax)
    masks_only: bool = False

    def __call__(self, logits: torch.Tensor, num_generated: torch.Tensor, path: ChunkPath | None = None):
        return logits

    def screen_parts(self):
        """``(masks, begin, finish)`` when the base's argmax can be found through a screen of the output
        projection: ``masks(logits, num_generated, path)`` only blocks tokens (in place where it can: it returns the
        blocked logits, ``logits`` itself or a new tensor), and ``finish`` (None: nothing) is a
        rule applied after them to each row alone, ``finish(logits [R, V])``, that blocks every token below
        ``begin`` or none (Whisper's "a timestamp where the timestamps' total probability beats every text
        token"); None when the rules are not of that form."""
        return (self, None, None) if self.masks_only else None

    def start(self, batch: int, device) -> dict:
        return {}

    def advance(self, path: ChunkPath, best: torch.Tensor) -> dict:
        """The history after the round that accepted the path to ``best`` [B]."""
        return path.history

    def hint_drafts(self, chunk: torch.Tensor, history: dict) -> torch.Tensor:
        """The drafted chunk [B, N] with node 1 (the root's first child) replaced in the rows where these rules
        know the next token better than the heads; here none. Only a draft: verification decides."""
        return chunk


class ChainedRules(LogitsRules):
    """Rules applied in order, as the base applies its list of processors."""

    def __init__(self, *rules: LogitsRules):
        self.rules = rules
        self.key = tuple(rule.key for rule in rules)
        self.masks_only = all(rule.masks_only for rule in rules)

    def __call__(self, logits, num_generated, path=None):
        for rule in self.rules:
            logits = rule(logits, num_generated, path)
        return logits

    def screen_parts(self):
        return self._screen_parts

    @functools.cached_property
    def _screen_parts(self):  # (asked every round: the rules do not change)
        parts = [rule.screen_parts() for rule in self.rules]
        if any(part is None for part in parts) or any(part[2] is not None for part in parts[:-1]):
            return None  # (a row-local rule can be screened only where it comes last)

        def masks(logits, num_generated, path=None):
            for mask, _, _ in parts:
                logits = mask(logits, num_generated, path)
            return logits

        return masks, parts[-1][1], parts[-1][2]

    def start(self, batch, device) -> dict:
        return {name: value for rule in self.rules for name, value in rule.start(batch, device).items()}

    def advance(self, path, best) -> dict:
        return {name: value for rule in self.rules for name, value in rule.advance(path, best).items()}

    def hint_drafts(self, chunk, history):
        for rule in self.rules:
            chunk = rule.hint_drafts(chunk, history)
        return chunk


class SuppressionRules(LogitsRules):
    """The base generate's token-blocking processors: ``always`` ids are never chosen, ``at_begin`` ids not
    as the first token, EOS not before ``min_new_tokens`` (``num_generated[b, t]`` counts the tokens generated
    before the one chunk row t predicts). Blocked ids are written in place (a few ids, not a
    pass over the vocabulary)."""

    masks_only = True

    def __init__(self, vocab: int, device, eos_token_ids, min_new_tokens=None, always=None, at_begin=None):
        ids = [_valid_ids(token_ids, vocab) for token_ids in (always, at_begin, eos_token_ids)]
        self.suppress, self.begin, self.eos = (device_ids(i, torch.device(device)) for i in ids)
        self.min_new_tokens = min_new_tokens
        self.key = ("suppress", *ids, min_new_tokens)

    def __call__(self, logits, num_generated, path=None):
        return self.block_in_place(logits.clone(), num_generated, path)

    def screen_parts(self):
        # (the screen's scores are the screen's own: blocking them in place saves copies of a vocabulary per row)
        return self.block_in_place, None, None

    def block_in_place(self, logits, num_generated, path=None):
        """What ``self(logits, ...)`` returns, written into ``logits`` itself (returned)."""
        if self.suppress.numel():
            logits.index_fill_(-1, self.suppress, float("-inf"))
        if self.begin.numel():
            _block_where_(logits, self.begin, num_generated == 0)
        if self.min_new_tokens and self.eos.numel():
            _block_where_(logits, self.eos, num_generated < self.min_new_tokens)
        return logits


def _block_where_(logits: torch.Tensor, ids: torch.Tensor, where: torch.Tensor) -> None:
    """-inf for ``ids`` at the positions ``where`` [...] holds, in place (an index put: ``scatter_`` copies a
    strided ``logits``, such as the screen's, to a contiguous tensor and back)."""
    logits[..., ids] = torch.where(where[..., None], float("-inf"), logits[..., ids])


def _valid_ids(token_ids, vocab: int) -> tuple[int, ...]:
    return tuple(sorted({int(t) for t in (token_ids or []) if 0 <= int(t) < vocab}))


@functools.lru_cache(maxsize=64)
def device_ids(ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``ids`` on ``device``, made once and shared (never written): every call builds its rules and prompt, and on a
    GPU a tensor made from host values is a copy that first waits for all the work queued before it."""
    return torch.tensor(ids, dtype=torch.long, device=device)
