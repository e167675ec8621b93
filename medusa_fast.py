"""Fixed-shape Medusa rounds for GPUs: a whole round (draft, verify, accept, cache update) is one
CUDA graph, optionally compiled; the host syncs once per round to read the emitted tokens. ``RoundCache`` keeps
them, and the fixed-shape caches they run on, for later calls of the same shapes.

Same arithmetic as ``medusa_decoding.EagerRounds`` (so the same tokens), but with every shape fixed:
attention runs over the whole preallocated cache, finished rows stay in the batch frozen (their lengths
stop advancing) and the state is updated in place. ``medusa_decoding.run_rounds`` drives both.
"""

from __future__ import annotations

import contextlib
import gc
import warnings

import torch

try:
    from .backbone import compile_fixed_shape
    from .draft_trees import DraftTree
    from .kv_cache import CachePool, DecodeState
    from .medusa_decoding import RoundResult, verify_round
except ImportError:
    from backbone import compile_fixed_shape
    from draft_trees import DraftTree
    from kv_cache import CachePool, DecodeState
    from medusa_decoding import RoundResult, verify_round


def capture_cuda_graph(fn, warmups: int = 1, reset=None) -> torch.cuda.CUDAGraph:
    """Run ``fn`` ``warmups`` times on a side stream (compiling, allocating), then capture one call of
    it as a CUDA graph on that stream. ``reset`` runs after every call, to undo what ``fn`` changed in place."""
    reset = reset or (lambda: None)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
            reset()
        # (not ``torch.cuda.graph``: its synchronize and empty_cache before every capture cost a first call more
        # than the captures themselves)
        with cyclic_gc_paused():
            graph.capture_begin()
            try:
                fn()
            finally:
                graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    reset()
    return graph


