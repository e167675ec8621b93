"""Fixed-shape Medusa rounds for GPUs: a whole round (draft, verify, accept, cache update) is one
CUDA graph, optionally compiled; the host syncs once per round to read the emitted tokens.

Same arithmetic as ``medusa_decoding.medusa_decode`` (so the same tokens), but with every shape
fixed: attention runs over the whole preallocated cache, finished rows stay in the batch frozen
(their lengths stop advancing) and the state is updated in place.
"""

from __future__ import annotations

import gc

import torch

try:
    from .medusa_decoding import DecodeState, DraftTree, MedusaStats, finished, first_draft_logits, record_round, verify_round
except ImportError:
    from medusa_decoding import DecodeState, DraftTree, MedusaStats, finished, first_draft_logits, record_round, verify_round


def capture_cuda_graph(fn, warmups: int = 1, reset=None) -> torch.cuda.CUDAGraph:
    """Run ``fn`` ``warmups`` times on a side stream (compiling, allocating), then capture one call of
    it as a CUDA graph. ``reset`` runs after every call, to undo what ``fn`` changed in place."""
    reset = reset or (lambda: None)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
            reset()
    torch.cuda.current_stream().wait_stream(side)
    gc.collect()  # a cyclic-GC pass freeing another graph's memory during capture would invalidate it
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    reset()
    return graph


def _compiled_round(round_fn):
    """``torch.compile`` of a round. Every runner (batch size, draft tree, cache capacity) is one
    more specialisation of the same code, so the recompile limit must allow many of them."""
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 64))
    return torch.compile(round_fn, dynamic=False)


class StaticRoundRunner:
    def __init__(self, backbone, project, process_logits, state: DecodeState, tree: DraftTree,
                 use_graph: bool = True, compile: bool = False, num_generated: torch.Tensor | None = None):
        state.static = True
        self.backbone, self.project, self.process_logits = backbone, project, process_logits
        if tree.num_nodes > 1 and state.draft_logits is None:
            state.draft_logits = first_draft_logits(project, state)
        self.state, self.tree = state, tree
        device = state.lengths.device
        self.tt = tree.tensors(device)
        batch = state.next_token.shape[0]
        # tokens emitted per row (the root included); a caller may share this buffer (replayed drafts)
        self.num_generated = torch.ones(batch, dtype=torch.long, device=device) if num_generated is None else num_generated
        self.active = torch.ones(batch, dtype=torch.bool, device=device)
        self.emitted = torch.zeros(batch, tree.depth + 1, dtype=torch.long, device=device)
        self.accepted = torch.zeros(batch, dtype=torch.long, device=device)
        self.emitted_hidden = None
        # no bound method stored on self: a runner<->method cycle would be freed by the cyclic GC at a
        # random moment, possibly while another runner is capturing (which invalidates that capture)
        self._compiled = _compiled_round(type(self)._round) if compile else type(self)._round
        self.graph = self._capture() if use_graph and device.type == "cuda" else None

    @torch.no_grad()  # a round never needs autograd (and compiling one with it traces a backward)
    def _round(self):
        st = self.state
        step = verify_round(self.backbone, self.project, self.process_logits, st, self.tree, self.tt,
                            self.num_generated)
        self.emitted.copy_(step.emitted)
        self.accepted.copy_(step.accepted)
        advance = (step.accepted + 1) * self.active  # finished rows stay frozen in the fixed batch
        st.lengths.add_(advance)
        self.num_generated.add_(advance)
        rows = torch.arange(step.hidden.shape[0], device=step.hidden.device)
        keep = self.active[:, None]
        st.hidden.copy_(torch.where(keep, step.hidden[rows, step.best], st.hidden))
        st.next_token.copy_(torch.where(self.active, step.next_token, st.next_token))
        if step.drafts_at is not None:
            st.draft_logits.copy_(torch.where(keep[:, :, None], step.drafts_at(step.best), st.draft_logits))

    def load(self, state: DecodeState):
        """Start a new call on the same captured graph: ``state`` was prefilled into this runner's
        cache (see CachePool); its small per-row tensors are copied into the runner's own, in place."""
        if state.cache is not self.state.cache:
            raise ValueError("load() needs a state prefilled into this runner's cache")
        st = self.state
        for name in ("lengths", "first_slot", "hidden", "next_token"):
            getattr(st, name).copy_(getattr(state, name))
        for name, value in state.extra.items():
            st.extra[name].copy_(value)
        self.num_generated.fill_(1)
        if self.tree.num_nodes > 1:
            st.draft_logits.copy_(first_draft_logits(self.project, st))

    def _snapshot(self):
        st = self.state
        return [t.clone() for t in self._mutable()]

    def _mutable(self):
        st = self.state
        tensors = [st.lengths, st.hidden, st.next_token, self.num_generated]
        return tensors + ([st.draft_logits] if st.draft_logits is not None else [])

    def _restore(self, saved):
        for target, value in zip(self._mutable(), saved):
            target.copy_(value)

    def _capture(self):
        saved = self._snapshot()
        return capture_cuda_graph(lambda: self._compiled(self), warmups=3, reset=lambda: self._restore(saved))

    def release(self):
        """Free the captured graph (its private memory pool goes back to the allocator)."""
        self.graph = None

    def step(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self._compiled(self)

    def run(self, max_new_tokens: int, eos_token_ids, stats: MedusaStats | None = None) -> list[list[int]]:
        stats = stats or MedusaStats()
        eos = set(int(e) for e in eos_token_ids)
        outputs = [[int(t)] for t in self.state.next_token.tolist()]
        active = [not finished(o, eos, max_new_tokens) for o in outputs]
        while any(active):
            self.active.copy_(torch.tensor(active, device=self.active.device))
            self.step()
            accepted, emitted = self.accepted.tolist(), self.emitted.tolist()  # the one host sync
            stats.rounds += 1
            for row, is_active in enumerate(active):
                if is_active:
                    record_round(outputs[row], accepted[row], emitted[row], eos, max_new_tokens, stats, self.tree.depth)
                    active[row] = not finished(outputs[row], eos, max_new_tokens)
        stats.new_tokens += sum(len(o) for o in outputs)
        return outputs

