"""The preallocated KV cache a decode owns, the decode state around it, and the attention masks over it
(the valid prefix plus each verify-chunk node's ancestors)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


# --------------------------------------------------------------------------- KV cache


class StaticKVCache:
    """Preallocated self-attention K/V for every layer, written by slot, rolled back by length.

    Slot s of row b holds the token at sequence column s (left padding included); the caller
    keeps ``lengths[b]`` = number of valid slots. Rejected drafts are simply overwritten later.
    """

    index_put_when_compiled = True  # a backbone sets each cache's from its KernelOptions.cache_index_put

    def __init__(self, num_layers, batch_size, num_kv_heads, capacity, head_dim, dtype, device):
        shape = (num_layers, batch_size, num_kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor):
        """keys/values [B, Hkv, T, D] go to slots [B, T]."""
        if self.index_put_when_compiled and torch.compiler.is_compiling():
            # Compiled, a scatter into ``self.keys[layer]`` (a view of the whole cache) became copies of the whole
            # cache every few layers (the 3B shape: seven copies of 20 MB a verify pass); one index_put_ into the
            # whole tensor is written in place.
            layers = torch.tensor(layer, device=slots.device)
            index = self._index(layers, slots, keys.shape[0], keys.shape[1], keys.shape[3])
            self.keys.index_put_(index, keys)
            self.values.index_put_(index, values)
            return
        index = slots[:, None, :, None].expand_as(keys)
        self.keys[layer].scatter_(2, index, keys)
        self.values[layer].scatter_(2, index, values)

    @staticmethod
    def _index(layers: torch.Tensor, slots: torch.Tensor, batch: int, heads: int, dim: int) -> tuple:
        """Index tensors of the cache's entries [layers, B, Hkv, slots, D]: ``layers`` a 0-d tensor (one layer: values
        [B, Hkv, T, D]) or one broadcast over all the others (every layer: values [L, B, Hkv, T, D])."""
        device = slots.device
        return (layers, torch.arange(batch, device=device)[:, None, None, None],
                torch.arange(heads, device=device)[None, :, None, None], slots[:, None, :, None],
                torch.arange(dim, device=device)[None, None, None, :])

    def layer(self, layer: int, upto: int):
        return self.keys[layer, :, :, :upto], self.values[layer, :, :, :upto]

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor):
        """Copy slots src -> dst (per row, all layers); used to compact an accepted tree path."""
        n_layers, batch, heads, _, dim = self.keys.shape
        if self.index_put_when_compiled and torch.compiler.is_compiling():
            # (as in ``write``: compiled, the scatter below also copied a whole cache tensor back each round)
            layers = torch.arange(n_layers, device=src_slots.device)[:, None, None, None, None]
            src, dst = (self._index(layers, slots, batch, heads, dim) for slots in (src_slots, dst_slots))
            for buf in (self.keys, self.values):
                buf.index_put_(dst, buf[src])
            return
        src = src_slots[None, :, None, :, None].expand(n_layers, batch, heads, -1, dim)
        dst = dst_slots[None, :, None, :, None].expand(n_layers, batch, heads, -1, dim)
        for buf in (self.keys, self.values):
            buf.scatter_(3, dst, buf.gather(3, src))

    def select_rows(self, rows: torch.Tensor):
        self.keys = self.keys[:, rows]
        self.values = self.values[:, rows]


class CachePool:
    """Keeps one preallocated cache per shape and hands it out again (capacity rounded up), so a
    fixed-shape runner and its captured CUDA graph can serve later calls without re-capture."""

    def __init__(self, granularity: int = 128):
        self.granularity = granularity
        self.caches: dict = {}

    def get(self, num_layers, batch_size, num_kv_heads, capacity, head_dim, dtype, device) -> StaticKVCache:
        key = (num_layers, batch_size, num_kv_heads, head_dim, dtype, str(device))
        cache = self.caches.get(key)
        if cache is None or cache.capacity < capacity:
            rounded = -(-capacity // self.granularity) * self.granularity
            cache = StaticKVCache(num_layers, batch_size, num_kv_heads, rounded, head_dim, dtype, device)
            self.caches[key] = cache
        return cache

    def holds(self, cache: StaticKVCache) -> bool:
        return any(cache is c for c in self.caches.values())


def attention_mask(state: "DecodeState", depths: torch.Tensor, ancestors: torch.Tensor, upto: int,
                   window: int | None = None):
    """Boolean mask [B, 1, T, upto]: the valid prefix plus each chunk node's ancestors.

    With ``window`` (sliding-window layers), a query sees only keys less than ``window`` positions
    back; a chunk node's position is the prefix length plus its depth.
    """
    n = ancestors.shape[0]
    slots = torch.arange(upto, device=ancestors.device)[None, :]  # [1, L]
    lengths = state.lengths[:, None]  # [B, 1]
    not_padding = slots >= state.first_slot[:, None]  # [B, L] (left padding is never attended)
    prefix = slots < lengths
    offset = (slots - lengths).clamp(min=0, max=n - 1)  # chunk node held by each slot
    in_chunk = (slots >= lengths) & (slots < lengths + n)
    chunk_visible = ancestors[:, offset].permute(1, 0, 2) & in_chunk[:, None, :]  # [B, T, L]
    mask = (prefix[:, None, :] | chunk_visible) & not_padding[:, None, :]
    if window is not None:
        key_pos = torch.where(in_chunk, lengths + depths[offset], slots)  # [B, L]
        query_pos = lengths + depths[None, :]  # [B, T]
        mask = mask & (query_pos[:, :, None] - key_pos[:, None, :] < window)
    return mask[:, None]


# --------------------------------------------------------------------------- decoding state


@dataclass
class DecodeState:
    """Everything a round needs. ``hidden``/``next_token`` belong to the last emitted token,
    which is not in the cache yet (it is the root of the next verify chunk)."""

    cache: StaticKVCache
    lengths: torch.Tensor  # [B] valid cache slots
    first_slot: torch.Tensor  # [B] first non-padding slot; position = slot - first_slot
    hidden: torch.Tensor  # [B, H]
    next_token: torch.Tensor  # [B]
    extra: dict = field(default_factory=dict)  # family-specific per-layer tensors [layers, B, ...] (cross-attn K/V)
    history: dict = field(default_factory=dict)  # per-row tensors [B] the logits rules keep (LogitsRules.start)
    # speech frames the drafter reads (eager rounds on a CPU: a short clip's 30 s window is mostly padding);
    # None = all of them (always in fixed-shape rounds)
    speech_frames: int | None = None

    def positions(self, depths: torch.Tensor) -> torch.Tensor:
        return (self.lengths - self.first_slot)[:, None] + depths[None, :]

    def slots(self, num_tokens: int) -> torch.Tensor:
        return self.lengths[:, None] + torch.arange(num_tokens, device=self.lengths.device)[None, :]

    def select_rows(self, rows: torch.Tensor):
        self.cache.select_rows(rows)
        self.lengths, self.first_slot = self.lengths[rows], self.first_slot[rows]
        self.hidden, self.next_token = self.hidden[rows], self.next_token[rows]
        self.extra = {k: v[:, rows] for k, v in self.extra.items()}
        self.history = {k: v[rows] for k, v in self.history.items()}
