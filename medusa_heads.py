"""Draft heads and the drafter that turns them into the tokens of a draft tree.

Two kinds of heads, both sharing the base's output projection by reference:

* ``MedusaHeads`` ("medusa"): K independent heads on the last hidden state ``h`` that produced the root
  token; head d's top-k tokens are the candidates at depth d+1 of every tree path.
* ``PathHeads`` ("path", Hydra-style sequential dependence): head d also sees the token of the node it
  drafts after, through a state carried along the path, so every tree node gets its own continuation.
  Optionally each step also reads the speech through the base's own last-layer cross-attention keys and
  values (Whisper), which the base has already computed for the call.

Heads may project onto a draft vocabulary (the tokens the base actually emits, recorded at training): a
cheaper projection for drafting only. On a CPU the drafter runs on int8 weight-only copies of the heads and
of that projection (``int8_drafting``): drafting there is bound by memory traffic, and it reads the heads
and the projection once per tree depth. Verification always uses the base's full output projection in the
base's own precision, so the decoded ids do not depend on any of this.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from .cpu_kernels import DerivedCopy, Projection, attend_memory, dense, is_dense
except ImportError:
    from cpu_kernels import DerivedCopy, Projection, attend_memory, dense, is_dense

HEAD_KINDS = ("medusa", "path")


class ResidualStack(nn.Module):
    """``num_layers`` blocks ``x + SiLU(W x + b)``, zero-initialised (the identity at first)."""

    def __init__(self, num_layers: int, hidden_size: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x):
        for layer in self.layers:
            x = x + F.silu(layer(x))
        return x


class MedusaHeads(nn.Module):
    """K heads, each ``num_layers`` residual blocks; state-dict names follow vLLM's Medusa format
    (``blocks.{i}.layers.{j}.weight`` / ``.bias``)."""

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int):
        super().__init__()
        self.blocks = nn.ModuleList(ResidualStack(num_layers, hidden_size) for _ in range(num_heads))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., K, H]"""
        return torch.stack([block(hidden) for block in self.blocks], dim=-2)


class SpeechAttention(nn.Module):
    """Attention of a draft state over the base's last-layer cross-attention keys/values (the speech)."""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.norm = nn.LayerNorm(hidden_size)
        self.query = nn.Linear(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """x [B, T, H]; keys/values [B, heads, L, D] -> x + attention [B, T, H]."""
        batch, n, width = x.shape
        query = self.query(self.norm(x)).view(batch, n, self.num_heads, -1).transpose(1, 2)
        attended = attend_memory(query, keys.to(query.dtype), values.to(query.dtype))
        return x + self.out(attended.transpose(1, 2).reshape(batch, n, width))


class PathBlock(nn.Module):
    """One depth of ``PathHeads``: state' = stack(attend(state + W [state; norm(token embedding)]))."""

    def __init__(self, num_layers: int, hidden_size: int, speech_heads: int | None):
        super().__init__()
        self.merge = nn.Linear(2 * hidden_size, hidden_size)
        nn.init.zeros_(self.merge.weight)
        nn.init.zeros_(self.merge.bias)
        self.speech = SpeechAttention(hidden_size, speech_heads) if speech_heads else None
        self.stack = ResidualStack(num_layers, hidden_size)

    def forward(self, state, token_embedding, speech=None):
        """state/token_embedding [B, T, H]; speech: (keys, values) [B, heads, L, D] or None."""
        embedding = F.layer_norm(token_embedding, token_embedding.shape[-1:])
        x = state + self.merge(torch.cat([state, embedding.to(state.dtype)], dim=-1))
        if self.speech is not None:
            x = self.speech(x, *speech)
        return self.stack(x)


class PathHeads(nn.Module):
    """K sequentially dependent heads: block d turns the state of a depth-d node (the base's hidden for
    the root) and that node's token into the state whose projection drafts the node's children."""

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, speech_heads: int | None = None):
        super().__init__()
        self.blocks = nn.ModuleList(PathBlock(num_layers, hidden_size, speech_heads) for _ in range(num_heads))

    def teacher_forced(self, hidden, tokens_embedded, speech=None) -> torch.Tensor:
        """Training: hidden [B, T, H] and the embeddings of the true tokens at offsets 0..K-1 from each
        position [B, T, K, H] -> the states [B, T, K, H] whose projections predict offsets 1..K."""
        states, state = [], hidden
        for depth, block in enumerate(self.blocks):
            state = block(state, tokens_embedded[:, :, depth], speech)
            states.append(state)
        return torch.stack(states, dim=-2)


