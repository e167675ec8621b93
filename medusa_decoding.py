"""Family-agnostic Medusa decoding: one verify round and the loop over rounds.

Nothing here knows about audio, Whisper or MERaLiON-2. A backbone adapter supplies:

* ``prefill(inputs, capacity) -> DecodeState``: run the encoder and the prompt, fill the cache;
* ``decode(state, tokens[B, T], depths[T], ancestors[T, T], upto) -> hidden[B, T, H]``: one forward of
  the text decoder over new tokens written into the cache at ``state.lengths + arange(T)``, attending
  to the first ``upto`` cache slots;
* ``predict(hidden, process_logits, num_generated[B, T], path) -> [B, T]``: the base's own next token after
  each node, the argmax of its output projection (``logits(hidden)``, with any soft-capping) under
  ``process_logits``, the base generate's logits processors (token suppression, min_new_tokens, Whisper's
  timestamp rules) as ``LogitsRules``, so it equals the base's choice at every node of the chunk.

A chain of K drafts is the tree with one node per depth, so one code path serves both (``draft_trees.py``).
Drafting is the drafter's (``medusa_heads.py``): ``drafter(state) -> chunk[B, N]``, the root token and the draft
tokens. The cache and the state are ``kv_cache.py``'s, the rules ``logits_rules.py``'s, what adapters share
``backbone.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    from .draft_trees import DraftTree, TreeTensors
    from .kv_cache import DecodeState
    from .logits_rules import ChunkPath, LogitsRules
except ImportError:
    from draft_trees import DraftTree, TreeTensors
    from kv_cache import DecodeState
    from logits_rules import ChunkPath, LogitsRules


# --------------------------------------------------------------------------- counts and plans


@dataclass
class MedusaStats:
    """Counts over one generate call. A round is one verify pass; ``row_rounds`` sums the rows it served."""

    rounds: int = 0
    draft: str = ""
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # drafts that were emitted
    emitted_tokens: int = 0  # tokens the rounds emitted (accepted drafts + the base's own token, EOS included)
    new_tokens: int = 0  # all generated tokens per row, summed (the prefill's first token included)
    row_rounds: int = 0

    def add(self, other: "MedusaStats"):
        """Count another window of the same call in."""
        for name in ("rounds", "drafted_tokens", "accepted_tokens", "emitted_tokens", "new_tokens", "row_rounds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        drafts = [d for d in self.draft.split(", ") if d]
        self.draft = ", ".join(drafts + [other.draft] if other.draft not in drafts else drafts)

    @property
    def mean_accepted_per_round(self) -> float:
        """Tokens emitted per row per verify pass: what a pass really bought."""
        return self.emitted_tokens / self.row_rounds if self.row_rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "draft": self.draft,
            "rounds": self.rounds,
            "row_rounds": self.row_rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "emitted_tokens": self.emitted_tokens,
            "new_tokens": self.new_tokens,
            "mean_accepted_per_round": self.mean_accepted_per_round,
            "acceptance_rate": self.acceptance_rate,
        }


@dataclass
class WindowPlan:
    """One batch to decode: the backbone's prefill inputs, the logits rules, the new-token budget (None: the
    base's default) and the EOS ids that end a row."""

    inputs: dict
    rules: LogitsRules
    max_new_tokens: int | None
    eos_token_ids: list


# --------------------------------------------------------------------------- one round


def accept(chunk: torch.Tensor, predicted: torch.Tensor, tree: TreeTensors):
    """Longest draft path that equals the base's own argmax.

    chunk/predicted [B, N]: tokens fed and the base's argmax after each node.
    Returns (best node [B], accepted draft count [B]).
    """
    correct = chunk == predicted[:, tree.parents]
    correct[:, 0] = True
    on_path_ok = (correct[:, None, :] | ~tree.ancestors[None]).all(dim=-1)  # [B, N]
    score = torch.where(on_path_ok, tree.depths[None, :] + 1, torch.zeros_like(tree.depths)[None, :])
    best = score.argmax(dim=-1)
    return best, tree.depths[best]


