"""Draft trees: the shape of a round's drafts (a chain is the tree with one node per depth), their tensors,
and the trees built from the heads' measured accuracy."""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass

import torch


# --------------------------------------------------------------------------- draft trees


@dataclass(frozen=True)
class DraftTree:
    """A sparse draft tree; node 0 is the root (the last emitted token), nodes 1.. are drafts.

    ``paths[i]`` lists the per-head top-k ranks leading to node i+1: ``[0]`` is head 0's best
    token, ``[0, 1]`` is head 1's second-best token after it, and so on.
    """

    paths: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        # (auto looks its candidates up by tree several times a call: a tree's hash is worked out once)
        object.__setattr__(self, "_hash", hash(self.paths))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def chain(cls, num_heads: int) -> "DraftTree":
        return cls(tuple((0,) * depth for depth in range(1, num_heads + 1)))

    @classmethod
    def from_paths(cls, paths) -> "DraftTree":
        ordered = sorted({tuple(int(r) for r in p) for p in paths}, key=lambda p: (len(p), p))
        known = set(ordered)
        for path in ordered:
            if len(path) > 1 and path[:-1] not in known:
                raise ValueError(f"Draft tree path {list(path)} has no parent {list(path[:-1])}.")
        return cls(tuple(ordered))

    @property
    def num_nodes(self) -> int:
        return len(self.paths) + 1

    @property
    def depth(self) -> int:
        return max([len(p) for p in self.paths] or [0])  # (no default=: torch.compile traces this)

    @property
    def max_rank(self) -> int:
        return max([max(p) for p in self.paths] or [0])

    @property
    def name(self) -> str:
        if self.num_nodes == 1:
            return "none (plain greedy)"
        return f"chain of {self.depth}" if self.is_chain else f"tree of {self.num_nodes - 1} nodes"

    @property
    def is_chain(self) -> bool:
        return all(p == (0,) * len(p) for p in self.paths)

    def tensors(self, device) -> "TreeTensors":
        """This tree's tensors on ``device``, made once and shared, so never written: every call's prefill and
        rounds read them, and on a GPU each made afresh is a copy from the host that first waits for all the work
        queued before it (the call's speech encoder), idling the GPU while the host sets the rounds up."""
        return _tree_tensors(self, torch.device(device))

    def _make_tensors(self, device: torch.device) -> "TreeTensors":
        index = {path: i + 1 for i, path in enumerate(self.paths)}
        parents = [0] + [index.get(p[:-1], 0) for p in self.paths]
        depths = [0] + [len(p) for p in self.paths]
        ranks = [0] + [p[-1] for p in self.paths]
        n = self.num_nodes
        ancestors = torch.zeros(n, n, dtype=torch.bool)
        for node in range(n):
            walk = node
            while True:
                ancestors[node, walk] = True
                if walk == 0:
                    break
                walk = parents[walk]
        return TreeTensors(
            parents=torch.tensor(parents, device=device),
            depths=torch.tensor(depths, device=device),
            ranks=torch.tensor(ranks, device=device),
            ancestors=ancestors.to(device),
            # path_nodes[n, d]: the node at depth d on the path to n (n itself past its depth).
            path_nodes=_path_nodes(parents, depths, self.depth).to(device),
        )


@functools.lru_cache(maxsize=256)
def _tree_tensors(tree: DraftTree, device: torch.device) -> "TreeTensors":
    return tree._make_tensors(device)


@dataclass
class TreeTensors:
    parents: torch.Tensor  # [N]
    depths: torch.Tensor  # [N]
    ranks: torch.Tensor  # [N]
    ancestors: torch.Tensor  # [N, N] bool, ancestors[i, j]: j is i or an ancestor of i
    path_nodes: torch.Tensor  # [N, depth+1]


def _path_nodes(parents: list[int], depths: list[int], max_depth: int) -> torch.Tensor:
    table = torch.zeros(len(parents), max_depth + 1, dtype=torch.long)
    for node in range(len(parents)):
        walk = node
        table[node, :] = node
        while walk != 0:
            table[node, depths[walk]] = walk
            walk = parents[walk]
        table[node, 0] = 0
    return table


def _rank_hit_rates(topk_accuracy) -> list[list[float]]:
    """Per head, the probability that the right token sits exactly at rank r (from cumulative top-k)."""
    return [[max(acc[r] - (acc[r - 1] if r else 0.0), 0.0) for r in range(len(acc))] for acc in topk_accuracy]


def expected_tokens_per_round(tree: DraftTree, topk_accuracy) -> float:
    """Tokens a round emits on average if heads are right independently with the measured rates:
    1 (the base's own token) + the probability of reaching each draft node."""
    hit = _rank_hit_rates(topk_accuracy)
    total = 1.0
    for path in tree.paths:
        p = 1.0
        for depth, rank in enumerate(path):
            p *= hit[depth][rank] if depth < len(hit) and rank < len(hit[depth]) else 0.0
        total += p
    return total


def build_tree_from_accuracy(topk_accuracy, num_nodes: int) -> list[list[int]]:
    """Choose the ``num_nodes`` draft nodes with the highest estimated acceptance probability.

    ``topk_accuracy[h][r]`` is head h's measured held-out accuracy at top-(r+1) (cumulative).
    A node's probability is the product along its path of each head's rank-r hit rate
    (acc@r+1 - acc@r), so parents always outrank their children and the result is a tree.
    """
    rank_hit = _rank_hit_rates(topk_accuracy)
    chosen: list[tuple[int, ...]] = []
    frontier = [(-rank_hit[0][r], (r,)) for r in range(len(rank_hit[0]))]
    heapq.heapify(frontier)
    while frontier and len(chosen) < num_nodes:
        neg_p, path = heapq.heappop(frontier)
        chosen.append(path)
        depth = len(path)
        if depth < len(rank_hit):
            for r, hit in enumerate(rank_hit[depth]):
                heapq.heappush(frontier, (neg_p * hit, path + (r,)))
    return [list(p) for p in DraftTree.from_paths(chosen).paths]