def build_heads(kind: str, num_heads: int, num_layers: int, hidden_size: int, speech_heads: int | None = None):
    if kind == "medusa":
        if speech_heads:
            raise ValueError("Medusa heads do not attend to speech; use head_kind='path' for speech_attention.")
        return MedusaHeads(num_heads, num_layers, hidden_size)
    if kind == "path":
        return PathHeads(num_heads, num_layers, hidden_size, speech_heads)
    raise ValueError(f"head_kind={kind!r}: use one of {HEAD_KINDS}.")


# --------------------------------------------------------------------------- int8 drafting on a CPU


def int8_drafting_supported(device) -> bool:
    """Whether drafting on ``device`` uses int8 weight-only copies: CPUs, where torch has the kernel."""
    return torch.device(device).type == "cpu" and hasattr(torch.ops.aten, "_weight_int8pack_mm")


INT8_COLUMN_MULTIPLE = 16  # torch 2.13's CPU kernel crashes (AVX-512, bf16, several rows) on other widths


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> int8 [N, K'] and one bfloat16 scale per row (symmetric, round to nearest); K' is K
    rounded up to ``INT8_COLUMN_MULTIPLE`` with zero columns."""
    weight = weight.detach().float()
    scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
    rows = torch.round(weight / scales[:, None]).to(torch.int8)
    return F.pad(rows, (0, -weight.shape[1] % INT8_COLUMN_MULTIPLE)), scales.to(torch.bfloat16)


def int8_matmul(x: torch.Tensor, rows: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[..., K] @ int8 rows [N, K'].T with per-row scales -> [..., N] in ``x``'s dtype (bfloat16 activations:
    torch's CPU kernel for them reads the int8 weight once, several times faster than a float32 GEMV here)."""
    flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    if flat.shape[1] != rows.shape[1]:  # (zero columns padded by int8_rows)
        flat = F.pad(flat, (0, rows.shape[1] - flat.shape[1]))
    out = torch.ops.aten._weight_int8pack_mm(flat, rows, scales)
    return out.to(x.dtype).reshape(*x.shape[:-1], rows.shape[0])


class Int8Linear(nn.Module):
    """An ``nn.Linear`` frozen as int8 weight-only (for drafting: its outputs only propose tokens)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        rows, scales = int8_rows(linear.weight)
        self.register_buffer("rows", rows)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x):
        out = int8_matmul(x, self.rows, self.scales)
        return out if self.bias is None else out + self.bias.to(out.dtype)


def int8_drafting_copy(heads: nn.Module) -> nn.Module:
    """A copy of ``heads`` with every ``nn.Linear`` as an ``Int8Linear`` (the originals stay as they are)."""
    frozen = copy.deepcopy(heads).requires_grad_(False)
    replace_linears(frozen, Int8Linear)
    return frozen


def replace_linears(module: nn.Module, make, skip=()) -> int:
    """Every plain ``nn.Linear`` under ``module`` (but children named in ``skip``) replaced, in place, by
    ``make(linear)``; returns how many."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and name not in skip:
                setattr(parent, name, make(child))
                replaced += 1
    return replaced


# --------------------------------------------------------------------------- drafting


class DraftProjection:
    """The base's output projection restricted to the draft vocabulary (all of it when there is none).
    The restricted weight is a gathered copy, rebuilt when the base's weight tensor is replaced; with
    ``int8``, an int8 weight-only copy of those rows (drafting on a CPU)."""

    def __init__(self, backbone, vocab_ids: torch.Tensor | None, int8: bool = False):
        self.backbone = backbone
        self.vocab_ids = vocab_ids
        self.int8 = int8
        self._weight, self._source = None, None
        self._int8 = DerivedCopy(int8_rows)
        self._project = Projection(self.weight)

    def weight(self) -> torch.Tensor:
        """The draft rows of the output projection; dense even when the base's is quantised (drafting only
        proposes: verification uses the base's own projection)."""
        full = self.backbone.output_projection.weight
        if self.vocab_ids is None and is_dense(full):
            return full
        source = (id(full), full.dtype, full.device)
        if self._source != source:
            rows = dense(full.detach())
            self._weight = (rows if self.vocab_ids is None else rows[self.vocab_ids.to(rows.device)]).contiguous()
            self._source = source
        return self._weight

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V_draft] (no soft-capping: it does not change the ranking)."""
        if self.int8:
            return int8_matmul(states, *self._int8(self.weight()))
        return self._project(states)

    def token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        if self.vocab_ids is None:
            return indices
        return self.vocab_ids.to(indices.device)[indices]


ITERATED_ARGMAX_MAX_K = 8
WIDE_VOCAB_BLOCK = 1024  # (0: the k argmax passes over the whole row everywhere)


def best_indices(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[..., V] -> the k best indices [..., k], best first (ties: the lowest index first). Up to 8 of them as k argmax
    passes, each masking the one before: compiled, that is one fused reduction, where a top-k kernel costs several
    times as much. Compiled on
    a GPU over a whole wide vocabulary (MERaLiON-2's 256 000 tokens without a draft vocabulary), each such reduction is
    one program a row, and four heads' rows leave the GPU idle: there the search goes through blocks (``blocked_best_indices``)."""
    if k > ITERATED_ARGMAX_MAX_K:
        return logits.topk(k, dim=-1).indices
    width = WIDE_VOCAB_BLOCK
    if width and logits.is_cuda and torch.compiler.is_compiling() and logits.shape[-1] >= 32 * width:
        return blocked_best_indices(logits, k, width)
    return iterated_argmax(logits, k)