def chain_prefix(tt: TreeTensors, nodes: int) -> TreeTensors:
    """A chain's tensors cut to its first ``nodes`` nodes (the root included): the shorter chain's own."""
    return TreeTensors(tt.parents[:nodes], tt.depths[:nodes], tt.ranks[:nodes], tt.ancestors[:nodes, :nodes],
                       tt.path_nodes[:nodes, :nodes])


@dataclass
class VerifiedRound:
    hidden: torch.Tensor  # [B, N, H] for every verified node
    best: torch.Tensor  # [B] deepest node on the accepted path
    accepted: torch.Tensor  # [B] accepted drafts (depth of ``best``)
    path: torch.Tensor  # [B, depth+1] nodes from the root to ``best`` (padded with ``best``)
    emitted: torch.Tensor  # [B, depth+1] accepted drafts, then the base's own next token last
    next_token: torch.Tensor  # [B] the base's argmax after ``best``
    history: dict  # the logits rules' per-row history after this round

    @property
    def best_hidden(self) -> torch.Tensor:
        return self.hidden[torch.arange(self.hidden.shape[0], device=self.hidden.device), self.best]


def verify_round(backbone, drafter, process_logits, state: DecodeState, tree: DraftTree, tt: TreeTensors,
                 num_generated: torch.Tensor, upto: int, chain_stop: float = 0.0) -> VerifiedRound:
    """Draft from the state, run ONE decoder pass over [last token + drafts] attending to ``upto`` cache
    slots, accept the longest prefix equal to the base's argmax and compact its K/V in the cache.
    ``drafter(state) -> chunk [B, N]`` (None: no drafts). Host-sync free, except with ``chain_stop``: a chain
    drafter then stops where its drafts' probability falls below it (``PathDrafter``), verifying a shorter chain."""
    if drafter is None:
        chunk = state.next_token[:, None]
    else:
        chunk = process_logits.hint_drafts(drafter(state, chain_stop) if chain_stop else drafter(state), state.history)
        if chunk.shape[1] < tree.num_nodes:
            tt = chain_prefix(tt, chunk.shape[1])
    hidden = backbone.decode(state, chunk, tt.depths, tt.ancestors, upto)
    path = ChunkPath(chunk, tt, state.history, num_generated[:, None] + tt.depths[None, :])
    predicted = backbone.predict(hidden, process_logits, path.num_generated, path)
    best, accepted = accept(chunk, predicted, tt)
    nodes = tt.path_nodes[best]
    if not tree.is_chain:
        offsets = torch.arange(nodes.shape[1], device=nodes.device)[None, :]
        state.cache.move(state.lengths[:, None] + nodes, state.lengths[:, None] + offsets)
    next_token = predicted.gather(1, best[:, None])[:, 0]
    emitted = torch.cat([chunk.gather(1, nodes[:, 1:]), next_token[:, None]], dim=1)
    return VerifiedRound(hidden, best, accepted, nodes, emitted, next_token, process_logits.advance(path, best))


# --------------------------------------------------------------------------- the loop


@dataclass
class RoundResult:
    """What the host reads after a round (the round's one sync), per row of the call."""

    accepted: list  # accepted drafts per row (None for rows that were not decoded)
    emitted: list  # [accepted drafts..., the base's own next token] per row
    path_hidden: object = None  # (row, n) -> hidden states of the first n path nodes (eager rounds only)