@contextlib.contextmanager
def cyclic_gc_paused():
    """No cyclic-GC pass inside: one freeing another graph's memory during a capture would invalidate it (and a
    ``gc.collect()`` before each capture walks every object of a large process: docs/DEVELOPING.md, first calls)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class CapturedCalls:
    """Fixed-shape functions replayed as CUDA graphs, one graph per key (e.g. the speech encoder per batch
    size): a call copies its inputs into the graph's own input buffers, replays, and returns clones of the
    outputs (the next replay overwrites the graph's). Eager, the encoder of a 30 s window and the prompt's
    decoder pass are hundreds of small kernels launched one by one from Python. ``keep``: an object the
    graph writes into (a KV cache), kept alive with it so that its ``id`` in a key is never reused."""

    def __init__(self):
        self.graphs: dict = {}

    def __call__(self, key, fn, *inputs, keep=None):
        if key not in self.graphs:
            self.graphs[key] = self._capture(key, fn, inputs, keep)
        entry = self.graphs[key]
        if entry is None:  # (this function could not be captured: it runs eagerly)
            return fn(*inputs)
        graph, static_inputs, outputs, _ = entry
        for static, x in zip(static_inputs, inputs):
            static.copy_(x)
        graph.replay()
        return torch.utils._pytree.tree_map(torch.clone, outputs["value"])

    @staticmethod
    def _capture(key, fn, inputs, keep):
        static_inputs, outputs = [x.clone() for x in inputs], {}

        def body():
            outputs["value"] = fn(*static_inputs)

        try:
            return capture_cuda_graph(body, warmups=2), static_inputs, outputs, keep
        except RuntimeError as error:  # e.g. a host sync inside a base's own module: same result, eagerly
            warnings.warn(f"{key[0]} could not be captured as a CUDA graph ({' '.join(str(error).split())[:200]}); "
                          "it runs eagerly.")
            return None

    def release(self):
        self.graphs.clear()


class CapturedRounds:
    """Rounds over a fixed-shape state (attention over the whole cache), replayed as one CUDA graph
    (``use_graph`` on CUDA) and optionally compiled; reused across calls through ``load``."""

    def __init__(self, backbone, drafter, process_logits, state: DecodeState, tree: DraftTree,
                 use_graph: bool = True, compile: bool = False, num_generated: torch.Tensor | None = None):
        self.backbone, self.drafter, self.process_logits = backbone, drafter, process_logits
        self.state, self.tree = state, tree
        device = state.lengths.device
        self.tt = tree.tensors(device)
        batch = state.next_token.shape[0]
        # tokens emitted per row (the root included); a caller may share this buffer (replayed drafts)
        self.num_generated = torch.ones(batch, dtype=torch.long, device=device) if num_generated is None else num_generated
        self.active = torch.ones(batch, dtype=torch.bool, device=device)
        self.result = torch.zeros(batch, tree.depth + 2, dtype=torch.long, device=device)  # [accepted, emitted...]
        self._active_on_device = [True] * batch
        # the verdict's host copy: page-locked, read once an event says it landed (tolist() of the device tensor
        # copies through pageable memory: benchmarks/round_cost/h100_call_overhead.json)
        pinned = device.type == "cuda"
        self._host_result = torch.empty(self.result.shape, dtype=self.result.dtype, pin_memory=True) if pinned else None
        self._result_landed = torch.cuda.Event() if pinned else None
        state.speech_frames = None  # fixed shapes: the drafter reads every speech frame
        backbone.prepare_rounds()
        # no bound method stored on self: a runner<->method cycle would be freed by the cyclic GC at a
        # random moment, possibly while another runner is capturing (which invalidates that capture)
        self._compiled = compile_fixed_shape(type(self)._round) if compile else type(self)._round
        self.graph = self._capture() if use_graph and device.type == "cuda" else None

    @torch.no_grad()  # a round never needs autograd (and compiling one with it traces a backward)
    def _round(self):
        st = self.state
        self._advance(verify_round(self.backbone, self.drafter, self.process_logits, st, self.tree, self.tt,
                                   self.num_generated, st.cache.capacity))

    def _advance(self, step):
        """The round's verdict into the fixed-shape state, in place (``num_generated`` still counts the tokens
        emitted before this round until the end)."""
        st = self.state
        self.result.copy_(torch.cat([step.accepted[:, None], step.emitted], dim=1))
        advance = (step.accepted + 1) * self.active  # finished rows stay frozen in the fixed batch
        st.lengths.add_(advance)
        self.num_generated.add_(advance)
        st.hidden.copy_(torch.where(self.active[:, None], step.best_hidden, st.hidden))
        st.next_token.copy_(torch.where(self.active, step.next_token, st.next_token))
        for name, value in st.history.items():
            value.copy_(torch.where(self.active, step.history[name], value))

    def load(self, state: DecodeState):
        """Start a new call on the same captured graph: ``state`` was prefilled into this runner's
        cache (see CachePool); its small per-row tensors are copied into the runner's own, in place."""
        if state.cache is not self.state.cache:
            raise ValueError("load() needs a state prefilled into this runner's cache")
        st = self.state
        for name in ("lengths", "first_slot", "hidden", "next_token"):
            getattr(st, name).copy_(getattr(state, name))
        for name in ("extra", "history"):
            for key, value in getattr(state, name).items():
                getattr(st, name)[key].copy_(value)
        self.num_generated.fill_(1)
        self._set_active([True] * len(self._active_on_device))

    def _set_active(self, active: list[bool]):
        if active != self._active_on_device:
            self.active.copy_(torch.tensor(active, device=self.active.device))
            self._active_on_device = list(active)

    def _mutable(self):
        st = self.state
        return [st.lengths, st.hidden, st.next_token, self.num_generated, *st.history.values()]

    def snapshot(self):
        """A function that puts the state the rounds change in place back as it is now."""
        saved = [t.clone() for t in self._mutable()]

        def restore():
            for target, value in zip(self._mutable(), saved):
                target.copy_(value)

        return restore

    def _capture(self):
        return capture_cuda_graph(lambda: self._compiled(self), warmups=3, reset=self.snapshot())

    def release(self):
        """Free the captured graph (its private memory pool goes back to the allocator)."""
        self.graph = None

    def replay(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self._compiled(self)

    def step(self, active: list[bool]) -> RoundResult:
        self._set_active(active)
        self.replay()
        rows = self._read_result()
        return RoundResult([r[0] for r in rows], [r[1:] for r in rows])

    def _read_result(self) -> list:
        """The round's verdict as host lists: the round's one host sync."""
        if self._host_result is None:
            return self.result.tolist()
        self._host_result.copy_(self.result, non_blocking=True)
        self._result_landed.record()
        self._result_landed.synchronize()
        return self._host_result.tolist()


class RoundCache:
    """Fixed-shape caches (a pool, capacity rounded up), the captured rounds built on them and the prefill's captured
    calls, kept for later calls of the same shapes and dropped when the weights they were captured with are replaced."""

    def __init__(self):
        self.pool = CachePool()
        self.calls = CapturedCalls()  # the prefill's captured parts (speech encoder, prompt pass)
        self.runners: dict = {}
        self.signature = None  # the weights the kept rounds were captured with

    def check_weights(self, parameters) -> bool:
        """Captured rounds hold raw pointers to the weights: when any weight tensor was replaced since they were
        captured (``.to()``, ``.half()``, a reload, an in-place update) drop them instead of replaying over freed
        memory. Returns True when they were dropped (or none were kept)."""
        signature = tuple((p.data_ptr(), p.dtype, p.device, p._version) for p in parameters)
        if signature == self.signature:
            return False
        self.release()
        self.signature = signature
        return True

    def runner(self, key, state, build):
        """The runner for ``key`` loaded with ``state`` (prefilled into a pool cache), or ``build()``."""
        runner = self.runners.get(key)
        if runner is None:
            for stale in [k for k, r in self.runners.items() if not self.pool.holds(r.state.cache)]:
                self.runners.pop(stale).release()
            runner = self.runners[key] = build()
        else:
            runner.load(state)
        return runner

    def release(self):
        for runner in self.runners.values():
            runner.release()
        self.runners.clear()
        self.calls.release()
        self.pool.caches.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
