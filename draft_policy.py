"""Which draft a call uses, and the captured rounds kept between calls.

``DraftPolicy`` answers ``draft="auto"``: the candidates are plain greedy (no drafts), the chain and the
artifact's trees; each is scored by expected tokens per round over the measured cost of one verify pass
on this device, dtype and batch size. Expected tokens per round come from the artifact's own
measurement (``draft_candidates``: tokens per round simulated on held-out data when the heads were
exported), or else from per-head top-k accuracy; either is rescaled by the acceptance seen since.

``RoundCache`` keeps the fixed-shape caches and captured rounds for later calls of the same shapes, and
drops them when the weights they were captured with are replaced.
"""

from __future__ import annotations

import statistics
import time

import torch

try:
    from .medusa_decoding import CachePool, DraftTree, MedusaStats, build_tree_from_accuracy, expected_tokens_per_round
except ImportError:
    from medusa_decoding import CachePool, DraftTree, MedusaStats, build_tree_from_accuracy, expected_tokens_per_round

AUTO_TREE_SIZES = (8, 32, 64)  # draft nodes of the extra trees tried when only head accuracy is known


class DraftPolicy:
    def __init__(self, config):
        self.config = config
        self.verify_seconds: dict = {}  # (device, dtype, batch, captured, tree) -> seconds of one verify pass
        self.acceptance_scale = 1.0  # observed / predicted extra tokens per round, averaged over calls

    # ------------------------------------------------------------------ candidates
    def measured(self) -> dict:
        """Tree -> tokens per round measured at export (empty for older artifacts)."""
        return {DraftTree.from_paths(c["paths"]) if c["paths"] else DraftTree(()): float(c["tokens_per_round"])
                for c in (self.config.draft_candidates or [])}

    def default_tree(self) -> DraftTree:
        if self.config.tree:
            return DraftTree.from_paths(self.config.tree)
        return DraftTree.chain(self.config.medusa_num_heads)

    def resolve(self, draft) -> DraftTree:
        """``"chain"``, ``"tree"`` (the artifact's tree), ``"none"``, explicit paths, or ``"auto"``'s default."""
        if isinstance(draft, (list, tuple)):
            return DraftTree.from_paths(draft) if draft else DraftTree(())
        if draft in ("none", None):
            return DraftTree(())
        if draft == "chain":
            return DraftTree.chain(self.config.medusa_num_heads)
        if draft in ("tree", "auto"):
            return self.default_tree()
        raise ValueError(f"draft={draft!r}: use 'auto', 'chain', 'tree', 'none' or a list of paths.")

    def candidates(self, draft) -> list[DraftTree]:
        if draft != "auto":
            return [self.resolve(draft)]
        measured = self.measured()
        if measured:
            options = [DraftTree(())] + [tree for tree in measured if tree.num_nodes > 1]
        else:
            accuracy = (self.config.head_accuracy or {}).get("topk")
            if not accuracy:
                return [self.default_tree()]
            options = [DraftTree(()), DraftTree.chain(self.config.medusa_num_heads), self.default_tree()]
            options += [DraftTree.from_paths(build_tree_from_accuracy(accuracy, n)) for n in AUTO_TREE_SIZES]
        return list(dict.fromkeys(options))  # unique, in order

    def predicted_tokens(self, tree: DraftTree) -> float:
        """Tokens per round the artifact's own measurement (or head accuracy) predicts for ``tree``."""
        if tree.num_nodes == 1:
            return 1.0
        measured = self.measured()
        if tree in measured:
            return measured[tree]
        accuracy = (self.config.head_accuracy or {}).get("topk")
        return expected_tokens_per_round(tree, accuracy) if accuracy else 1.0

    def expected_tokens(self, tree: DraftTree) -> float:
        return 1.0 + (self.predicted_tokens(tree) - 1.0) * self.acceptance_scale

    # ------------------------------------------------------------------ choosing
    def choose(self, candidates: list[DraftTree], key: tuple, time_verify) -> DraftTree:
        """The candidate with the most expected tokens per second of verify time; ``time_verify(tree)``
        measures one verify pass (once per ``key`` = device, dtype, batch size, captured or not)."""
        candidates = [t for t in candidates if t.num_nodes == 1 or self.expected_tokens(t) > 1.0 + 1e-6]
        if len(candidates) == 1:
            return candidates[0]  # no draft is expected to add a token: nothing to time
        for tree in candidates:
            if (key, tree) not in self.verify_seconds:
                self.verify_seconds[key, tree] = time_verify(tree)
        return max(candidates, key=lambda tree: self.expected_tokens(tree) / self.verify_seconds[key, tree])

    def observe(self, tree: DraftTree, stats: MedusaStats):
        """Track observed / predicted extra tokens per round (an average over calls), so ``auto`` adapts
        when the audio is harder or easier than the heads' held-out data."""
        if tree.num_nodes == 1 or not stats.row_rounds:
            return
        predicted = self.predicted_tokens(tree) - 1.0
        if predicted > 0:
            ratio = (stats.mean_accepted_per_round - 1.0) / predicted
            self.acceptance_scale = 0.7 * self.acceptance_scale + 0.3 * ratio


def median_after_warmup(timed_run, repeats: int) -> float:
    """Median of ``repeats`` results of ``timed_run()`` (seconds), after one untimed warm-up run."""
    times = [timed_run() for _ in range(repeats + 1)]
    return statistics.median(times[1:])


def wall_seconds(fn, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def graph_seconds(graph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RoundCache:
    """Fixed-shape caches (a pool, capacity rounded up) and the captured rounds built on them."""

    def __init__(self):
        self.pool = CachePool()
        self.runners: dict = {}
        self.signature = None  # the weights the kept rounds were captured with

    def check_weights(self, parameters) -> bool:
        """Captured rounds hold raw pointers to the weights: when any weight tensor was replaced since
        they were captured (``.to()``, ``.half()``, a reload) drop them instead of replaying over freed
        memory. Returns True when they were dropped (or none were kept)."""
        signature = tuple((p.data_ptr(), p.dtype, p.device) for p in parameters)
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
        self.pool.caches.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