class EagerRounds:
    """Rounds on the live rows only: a finished row leaves the batch (its cache row is dropped), and the
    decoder attends to the valid prefix only (its length is known on the host from the token counts)."""

    def __init__(self, backbone, drafter, process_logits, state: DecodeState, tree: DraftTree, prompt_length: int,
                 chain_stop: float = 0.0):
        self.backbone, self.drafter, self.process_logits = backbone, drafter, process_logits
        self.chain_stop = chain_stop  # (the model passes 0 unless the drafter stops chains: PathDrafter.stops_early)
        self.state, self.tree, self.tt = state, tree, tree.tensors(state.lengths.device)
        self.prompt_length = prompt_length
        self.rows = list(range(state.next_token.shape[0]))  # call rows still in the state
        self.generated = [1] * len(self.rows)  # tokens emitted per call row (the prefill's included)

    def step(self, active: list[bool]) -> RoundResult:
        keep = [i for i, row in enumerate(self.rows) if active[row]]
        if len(keep) < len(self.rows):
            self.state.select_rows(torch.tensor(keep, device=self.state.lengths.device, dtype=torch.long))
            self.rows = [self.rows[i] for i in keep]
        st = self.state
        # While a row is live its cache holds the prompt and all but its last emitted token.
        upto = min(self.prompt_length + max(self.generated[r] for r in self.rows) - 1 + self.tree.num_nodes,
                   st.cache.capacity)
        num_generated = st.lengths - self.prompt_length + 1
        step = verify_round(self.backbone, self.drafter, self.process_logits, st, self.tree, self.tt, num_generated, upto,
                            self.chain_stop)
        st.lengths = st.lengths + step.accepted + 1
        st.hidden, st.next_token, st.history = step.best_hidden, step.next_token, step.history
        accepted, emitted = step.accepted.tolist(), step.emitted.tolist()  # the round's one host sync
        out_accepted, out_emitted = [None] * len(active), [None] * len(active)
        for i, row in enumerate(self.rows):
            out_accepted[row], out_emitted[row] = accepted[i], emitted[i]
            self.generated[row] += accepted[i] + 1
        index = {row: i for i, row in enumerate(self.rows)}
        return RoundResult(out_accepted, out_emitted,
                           lambda row, n: step.hidden[index[row], step.path[index[row], :n]])


def run_rounds(rounds, first_tokens: list[int], max_new_tokens: int, eos_token_ids, stats: MedusaStats | None = None,
               hidden_log: list | None = None) -> list[list[int]]:
    """Greedy Medusa decoding after prefill: the one loop over ``rounds.step`` (eager or captured).

    Returns a list (per row) of emitted tokens, starting with the prefill's first token; every later token
    is the base's argmax on the verified prefix, so the output equals plain greedy decoding. A row stops
    at EOS or ``max_new_tokens``. With ``hidden_log`` (a list per row, its first entry the prefill's
    hidden), the hidden state that produced each emitted token is appended (eager rounds).
    """
    stats = stats if stats is not None else MedusaStats()
    eos = set(int(e) for e in eos_token_ids)
    outputs = [[int(t)] for t in first_tokens]
    active = [not finished(o, eos, max_new_tokens) for o in outputs]
    while any(active):
        result = rounds.step(active)
        stats.rounds += 1
        for row, is_active in enumerate(active):
            if not is_active:
                continue
            added = record_round(outputs[row], result.accepted[row], result.emitted[row], eos, max_new_tokens, stats)
            if hidden_log is not None:
                hidden_log[row].extend(result.path_hidden(row, added))
            active[row] = not finished(outputs[row], eos, max_new_tokens)
    stats.new_tokens += sum(len(o) for o in outputs)
    return outputs


def record_round(tokens: list, accepted: int, emitted: list, eos, max_new_tokens: int, stats: MedusaStats) -> int:
    """Append one row's accepted drafts and the base's own next token, stopping at EOS or the
    length limit; returns how many tokens were appended (what the stats count). ``emitted`` holds one
    entry per depth the round drafted, then the base's own token."""
    before = len(tokens)
    for token in emitted[:accepted] + [emitted[-1]]:
        if finished(tokens, eos, max_new_tokens):
            break
        tokens.append(token)
    added = len(tokens) - before
    stats.row_rounds += 1
    stats.drafted_tokens += len(emitted) - 1
    stats.accepted_tokens += min(accepted, added)
    stats.emitted_tokens += added
    return added


def finished(tokens, eos, max_new_tokens) -> bool:
    return len(tokens) >= max_new_tokens or (bool(tokens) and tokens[-1] in eos)