def iterated_argmax(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[..., V] -> the k best indices [..., k]: k argmax passes, each masking the index found before it."""
    return argmax_passes(logits, k)[0]


def argmax_passes(logits: torch.Tensor, k: int, with_values: bool = False) -> tuple:
    """``iterated_argmax``'s indices [..., k] and, ``with_values``, each one's logit as its pass saw it (an index a
    pass had masked, found again where fewer than k logits are finite, reads as -inf: never a candidate twice)."""
    if k == 1 and not with_values:  # (a chain's every depth: no positions to mask)
        return logits.argmax(dim=-1, keepdim=True), None
    positions = torch.arange(logits.shape[-1], device=logits.device)
    best, values = [], []
    for _ in range(k):
        best.append(logits.argmax(dim=-1, keepdim=True))
        if with_values:
            values.append(logits.gather(-1, best[-1]))
        if len(best) < k:
            logits = torch.where(positions == best[-1], float("-inf"), logits)
    return torch.cat(best, dim=-1), torch.cat(values, dim=-1) if with_values else None


def blocked_best_indices(logits: torch.Tensor, k: int, width: int) -> torch.Tensor:
    """``iterated_argmax`` through blocks of ``width`` logits, the same indices in the same order: the k best of each
    block (k passes over every block at once: many short reductions spread over the GPU), then the k best of those
    candidates, taken block by block so that among equal logits the lowest index still comes first."""
    vocab = logits.shape[-1]
    blocks = -(-vocab // width)
    if blocks < 2:
        return iterated_argmax(logits, k)
    if blocks * width != vocab:
        logits = F.pad(logits, (0, blocks * width - vocab), value=float("-inf"))
    inside, values = argmax_passes(logits.unflatten(-1, (blocks, width)), k, with_values=True)  # [..., blocks, k]
    offsets = torch.arange(blocks, device=logits.device)[:, None] * width
    candidates = (inside + offsets).flatten(-2)  # [..., blocks * k], block by block, best first
    return candidates.gather(-1, iterated_argmax(values.flatten(-2), k))


def draft_probability(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] draft logits -> [...] the probability of the best draft (the softmax maximum)."""
    return torch.softmax(logits.float(), dim=-1).amax(dim=-1)


class TreeDrafter:
    """Fills the draft tree for a round: ``drafter(state) -> chunk [B, N]`` (root token + draft tokens in
    tree order), read from ``state.hidden`` (which produced the root ``state.next_token``)."""

    def __init__(self, tree, device):
        self.tree = tree
        self.tt = tree.tensors(device)

    def root_chunk(self, state) -> torch.Tensor:
        """[B, N] holding the root token everywhere, for the drafts to be written into."""
        return state.next_token[:, None].expand(-1, self.tree.num_nodes).clone()


class MedusaDrafter(TreeDrafter):
    """Independent heads: candidates at depth d are head d-1's top-k on the root's hidden state.
    ``head_logits`` (hidden [B, H] -> [B, K, V'] with token ids ``token_ids(indices)``) may be the trained
    heads or a stand-in (an oracle in tests, a replayed acceptance profile in benchmarks)."""

    def __init__(self, tree, device, head_logits, token_ids=lambda indices: indices):
        super().__init__(tree, device)
        self.head_logits, self.token_ids = head_logits, token_ids

    def __call__(self, state) -> torch.Tensor:
        top = self.token_ids(best_indices(self.head_logits(state.hidden), self.tree.max_rank + 1))
        tokens = self.root_chunk(state)
        tokens[:, 1:] = top[:, self.tt.depths[1:] - 1, self.tt.ranks[1:]]
        return tokens


class PathDrafter(TreeDrafter):
    """Sequential heads: depth by depth, each node with children gets its own state from its parent's
    state and its own token, and its children are the top-k of that state's projection. A chain may stop
    early (``stops_early``): see ``__call__``."""

    stops_early = True

    def __init__(self, tree, device, heads: PathHeads, projection: DraftProjection, embed, speech=None):
        super().__init__(tree, device)
        self.heads, self.projection, self.embed, self.speech = heads, projection, embed, speech
        parents, ranks = self.tt.parents.tolist(), self.tt.ranks.tolist()
        depths = self.tt.depths.tolist()
        expanding = sorted({parents[node] for node in range(1, tree.num_nodes)})
        self.levels = []  # per depth: (nodes that have children, their parents' rows, children, picks, k)
        previous = []
        for depth in range(tree.depth):
            nodes = [n for n in expanding if depths[n] == depth]
            parent_rows = [previous.index(parents[n]) for n in nodes] if depth else [0] * len(nodes)
            children = [c for c in range(1, tree.num_nodes) if depths[c] == depth + 1]
            k = max(ranks[c] for c in children) + 1  # candidates needed at this depth
            picks = [nodes.index(parents[c]) * k + ranks[c] for c in children]  # in the flattened [nodes * k]
            self.levels.append(tuple(_index(v, device) for v in (nodes, parent_rows, children, picks)) + (k,))
            previous = nodes

    def __call__(self, state, stop_below: float = 0.0) -> torch.Tensor:
        """With ``stop_below`` (chains; a tree keeps its shape), drafting stops after the first depth where, in every row, the
        product of the drafts' probabilities so far (each the softmax maximum of its draft logits) is below
        it: the chunk then holds the root and the drafts up to that depth (a host sync per depth)."""
        speech = self.speech(state) if self.speech is not None else None
        tokens = self.root_chunk(state)
        parent_states = state.hidden[:, None]  # [B, 1, H]: the root's parent state is the base's hidden
        confidence = None  # [B, 1]: the product of each row's draft probabilities so far
        for depth, (nodes, parent_rows, children, picks, k) in enumerate(self.levels):
            states = self.heads.blocks[depth](parent_states[:, parent_rows], self.embed(tokens[:, nodes]), speech)
            logits = self.projection.logits(states)
            top = self.projection.token_ids(best_indices(logits, k))  # [B, len(nodes), k]
            tokens[:, children] = top.flatten(1)[:, picks]
            parent_states = states
            if stop_below and self.tree.is_chain and depth + 1 < len(self.levels):
                probability = draft_probability(logits)
                confidence = probability if confidence is None else confidence * probability
                if bool((confidence < stop_below).all()):
                    return tokens[:, : depth + 2]
        return tokens


class FusedPathWeights:
    """Path heads with speech attention rearranged for drafting in fewer products per depth (a GPU round's drafting
    is a chain of small kernels that cost the same whatever their size). For depth d's block, where the original runs
    merge, query, attention out, the stack's first product and the draft projection:
    - query and the stack's first product read one row [norm(x) | x] through a block-diagonal weight (``qw``): the
      stack's product of x + Wo a + bo is W1 x + W1 Wo a + (W1 bo + b1), and W1 x is known before the attention;
    - the attention's output goes through one [Wo; W1 Wo] product (``ow``), giving both halves;
    - below the root the merge needs no product: its token half is a table over the draft vocabulary
      (``token_table``: merge(norm(embedding)) per draft token) and its state half rides on the depth above's
      draft projection (``projection``: [draft rows; next block's merge state half]).
    3 products per depth instead of 5 (4 at the root). The same function in other rounding: drafts only propose."""

    def __init__(self, heads: PathHeads, projection_rows: torch.Tensor, vocab_ids: torch.Tensor, embed):
        width = projection_rows.shape[1]
        self.vocab = projection_rows.shape[0]
        self.blocks = []
        merges = [block.merge.weight.detach().float() for block in heads.blocks]
        for depth, block in enumerate(heads.blocks):
            speech, first = block.speech, block.stack.layers[0]
            w1, b1 = first.weight.detach().float(), first.bias.detach().float()
            wo, bo = speech.out.weight.detach().float(), speech.out.bias.detach().float()
            qw = torch.zeros(2 * width, 2 * width, device=w1.device)
            qw[:width, :width], qw[width:, width:] = speech.query.weight.detach().float(), w1
            qb = torch.cat([speech.query.bias.detach().float(), w1 @ bo + b1])
            ow, ob = torch.cat([wo, w1 @ wo]), torch.cat([bo, torch.zeros_like(bo)])
            below = merges[depth + 1][:, :width] if depth + 1 < len(merges) else None
            rows = projection_rows.float() if below is None else torch.cat([projection_rows.float(), below])
            table = None
            if depth:
                tokens = F.layer_norm(embed(vocab_ids).float(), (width,))
                table = tokens @ merges[depth][:, width:].T + block.merge.bias.detach().float()
            dtype = first.weight.dtype
            self.blocks.append({name: None if t is None else t.to(dtype).contiguous() for name, t in (
                ("qw", qw), ("qb", qb), ("ow", ow), ("ob", ob), ("projection", rows), ("token_table", table))})

    @staticmethod
    def supports(heads, vocab_ids) -> bool:
        """Path heads reading the speech, with a stack, and a draft vocabulary (whose token tables stay small)."""
        return (isinstance(heads, PathHeads) and vocab_ids is not None and len(vocab_ids) <= 32768
                and all(b.speech is not None and len(b.stack.layers) for b in heads.blocks))


class FusedPathDrafter(PathDrafter):
    """``PathDrafter`` on ``FusedPathWeights``: the same drafts up to rounding, fewer kernels per depth (the
    whole tree: its rounds are a GPU's fixed shapes)."""

    stops_early = False

    def __init__(self, tree, device, heads: PathHeads, projection: DraftProjection, embed, speech,
                 weights: FusedPathWeights):
        super().__init__(tree, device, heads, projection, embed, speech)
        self.weights = weights

    def __call__(self, state) -> torch.Tensor:
        keys, values = self.speech(state)
        tokens = self.root_chunk(state)
        indices = torch.zeros_like(tokens)  # draft-vocabulary index of each drafted token
        parent_states, state_halves = state.hidden[:, None], None
        for depth, (nodes, parent_rows, children, picks, k) in enumerate(self.levels):
            block, fused = self.heads.blocks[depth], self.weights.blocks[depth]
            parents = parent_states[:, parent_rows]
            if depth == 0:
                embedding = F.layer_norm(self.embed(tokens[:, nodes]), parents.shape[-1:]).to(parents.dtype)
                x = parents + block.merge(torch.cat([parents, embedding], dim=-1))
            else:
                x = parents + state_halves[:, parent_rows] + fused["token_table"][indices[:, nodes]]
            x = self._attend_and_stack(block, fused, x, keys, values)
            out = F.linear(x, fused["projection"])
            top = best_indices(out[..., : self.weights.vocab], k)  # [B, len(nodes), k]
            indices[:, children] = top.flatten(1)[:, picks]
            tokens[:, children] = self.projection.token_ids(indices[:, children])
            parent_states, state_halves = x, out[..., self.weights.vocab:]
        return tokens

    @staticmethod
    def _attend_and_stack(block, fused, x, keys, values):
        batch, n, width = x.shape
        speech = block.speech
        both = F.linear(torch.cat([speech.norm(x), x], dim=-1), fused["qw"], fused["qb"])
        query = both[..., :width].reshape(batch, n, speech.num_heads, -1).transpose(1, 2)
        attended = attend_memory(query, keys.to(query.dtype), values.to(query.dtype))
        out = F.linear(attended.transpose(1, 2).reshape(batch, n, width), fused["ow"], fused["ob"])
        x = x + out[..., :width] + F.silu(both[..., width:] + out[..., width:])
        for layer in block.stack.layers[1:]:
            x = x + F.silu(layer(x))
        return x


def _index(values: list[int], device):
    """Positions to index a dimension with: a slice where they are consecutive (a view, no gather kernel),
    else a tensor."""
    if values == list(range(values[0], values[0] + len(values))):
        return slice(values[0], values[0] + len(values))
    return torch.tensor(values, dtype=torch.long, device=device)
