"""Family-agnostic Medusa decoding: draft trees, a preallocated KV cache, and the verify loop.

Nothing here knows about audio, Whisper or MERaLiON-2. A backbone adapter supplies:

* ``prefill(inputs, capacity) -> DecodeState``: run the encoder and the prompt, fill the cache;
* ``decode(state, tokens[B, T], depths[T], ancestors[T, T], upto) -> hidden[B, T, H]``: one forward of
  the text decoder over new tokens written into the cache at ``state.lengths + arange(T)``, attending
  to the first ``upto`` cache slots;
* ``logits(hidden) -> [..., V]``: the base output projection (with any soft-capping);
* ``process_logits(logits[B, T, V], num_generated[B, T], path) -> logits``: the base generate's
  logits processors (token suppression, min_new_tokens, Whisper's timestamp rules) as ``LogitsRules``,
  so argmax equals the base's choice at every node of the chunk.

A chain of K drafts is the tree with one node per depth, so one code path serves both. Drafting is the
drafter's (``medusa_heads.py``): ``drafter(state) -> chunk[B, N]``, the root token and the draft tokens.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch


# --------------------------------------------------------------------------- draft trees


@dataclass(frozen=True)
class DraftTree:
    """A sparse draft tree; node 0 is the root (the last emitted token), nodes 1.. are drafts.

    ``paths[i]`` lists the per-head top-k ranks leading to node i+1: ``[0]`` is head 0's best
    token, ``[0, 1]`` is head 1's second-best token after it, and so on.
    """

    paths: tuple[tuple[int, ...], ...]

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


# --------------------------------------------------------------------------- KV cache


class StaticKVCache:
    """Preallocated self-attention K/V for every layer, written by slot, rolled back by length.

    Slot s of row b holds the token at sequence column s (left padding included); the caller
    keeps ``lengths[b]`` = number of valid slots. Rejected drafts are simply overwritten later.
    """

    def __init__(self, num_layers, batch_size, num_kv_heads, capacity, head_dim, dtype, device):
        shape = (num_layers, batch_size, num_kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor):
        """keys/values [B, Hkv, T, D] go to slots [B, T]."""
        index = slots[:, None, :, None].expand_as(keys)
        self.keys[layer].scatter_(2, index, keys)
        self.values[layer].scatter_(2, index, values)

    def layer(self, layer: int, upto: int):
        return self.keys[layer, :, :, :upto], self.values[layer, :, :, :upto]

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor):
        """Copy slots src -> dst (per row, all layers); used to compact an accepted tree path."""
        n_layers, batch, heads, _, dim = self.keys.shape
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


# --------------------------------------------------------------------------- output projections

CPU_TRANSPOSED_COPY_LIMIT = 256 * 2**20  # bytes: larger projections are not duplicated
GPU_ROW_MULTIPLE = 64  # a GPU projection's rows are padded to this multiple when they are not one already


class DerivedCopy:
    """``derive(*tensors)`` kept until any of the tensors is replaced or changed in place (a transposed,
    padded or int8 copy of a weight)."""

    def __init__(self, derive):
        self.derive, self.value, self._source = derive, None, None

    def __call__(self, *tensors):
        source = tuple(None if t is None else (t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
        if self._source != source:
            self.value, self._source = self.derive(*tensors), source
        return self.value

    def clear(self):
        self.value, self._source = None, None


class Projection:
    """``hidden @ weight.T`` (+ bias) laid out for the device. On a CPU a vocabulary projection is a large
    matrix times a few rows, and MKL's row-major kernels for that are slow (tiny.en's 51 864 x 384: one
    row 9.4 ms through ``F.linear``, 4.1 ms from a transposed copy; five rows 19.8 ms, 7.6 ms as
    ``weight @ hidden.T``; measured on the 2-core development CPU). On a GPU a vocabulary whose size is not
    a multiple of 8 (Whisper's multilingual 51 865) leaves the logits' rows unaligned, and cuBLAS falls back
    to slow kernels for several rows (H200, whisper-base, 17 rows: 78 us, an sm75 ``align1`` kernel, where
    the weight alone is read in 11 us): it multiplies a copy padded to ``GPU_ROW_MULTIPLE`` rows and returns
    the first ``vocab`` columns. The same dot products: the result equals ``F.linear`` up to float rounding."""

    def __init__(self, weight_of, bias_of=lambda: None):
        self.weight_of, self.bias_of = weight_of, bias_of
        self._transposed = DerivedCopy(lambda weight: weight.detach().T.contiguous())
        self._padded = DerivedCopy(lambda weight, bias: pad_rows(weight, bias, GPU_ROW_MULTIPLE))

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight_of(), self.bias_of()
        if torch.is_grad_enabled() or not is_dense(weight):
            return torch.nn.functional.linear(hidden, weight, bias)  # (a quantised weight: its own kernel)
        if hidden.device.type != "cpu":
            # compiled code cannot check the copy against the weight: it uses the one prepare() made
            padded = self._padded.value if torch.compiler.is_compiling() else self.prepare()
            if padded is None:
                return torch.nn.functional.linear(hidden, weight, bias)
            # a fresh tensor with its own strides: on the slice (whose strides are the padded row's, even where
            # it counts as contiguous) index_fill's decomposition copies into an empty tensor, which a compiled
            # round's functional graph rejects
            logits = torch.nn.functional.linear(hidden, *padded)[..., : weight.shape[0]]
            return logits.clone(memory_format=torch.contiguous_format)
        flat = hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype)
        if flat.shape[0] == 1 and weight.numel() * weight.element_size() <= CPU_TRANSPOSED_COPY_LIMIT:
            out = flat @ self._transposed(weight)
        else:
            out = (weight @ flat.T).T
        if bias is not None:
            out = out + bias
        return out.reshape(*hidden.shape[:-1], weight.shape[0])

    def prepare(self):
        """The padded (weight, bias) a GPU projection multiplies (None where none is needed), made again
        when the weight was replaced or changed. Runs eagerly before rounds are compiled."""
        weight, bias = self.weight_of(), self.bias_of()
        if weight.device.type == "cpu" or not is_dense(weight) or weight.shape[0] % 8 == 0:
            self._padded.clear()
            return None
        return self._padded(weight, bias)


def pad_rows(weight: torch.Tensor, bias: torch.Tensor | None, multiple: int) -> tuple:
    """(weight, bias) with zero rows appended up to a multiple of ``multiple`` rows (copies)."""
    rows = -(-weight.shape[0] // multiple) * multiple
    padded = weight.new_zeros(rows, weight.shape[1])
    padded[: weight.shape[0]] = weight.detach()
    if bias is None:
        return padded, None
    padded_bias = bias.new_zeros(rows)
    padded_bias[: weight.shape[0]] = bias.detach()
    return padded, padded_bias


def attend_memory(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None = None):
    """Attention of a few queries over a long unmasked memory (the speech), [B, heads, n, D] -> same.
    Half precision on a GPU: FlashAttention's kernel for several queries, where cuDNN's (SDPA's default)
    costs twice as much (H200, 1 500 frames: 19.7 vs 11.0 us for 5-33 queries; 6.6 us for one query,
    where cuDNN's is the faster)."""
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and query.shape[-2] > 1:
        return torch.ops.aten._scaled_dot_product_flash_attention(query, keys, values, scale=scale)[0]
    return torch.nn.functional.scaled_dot_product_attention(query, keys, values, scale=scale)


def is_dense(weight) -> bool:
    """A plain floating-point tensor (not a quantised tensor subclass such as torchao's)."""
    return type(weight) in (torch.Tensor, torch.nn.Parameter) and weight.is_floating_point()


def dense(weight: torch.Tensor) -> torch.Tensor:
    """A quantised weight as a dense tensor; a plain one as it is."""
    return weight if is_dense(weight) else weight.dequantize()


# --------------------------------------------------------------------------- what adapters share


class Backbone:
    """The part every family adapter has in common, and what each family declares. Subclasses provide
    ``base`` (the loaded model), ``generation_config``, ``output_projection``, ``prefill``, ``decode``, ``logits``
    and ``format_output``; the class attributes and class methods below say what differs between families
    before any base is loaded (loading, detection, defaults, which generate options the loop takes as is)."""

    family: str = ""
    required_inputs: tuple = ()  # generate inputs a call must give (the first one may be passed positionally)
    max_audio_seconds: float = 30.0  # audio one call takes
    default_max_new_tokens: int = 224  # new tokens per window by default (transcription, benchmark, model card)
    window_seconds: float = 30.0  # audio per window in the transcription command
    timestamped: bool = False  # generate(return_timestamps=True, return_segments=True) gives the base's segments
    asr_pipeline: bool = False  # transformers' "automatic-speech-recognition" pipeline runs this family's artifacts
    processor_remote_code: bool = False  # the base's processor is remote code
    # generate options this family's decoding leaves out, with the values that change nothing (read-only)
    greedy_as_is: dict = {}
    # read from the base's own generation config by the adapter: a call that changes them goes to the base
    base_config_settings: tuple = ()
    default_eos_token_ids: tuple = ()

    @classmethod
    def is_model_type(cls, model_type: str) -> bool:
        """Whether a base whose config says ``model_type`` is of this family."""
        return model_type == cls.family

    @classmethod
    def is_model(cls, base) -> bool:
        """Whether the loaded model ``base`` is of this family."""
        return cls.is_model_type(getattr(base.config, "model_type", ""))

    @classmethod
    def load_base(cls, source: str, load_kwargs: dict):
        """The base model from a folder or Hub id (``from_pretrained`` keyword arguments ``load_kwargs``)."""
        raise NotImplementedError

    @classmethod
    def sampling_option(cls, kwargs: dict) -> tuple[str, str] | None:
        """(option, why) when a call's option makes this family's generate sample although its generation
        mode says greedy; None when it does not."""
        return None

    def prepare_rounds(self) -> None:
        """Eager set-up before rounds are captured or compiled (the output projection's padded copy)."""
        self._projection.prepare()

    @property
    def vocab_size(self) -> int:
        return self.output_projection.weight.shape[0]

    @property
    def eos_token_ids(self) -> list[int]:
        eos = getattr(self.generation_config, "eos_token_id", None)
        if eos is None:
            return list(self.default_eos_token_ids)
        return list(eos) if isinstance(eos, (list, tuple)) else [eos]

    @property
    def pad_token_id(self) -> int:
        pad = getattr(self.generation_config, "pad_token_id", None)
        return pad if pad is not None else self.eos_token_ids[0]

    speech_heads: int | None = None  # heads of the decoder's cross-attention over the speech (Whisper)

    # ------------------------------------------------------------------ audio in, text out (family specifics)
    def check_prompt_options(self, language=None, task=None) -> None:
        """ValueError naming the problem when this base cannot take the language or task."""
        if language or task:
            raise ValueError(f"language/task apply to Whisper bases, not to {type(self).__name__}'s "
                             f"(got language={language!r}, task={task!r}).")

    def effective_prompt_options(self, language=None, task=None) -> tuple:
        """The language and task a call really asks for (options that change nothing dropped)."""
        return language, task

    def max_new_tokens_limit(self, language=None, task=None) -> int | None:
        """The most new tokens one call can ask for, or None where this base sets no limit here."""
        return None

    def audio_inputs(self, processor, audios: list, instruction=None, language=None, task=None,
                     return_attention_mask: bool = False) -> dict:
        """A batch of 16 kHz mono float arrays -> the base's generate inputs (``return_attention_mask``: with
        the mask of each row's audio frames, where the family's processor makes one only on request)."""
        raise NotImplementedError

    def decode_text(self, tokenizer, sequences: torch.Tensor, inputs: dict | None = None) -> list[str]:
        return [t.strip() for t in tokenizer.batch_decode(sequences, skip_special_tokens=True)]

    def speech_memory(self, state) -> tuple:
        """(keys, values) [B, heads, L, D] of the last decoder layer's attention over the speech."""
        raise ValueError(f"{type(self).__name__} has no cross-attention over the speech to draft from.")

    def windowed(self, kwargs: dict) -> bool:
        """Whether a call takes the base's own generate, with our decoding for each window it hands over
        (``window_plan``), instead of being decoded here directly."""
        return False

    def window_output(self, sequences: torch.Tensor, prompt_length: int, generation_config, model_kwargs: dict):
        """A window decoded for the base's generate (``window_plan``) as that generate takes it back."""
        return sequences

    def check_word_timestamps(self) -> None:
        """ValueError naming the problem when this base cannot time the words it transcribes."""
        raise ValueError(f"word timestamps come from Whisper's cross-attention alignment heads; "
                         f"{type(self).__name__} has none")

    def fuse_projections(self) -> bool:
        """Optionally merge projections into fewer, larger GEMMs for the GPU rounds; True if done."""
        return False

    def start_decoding(self, state: "DecodeState", hidden: torch.Tensor, prompt: torch.Tensor, process_logits):
        """The prefill's last step: the logits rules' history, then the first token (the processed argmax
        after the prompt's last hidden state ``hidden[:, -1]``)."""
        batch, device = hidden.shape[0], hidden.device
        state.hidden = hidden[:, -1]
        state.history = process_logits.start(batch, device)
        nothing_yet = torch.zeros(batch, 1, dtype=torch.long, device=device)
        path = ChunkPath(prompt[:, -1:].to(device), DraftTree(()).tensors(device), state.history, nothing_yet)
        state.next_token = process_logits(self.logits(hidden[:, -1:]), nothing_yet, path)[:, -1].argmax(-1)

    def padded(self, rows: list[list[int]], like: torch.Tensor) -> torch.Tensor:
        """Token rows right-padded with the pad id into one [B, max_len] tensor."""
        out = torch.full((len(rows), max((len(r) for r in rows), default=0)), self.pad_token_id,
                         dtype=torch.long, device=like.device)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return out


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

    def __call__(self, logits: torch.Tensor, num_generated: torch.Tensor, path: ChunkPath | None = None):
        return logits

    def start(self, batch: int, device) -> dict:
        return {}

    def advance(self, path: ChunkPath, best: torch.Tensor) -> dict:
        """The history after the round that accepted the path to ``best`` [B]."""
        return path.history


class ChainedRules(LogitsRules):
    """Rules applied in order, as the base applies its list of processors."""

    def __init__(self, *rules: LogitsRules):
        self.rules = rules
        self.key = tuple(rule.key for rule in rules)

    def __call__(self, logits, num_generated, path=None):
        for rule in self.rules:
            logits = rule(logits, num_generated, path)
        return logits

    def start(self, batch, device) -> dict:
        return {name: value for rule in self.rules for name, value in rule.start(batch, device).items()}

    def advance(self, path, best) -> dict:
        return {name: value for rule in self.rules for name, value in rule.advance(path, best).items()}


class SuppressionRules(LogitsRules):
    """The base generate's token-blocking processors: ``always`` ids are never chosen, ``at_begin`` ids not
    as the first token, EOS not before ``min_new_tokens`` (``num_generated[b, t]`` counts the tokens generated
    before the one chunk row t predicts). Blocked ids are written in place (a few ids, not a
    pass over the vocabulary)."""

    def __init__(self, vocab: int, device, eos_token_ids, min_new_tokens=None, always=None, at_begin=None):
        self.suppress = _token_ids(always, vocab, device)
        self.begin = _token_ids(at_begin, vocab, device)
        self.eos = _token_ids(eos_token_ids, vocab, device)
        self.min_new_tokens = min_new_tokens
        self.key = ("suppress", *(tuple(t.tolist()) for t in (self.suppress, self.begin, self.eos)), min_new_tokens)

    def __call__(self, logits, num_generated, path=None):
        blocked = float("-inf")
        if self.suppress.numel():
            logits = logits.index_fill(-1, self.suppress, blocked)
        if self.begin.numel():
            logits = _block_where(logits, self.begin, num_generated == 0)
        if self.min_new_tokens and self.eos.numel():
            logits = _block_where(logits, self.eos, num_generated < self.min_new_tokens)
        return logits


def _block_where(logits: torch.Tensor, ids: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """-inf for ``ids`` at the positions ``where`` [...] holds."""
    return logits.scatter(-1, ids.expand(*logits.shape[:-1], -1),
                          torch.where(where[..., None], float("-inf"), logits[..., ids]))


def _token_ids(token_ids, vocab: int, device) -> torch.Tensor:
    ids = sorted({int(t) for t in (token_ids or []) if 0 <= int(t) < vocab})
    return torch.tensor(ids, dtype=torch.long, device=device)


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
                 num_generated: torch.Tensor, upto: int) -> VerifiedRound:
    """Draft from the state, run ONE decoder pass over [last token + drafts] attending to ``upto`` cache
    slots, accept the longest prefix equal to the base's argmax and compact its K/V in the cache.
    ``drafter(state) -> chunk [B, N]`` (None: no drafts). Host-sync free."""
    chunk = drafter(state) if drafter is not None else state.next_token[:, None]
    hidden = backbone.decode(state, chunk, tt.depths, tt.ancestors, upto)
    logits = backbone.logits(hidden)
    path = ChunkPath(chunk, tt, state.history, num_generated[:, None] + tt.depths[None, :])
    predicted = process_logits(logits, path.num_generated, path).argmax(dim=-1)
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

    def __init__(self, backbone, drafter, process_logits, state: DecodeState, tree: DraftTree, prompt_length: int):
        self.backbone, self.drafter, self.process_logits = backbone, drafter, process_logits
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
        step = verify_round(self.backbone, self.drafter, self.process_logits, st, self.tree, self.tt, num_generated, upto)
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
    depth = rounds.tree.depth
    while any(active):
        result = rounds.step(active)
        stats.rounds += 1
        for row, is_active in enumerate(active):
            if not is_active:
                continue
            added = record_round(outputs[row], result.accepted[row], result.emitted[row], eos, max_new_tokens,
                                 stats, depth)
            if hidden_log is not None:
                hidden_log[row].extend(result.path_hidden(row, added))
            active[row] = not finished(outputs[row], eos, max_new_tokens)
    stats.new_tokens += sum(len(o) for o in outputs)
    return outputs


def record_round(tokens: list, accepted: int, emitted: list, eos, max_new_tokens: int, stats: MedusaStats,
                 depth: int) -> int:
    """Append one row's accepted drafts and the base's own next token, stopping at EOS or the
    length limit; returns how many tokens were appended (what the stats count)."""
    before = len(tokens)
    for token in emitted[:accepted] + [emitted[-1]]:
        if finished(tokens, eos, max_new_tokens):
            break
        tokens.append(token)
    added = len(tokens) - before
    stats.row_rounds += 1
    stats.drafted_tokens += depth
    stats.accepted_tokens += min(accepted, added)
    stats.emitted_tokens += added
    return added


def finished(tokens, eos, max_new_tokens) -> bool:
    return len(tokens) >= max_new_tokens or (bool(tokens) and tokens[-1] in eos)
