"""The output projection laid out for the device and the CPU routes of the decoder's products: ``Projection``,
``ScreenedArgmax`` (the exact argmax through a bf16 screen and a proof), ``fast_argmax``, ``linear`` for a few rows
through ``FastestForm`` (which times each product form once per shape on the machine), and the few-query speech
attention."""

from __future__ import annotations

import functools
import statistics
import time
import weakref

import torch

# --------------------------------------------------------------------------- output projections

CPU_TRANSPOSED_COPY_LIMIT = 256 * 2**20  # bytes: larger projections are not duplicated
GPU_ROW_MULTIPLE = 64  # a GPU projection's rows are padded to this multiple when they are not one already


class DerivedCopy:
    """``derive(*tensors)`` kept until any of the tensors is replaced or changed in place (a transposed,
    padded or int8 copy of a weight). A tensor made under ``torch.inference_mode`` has no version counter:
    only its replacement is seen."""

    def __init__(self, derive):
        self.derive, self.value, self._source = derive, None, None

    def __call__(self, *tensors):
        source = tuple(None if t is None else (t.data_ptr(), _version(t), t.dtype, t.device) for t in tensors)
        if self._source != source:
            self.value, self._source = self.derive(*tensors), source
        return self.value

    def clear(self):
        self.value, self._source = None, None


def _version(tensor: torch.Tensor) -> int | None:
    return None if tensor.is_inference() else tensor._version


class Projection:
    """``hidden @ weight.T`` (+ bias) laid out for the device. On a CPU a vocabulary projection is a large
    matrix times a few rows, and MKL's row-major kernels for that are slow: one row goes through a transposed
    copy, several as ``weight @ hidden.T``. On a GPU a vocabulary whose size is not a multiple of 8 (Whisper's
    multilingual 51 865) leaves the logits' rows unaligned, and cuBLAS falls back to slow kernels for several
    rows (``align1`` kernels, several times the cost of reading the weight): it multiplies a copy padded to
    ``GPU_ROW_MULTIPLE`` rows and returns the first ``vocab`` columns. The same dot products: the result equals ``F.linear`` up to float rounding."""

    def __init__(self, weight_of, bias_of=lambda: None):
        self.weight_of, self.bias_of = weight_of, bias_of
        self.screened_argmax = ScreenedArgmax(weight_of, bias_of)
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


class ScreenedArgmax:
    """The base's processed argmax over a float32 output projection on a CPU, exact, at a fraction of the full
    projection's cost: a bfloat16 copy of the weight scores every token (half the bytes, and the CPU's bf16 dot
    products), the ``SCREEN_CANDIDATES`` best are scored again in float32 from the weight itself, and a bound on
    the copy's error proves that no other token can beat the best of them; a row without that proof is
    projected in full. So the token is the one the full float32 projection picks (up to float32 rounding, as any
    other kernel for it), whatever the bound proves.

    The bound, for a row h (x = h in bf16) and any token j outside the candidates, whose screened score is at
    most t (the best score outside them): logit_j <= t + u |t| + eps_W |h| + N_W (|h - x| + K 2^-24 |x|) + slack,
    where u = 2^-8 (bf16 rounding of the score; with a bias, its roundings too), eps_W the largest |W_j - bf16(W_j)|, N_W the largest |bf16(W_j)|
    (Euclidean norms, so Cauchy-Schwarz bounds every dot product), K the width (float32 accumulation) and the
    slack covers float32 rounding of the exact scores. Only for rules that block tokens (``masks_only``): the
    screened scores then carry the same blocked tokens; or that, after blocking, apply one row-local rule that
    blocks every token below some id or none (``LogitsRules.screen_parts``: Whisper's timestamp rule), decided
    from the exact scores of the tokens from that id on and the best one below it (``_finish``). On the 28 real recordings (tiny.en, 2 425 verified rows
    of 16-node trees) every row was proved with 8 candidates; the bound was ~0.5 against a median margin of 6."""

    def __init__(self, weight_of, bias_of):
        self.weight_of, self.bias_of = weight_of, bias_of
        self._screen = DerivedCopy(screen_copy)
        self._packed = DerivedCopy(onednn_packed)  # the bf16 copy in oneDNN's own layout (None: not available)
        self.rows = self.projected_in_full = 0  # rows screened, and those the bound did not prove

    @staticmethod
    def applies(hidden: torch.Tensor, weight, rules) -> bool:
        return (hidden.device.type == "cpu" and is_dense(weight) and weight.dtype == torch.float32
                and rules.screen_parts() is not None and not torch.is_grad_enabled()
                and not torch.compiler.is_compiling())

    def __call__(self, hidden: torch.Tensor, masks, begin: int | None = None, finish=None) -> torch.Tensor:
        """[..., H] -> the processed argmax [...]. ``masks(logits)`` blocks tokens (-inf) and changes nothing else;
        ``finish`` (with ``begin``, see ``LogitsRules.screen_parts``) is a row-local rule after them that blocks
        every token below ``begin`` or none: the screen then finds the best token below ``begin``, the tokens from
        ``begin`` on (Whisper's timestamps) are scored exactly, and the rule is decided from those (``_finish``)."""
        weight, bias = self.weight_of(), self.bias_of()
        low, width, eps_w, norm_w = self._screen(weight)
        shape, vocab = hidden.shape[:-1], weight.shape[0]
        h = hidden.reshape(-1, hidden.shape[-1]).float()
        x = h.to(torch.bfloat16)
        screened = self._screen_product(x, low)  # [R, blocks * width] (padding rows score 0)
        screened[:, vocab:] = float("-inf")
        if bias is not None:
            screened[:, :vocab] += bias.to(screened.dtype)
        logits = screened[:, :vocab].view(*shape, vocab)
        blocked = masks(logits)
        if blocked is not logits:  # (masks that block in place return the logits themselves)
            logits.copy_(blocked)
        searched = screened
        if finish is not None:
            searched = screened.clone()
            searched[:, begin:] = float("-inf")
        token, best, proved = self._best_candidate(searched, h, x, weight, bias, width, eps_w, norm_w)
        if finish is not None:
            no_text = searched[:, :begin].amax(dim=-1) == float("-inf")  # (e.g. a first token: a timestamp)
            token, decided = self._finish(screened, token, best, h, weight, bias, begin, norm_w)
            proved = (proved | no_text) & decided
        self.rows += h.shape[0]
        if not bool(proved.all()):
            unproved = (~proved).nonzero()[:, 0]
            self.projected_in_full += len(unproved)
            full = (weight @ h[unproved].T).T
            if bias is not None:
                full = full + bias
            full = full.masked_fill(screened[unproved, :vocab] == float("-inf"), float("-inf"))
            token = token.index_put((unproved,), fast_argmax(full if finish is None else finish(full)))
        return token.reshape(shape)

    def _screen_product(self, x: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
        """``x @ low.T`` in bf16 (float32 sums) in the form this machine runs fastest: the copy as it is, or in
        oneDNN's own layout, made once (a second copy of the weight's size in bf16). Unpacked,
        oneDNN lays the copy out again on every call (``benchmarks/round_cost/screen_packing.py``)."""
        packed = self._packed(low)
        if packed is None:
            return cpu_linear(x, low)
        return SCREEN_PRODUCT((tuple(low.shape), x.shape[0]), x, low, packed)

    def _best_candidate(self, screened, h, x, weight, bias, width, eps_w, norm_w) -> tuple:
        """(the best token [R], its exact score [R], whether the bound proves no other token beats it [R])."""
        vocab = weight.shape[0]
        candidates, best_outside = _top_candidates(screened, width)
        exact = torch.bmm(weight[candidates.clamp(max=vocab - 1)], h[:, :, None])[..., 0]  # (padding: blocked)
        if bias is not None:
            exact = exact + bias[candidates.clamp(max=vocab - 1)]
        exact = exact.masked_fill(screened.gather(1, candidates) == float("-inf"), float("-inf"))
        best = exact.amax(dim=-1)
        # the lowest token id among equal best scores, as argmax over the whole vocabulary picks
        token = torch.where(exact == best[:, None], candidates, vocab).amin(dim=-1)
        # (not proved: NaN, or every candidate blocked)
        proved = best > self._largest_outside(best_outside.float(), h, x, bias, eps_w, norm_w) + 1e-6 * best.abs()
        return token, best, proved

    @staticmethod
    def _finish(screened, text_token, text_best, h, weight, bias, begin: int, norm_w: float) -> tuple:
        """(token [R], decided [R]) under the row-local rule that blocks every token below ``begin`` where the
        total probability of the tokens from ``begin`` on beats each one below it: as log-probabilities share the
        row's normaliser, that is ``logsumexp(scores from begin) > the best score below begin``, decided where the
        two differ by more than the float32 rounding of the scores (elsewhere, and where every token is blocked,
        not decided: projected in full)."""
        vocab = weight.shape[0]
        tail = h @ weight[begin:].T  # [R, vocab - begin]: scored exactly
        if bias is not None:
            tail = tail + bias[begin:]
        tail = tail.masked_fill(screened[:, begin:vocab] == float("-inf"), float("-inf"))
        total = tail.logsumexp(dim=-1)
        tail_best, tail_token = tail.max(dim=-1)  # (the first of equal maxima)
        tail_token = tail_token + begin
        overruled = total > text_best
        rounding = 8 * h.shape[-1] * 2**-24 * norm_w * h.norm(dim=-1) + 1e-5 * (1 + text_best.abs())
        decided = ((total - text_best).abs() > rounding) | torch.isinf(text_best) | torch.isinf(total)
        decided &= torch.isfinite(text_best) | torch.isfinite(total)
        token = torch.where(overruled | (tail_best > text_best), tail_token, text_token)
        return token, decided

    @staticmethod
    def _largest_outside(t, h, x, bias, eps_w: float, norm_w: float) -> torch.Tensor:
        """[R] the most any token outside the candidates can score, from the best screened score outside them."""
        # the screened score's bf16 roundings (of the product; with a bias, of the bias and the sum too)
        rounding = ROUNDING_BF16 * (1 + 2 * ROUNDING_BF16) * (
            t.abs() if bias is None else 2 * t.abs() + 2 * float(bias.abs().max()))
        weight_error = eps_w * h.norm(dim=-1)  # |(W_j - bf16(W_j)) . h|
        input_error, exact_rounding = ScreenedArgmax.arithmetic_errors(h, x, norm_w)
        largest = t + rounding + weight_error + input_error + exact_rounding
        return torch.where(t == float("-inf"), t, largest)  # (every token outside blocked)

    @staticmethod
    def arithmetic_errors(h, x, norm_w: float) -> tuple:
        """([R], [R]) what the screen's input and sums may add to any token's score, whatever the copy: the bf16
        input x for h with float32 sums, and the float32 rounding of the exact scores (ours and the full
        projection's)."""
        width, h_norm = h.shape[-1], h.norm(dim=-1)
        input_error = norm_w * ((h - x.float()).norm(dim=-1) + width * 2**-24 * x.float().norm(dim=-1))
        return input_error, 4 * width * 2**-24 * norm_w * h_norm


SCREEN_CANDIDATES = 8  # tokens per row scored again in float32
SCREEN_BLOCK = 256  # screened scores are searched block by block (a block's maximum first)
ROUNDING_BF16 = 2.0**-8


def onednn_packed(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` in oneDNN's blocked layout for its linear kernel (``onednn_linear``); None where this torch
    build has no oneDNN for it or its product does not run."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        onednn_linear(torch.zeros(1, weight.shape[1], dtype=weight.dtype), packed)  # (it runs here, or not at all)
        return packed
    except (AttributeError, RuntimeError, NotImplementedError):
        return None


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` [R, in] -> [R, out] from ``onednn_packed(weight)``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.cache
def packs_float32() -> bool:
    """Whether this torch build runs float32 products on oneDNN-packed weights (``onednn_packed``)."""
    return onednn_packed(torch.zeros(8, 8)) is not None


class PackedCopies:
    """One ``onednn_packed`` copy per weight tensor, made on first use, made again when the weight changes
    (``DerivedCopy``) and dropped with the weight."""

    def __init__(self):
        self._copies: dict[int, DerivedCopy] = {}

    def __call__(self, weight: torch.Tensor) -> torch.Tensor | None:
        copy = self._copies.get(id(weight))
        if copy is None:
            copy = self._copies[id(weight)] = DerivedCopy(onednn_packed)
            weakref.finalize(weight, self._copies.pop, id(weight), None)
        return copy(weight)

    def __len__(self) -> int:
        return len(self._copies)


def screen_copy(weight: torch.Tensor) -> tuple:
    """(bf16 copy padded with zero rows to whole blocks, block width, eps_W, N_W) for ``ScreenedArgmax``."""
    vocab = weight.shape[0]
    width = max(1, min(SCREEN_BLOCK, vocab // (SCREEN_CANDIDATES + 1)))
    low = pad_rows(weight.detach().to(torch.bfloat16), None, width)[0]
    error = (weight.detach() - low[:vocab].float()).norm(dim=1).max()
    return low, width, float(error) * (1 + 1e-6), float(low.float().norm(dim=1).max()) * (1 + 1e-6)


def _top_candidates(scores: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, blocks * width] -> the ``SCREEN_CANDIDATES`` best token ids [R, m] and the best score outside them
    [R]. The m + 1 best scores lie in the m + 1 blocks with the best maxima, so only those are searched."""
    rows, m = scores.shape[0], SCREEN_CANDIDATES
    blocks = scores.view(rows, -1, width)
    top_blocks = blocks.amax(dim=-1).topk(m + 1, dim=-1).indices  # [R, m + 1]
    gathered = blocks[torch.arange(rows)[:, None], top_blocks].flatten(1)  # [R, (m + 1) * width]
    values, where = gathered.topk(m + 1, dim=-1)
    tokens = top_blocks.gather(1, where // width) * width + where % width
    return tokens[:, :m], values[:, m]


def fast_argmax(scores: torch.Tensor, gpu_block: int = 2048) -> torch.Tensor:
    """``scores.argmax(-1)`` (the first maximum) over long rows in the form each device runs fastest: blocked (see
    ``blocked_argmax``) on a CPU, where argmax runs one scalar loop per row and a plain maximum is vectorised; blocked in
    compiled GPU rounds, where compiled argmax is one reduction per row, too few programs for a few long rows
    (``benchmarks/round_cost/blocked_argmax.py``), by blocks of ``gpu_block`` (``KernelOptions.gpu_argmax_block``; 0:
    plain); plain argmax elsewhere (eager GPU kernels, where it is one kernel against several)."""
    compiling = torch.compiler.is_compiling()
    if scores.device.type == "cpu" and not compiling:
        width = 1024
    elif scores.is_cuda and compiling:
        width = gpu_block
    else:
        width = 0
    if not width or scores.shape[-1] <= 2 * width:
        return scores.argmax(dim=-1)
    return blocked_argmax(scores, width)


def blocked_argmax(scores: torch.Tensor, width: int) -> torch.Tensor:
    """``scores.argmax(-1)``, the first maximum, found as the maximum of each block of ``width`` scores, the first
    block holding the best one, and the argmax inside that block: short reductions instead of one long one a row."""
    vocab = scores.shape[-1]
    flat = scores.reshape(-1, vocab)
    blocks = -(-vocab // width)
    if blocks * width != vocab:
        flat = torch.nn.functional.pad(flat, (0, blocks * width - vocab), value=float("-inf"))
    flat = flat.view(flat.shape[0], blocks, width)
    block = flat.amax(dim=-1).argmax(dim=-1)
    inside = flat.gather(1, block[:, None, None].expand(-1, 1, width)).squeeze(1).argmax(dim=-1)
    return (block * width + inside).reshape(scores.shape[:-1])


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


class FastestForm:
    """Forms of one product that compute the same dot products (equal up to float rounding), and the one this
    machine runs fastest, timed for each key (the operands' shapes and dtypes), the choice kept for the process.
    Which wins depends on the CPU, so it is measured, not assumed: for a few float32 rows ``W @ x.T`` beats
    ``F.linear`` on some CPUs and loses on others (those with AMX among them), and the crossing depends on the rows.

    By default the forms are timed on first use, in turn on the same operands. ``in_use=True`` times them on the
    calls themselves instead: the key's first calls run each form in turn (each call's output is its form's),
    until every form has ``FORM_TIMING_TURNS`` timings, so each is timed as the loop runs it, on the weights of
    every layer as they come from memory. (Timed back to back, a small weight stays in cache and the
    timings rank the forms differently from the loop.) A call's ``without`` names forms that cannot run for the key."""

    def __init__(self, in_use: bool = False, **forms):
        self.forms, self.in_use = forms, in_use
        self.chosen: dict = {}
        self.kept: dict = {}  # key text -> the form an earlier process on this machine chose (``recall_forms``)
        self.new: dict = {}  # key text -> a form chosen here, not yet handed to ``keep_new_forms``
        self._timings: dict = {}  # key -> {form: [seconds, ...]} while the key is timed in use

    def __call__(self, key, *operands, without: tuple = ()):
        name = self.chosen.get(key) or self._recalled(key, without)
        if name is not None:
            return self.forms[name](*operands)
        if not self.in_use:
            name = self._choose(key, self._fastest(operands, without))
            return self.forms[name](*operands)
        return self._timed_in_use(key, operands, without)

    def may_choose(self, key, name: str) -> bool:
        """Whether ``name`` is this key's form or may still become it."""
        chosen = self.chosen.get(key) or self._kept(key)
        return chosen is None or chosen == name

    def _kept(self, key) -> str | None:
        return self.kept.get(repr(key)) if self.kept else None

    def _recalled(self, key, without: tuple) -> str | None:
        name = self._kept(key)
        if name not in self.forms or name in without:
            return None
        self.chosen[key] = name
        return name

    def _choose(self, key, name: str) -> str:
        self.chosen[key] = self.new[repr(key)] = name
        return name

    def _fastest(self, operands, without: tuple = ()) -> str:
        seconds = {name: [] for name in self.forms if name not in without}
        for _ in range(FORM_TIMING_TURNS):  # in turn, so drift falls on every form alike
            for name in seconds:
                start = time.perf_counter()
                self.forms[name](*operands)
                seconds[name].append(time.perf_counter() - start)
        return self._least(seconds)

    def _timed_in_use(self, key, operands, without: tuple):
        seconds = self._timings.setdefault(key, {name: [] for name in self.forms if name not in without})
        if len(seconds) == 1:  # nothing to choose between
            self.chosen[key] = next(iter(self._timings.pop(key)))
            return self.forms[self.chosen[key]](*operands)
        name = min(seconds, key=lambda n: len(seconds[n]))  # (in turn)
        start = time.perf_counter()
        out = self.forms[name](*operands)
        seconds[name].append(time.perf_counter() - start)
        if all(len(times) >= FORM_TIMING_TURNS for times in seconds.values()):
            self._choose(key, self._least(self._timings.pop(key)))
        return out

    @staticmethod
    def _least(seconds: dict) -> str:
        return min(seconds, key=lambda name: statistics.median(seconds[name][1:]))  # (the first turn warms up)


FORM_TIMING_TURNS = 7


def _rows_product(x: torch.Tensor, weight: torch.Tensor, bias, packed=None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def _packed_product(x: torch.Tensor, weight: torch.Tensor, bias, packed) -> torch.Tensor:
    return onednn_linear(x, packed, bias)


def _columns_product(x: torch.Tensor, weight: torch.Tensor, bias, packed=None) -> torch.Tensor:
    """``x @ weight.T + bias`` as ``weight @ x.T`` with at least two columns (one row is doubled), contiguous."""
    rows = x.shape[0]
    columns = (x if rows > 1 else torch.cat([x, x])).T
    out = torch.mm(weight, columns) if bias is None else torch.addmm(bias[:, None], weight, columns)
    return transposed_copy(out[:, :rows])  # (strided, it sent the attention's next product to a slow kernel)


TILED_TRANSPOSE_MIN_ELEMENTS = 60 * 60


def transposed_copy(matrix: torch.Tensor) -> torch.Tensor:
    """``matrix.T.contiguous()``. PyTorch copies the transpose of a contiguous matrix of 3 600 elements or more
    through a single-threaded kernel of 60 x 60 tiles, slow for a few columns; the same copy seen as 3-D goes
    through the general copy kernel, several times faster there."""
    if matrix.numel() < TILED_TRANSPOSE_MIN_ELEMENTS:
        return matrix.T.contiguous()
    rows, columns = matrix.shape
    return matrix.unsqueeze(1).permute(2, 1, 0).contiguous().view(columns, rows)


# A few rows through a decoder's weight, timed as the loop runs them; a float32 weight also in oneDNN's own layout
# (a second copy of it, made on first use), which some CPUs multiply faster
# (``benchmarks/round_cost/float32_packing.py``).
FEW_ROWS_PRODUCT = FastestForm(in_use=True, rows=_rows_product, columns=_columns_product, packed=_packed_product)
SCREEN_PRODUCT = FastestForm(unpacked=lambda x, low, packed: cpu_linear(x, low),
                             packed=lambda x, low, packed: onednn_linear(x, packed))
CPU_FEW_ROWS = 64  # rows of a product on a CPU that ``FEW_ROWS_PRODUCT`` times its forms for (a 63-node tree)
# A few float32 queries' scores over the speech's keys [B, heads, L, D], timed as the loop runs them: with the keys on
# the left, MKL runs its product for a few columns, faster on some CPUs than ``query @ keys^T``.
SPEECH_SCORES = FastestForm(in_use=True, keys_right=lambda query, keys: torch.matmul(query, keys.transpose(-1, -2)),
                            keys_left=lambda query, keys: torch.matmul(keys, query.transpose(-1, -2)).transpose(-1, -2))
PACKED_WEIGHTS = PackedCopies()
TIMED_FORMS = {"few_rows_product": FEW_ROWS_PRODUCT, "screen_product": SCREEN_PRODUCT, "speech_scores": SPEECH_SCORES}
_RECALLED_CONTEXTS: set = set()


def recall_forms(store, context: str) -> None:
    """The product forms earlier processes chose on this machine (kept in ``store`` under ``context``: the machine,
    torch, this code, the model), used where this process has not chosen one: a new process's first call then
    times none of them (once a process and context)."""
    if context in _RECALLED_CONTEXTS:
        return
    _RECALLED_CONTEXTS.add(context)
    for name, choices in store.recall_forms(context).items():
        if name in TIMED_FORMS and isinstance(choices, dict):
            TIMED_FORMS[name].kept.update(choices)


def keep_new_forms(store, context: str) -> None:
    """The forms chosen in this process since the last call, kept in ``store`` for later processes."""
    new = {name: dict(forms.new) for name, forms in TIMED_FORMS.items() if forms.new}
    if new:
        for forms in TIMED_FORMS.values():
            forms.new.clear()
        store.remember_forms(context, new)


def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x [R, in] on a CPU: up to ``CPU_FEW_ROWS`` rows in the form this machine
    runs fastest for these shapes (``FEW_ROWS_PRODUCT``); a float32 weight is packed for oneDNN only while that
    form may be chosen for its key."""
    if x.shape[0] > CPU_FEW_ROWS:
        return torch.nn.functional.linear(x, weight, bias)
    key = (tuple(weight.shape), weight.dtype, x.shape[0], bias is not None)
    packed = None
    if weight.dtype == torch.float32 and packs_float32() and FEW_ROWS_PRODUCT.may_choose(key, "packed"):
        packed = PACKED_WEIGHTS(weight)
        if packed is None and FEW_ROWS_PRODUCT.chosen.get(key) == "packed":  # (a weight oneDNN would not pack)
            return torch.nn.functional.linear(x, weight, bias)
    return FEW_ROWS_PRODUCT(key, x, weight, bias, packed, without=() if packed is not None else ("packed",))


def linear(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for the base's ``nn.Linear`` layers in a decode chunk: on a CPU, float32 rows go through
    ``cpu_linear``."""
    if type(module) is not torch.nn.Linear or module._forward_hooks or module._forward_pre_hooks:
        return module(x)
    return weight_product(x, module.weight, module.bias)


def weight_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` (a base's weight, or several fused into one): on a CPU, float32 rows go
    through ``cpu_linear``."""
    if (x.device.type != "cpu" or x.dtype != torch.float32 or not is_dense(weight) or weight.dtype != torch.float32
            or torch.is_grad_enabled() or torch.compiler.is_compiling()):
        return torch.nn.functional.linear(x, weight, bias)
    rows = x.numel() // x.shape[-1]
    return cpu_linear(x.reshape(rows, x.shape[-1]), weight, bias).view(*x.shape[:-1], weight.shape[0])


def speech_scores(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``query @ keys^T`` [B, heads, n, L] for a few float32 queries over the speech's keys on a CPU in the form this
    machine runs fastest (``SPEECH_SCORES``); elsewhere as it is."""
    if query.device.type != "cpu" or torch.compiler.is_compiling():
        return torch.matmul(query, keys.transpose(-1, -2))
    return SPEECH_SCORES((tuple(keys.shape), keys.dtype, query.shape[-2]), query, keys)


# FlashAttention beats queries folded into heads only where both the rows' queries and the folded heads are many
# (benchmarks/round_cost/h100_memory_attention_batches.json)
MAX_FOLDED_QUERIES = 96  # batch x queries up to which the folded form is the faster whatever the heads
MAX_FOLDED_HEADS = 400  # heads x queries up to which it is the faster whatever the batch


MEMORY_CHUNKS, MIN_MEMORY_CHUNK = 16, 64


def _memory_chunks(length: int) -> int:
    """How many slices the memory's positions are summed in: the largest divisor of ``length`` up to
    ``MEMORY_CHUNKS`` that leaves slices of at least ``MIN_MEMORY_CHUNK`` positions (1: one product)."""
    fitting = [c for c in range(1, MEMORY_CHUNKS + 1) if length % c == 0 and length // c >= MIN_MEMORY_CHUNK]
    return max(fitting) if fitting else 1  # (not max(..., default=): Dynamo breaks the compiled round's graph there)


def _attend_memory_float32(query, keys, values, scale: float) -> torch.Tensor:
    """Float32 attention over the speech on a GPU, as matrix products. SDPA's float32 kernel (memory-efficient
    attention) runs one block per head and walks every frame in it, whatever the number of queries, and cuBLAS
    runs ``probs @ values`` for a few rows as one long reduction; summing slices of the frames as a batch of
    products, then adding them, spreads that reduction over the GPU (``benchmarks/float32_gpu``)."""
    batch, heads, n, width = query.shape
    length = keys.shape[-2]
    probs = torch.softmax(torch.matmul(query if scale == 1.0 else query * scale, keys.transpose(-1, -2)), dim=-1)
    chunks = _memory_chunks(length) if n > 1 else 1
    if chunks == 1:
        return torch.matmul(probs, values)
    rows, part = batch * heads, length // chunks
    sliced = probs.reshape(rows, n, chunks, part).transpose(1, 2).reshape(rows * chunks, n, part)
    partial = torch.bmm(sliced, values.reshape(rows * chunks, part, width))
    return partial.view(rows, chunks, n, width).sum(1).view(batch, heads, n, width)


def folds_queries(batch: int, heads: int, n: int) -> bool:
    """Whether ``attend_memory`` runs ``n`` queries a row over the speech as heads of their own (else FlashAttention)."""
    return batch * n <= MAX_FOLDED_QUERIES or heads * n <= MAX_FOLDED_HEADS


def attend_memory(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None = None):
    """Attention of a few queries over a long unmasked memory (the speech), [B, heads, n, D] -> same.
    Half precision on a GPU, several queries: each query becomes a head of its own over its head's keys and
    values (grouped-query attention), so SDPA runs cuDNN's kernel for one query, which for a few queries is faster
    than FlashAttention's split-KV kernel and its combine or cuDNN's kernel for several queries, and at large
    batches than FlashAttention's one block per head and query block. Past both ``MAX_FOLDED_QUERIES`` queries
    in all and ``MAX_FOLDED_HEADS`` folded heads FlashAttention is the faster again."""
    batch, heads, n, width = query.shape
    if query.is_cuda and query.dtype == torch.float32:
        return _attend_memory_float32(query, keys, values, width ** -0.5 if scale is None else scale)
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and n > 1:
        form = attend_folded if folds_queries(batch, heads, n) else attend_flash
        return form(query, keys, values, scale)
    return torch.nn.functional.scaled_dot_product_attention(query, keys, values, scale=scale)


def attend_folded(query, keys, values, scale: float | None = None) -> torch.Tensor:
    """Each of a row's queries as a head of its own over its head's keys and values (grouped-query attention)."""
    batch, heads, n, width = query.shape
    folded = query.reshape(batch, heads * n, 1, width)
    out = torch.nn.functional.scaled_dot_product_attention(folded, keys, values, scale=scale, enable_gqa=True)
    return out.view(batch, heads, n, width)


def attend_flash(query, keys, values, scale: float | None = None) -> torch.Tensor:
    return torch.ops.aten._scaled_dot_product_flash_attention(query, keys, values, scale=scale)[0]


def is_dense(weight) -> bool:
    """A plain floating-point tensor (not a quantised tensor subclass such as torchao's)."""
    return type(weight) in (torch.Tensor, torch.nn.Parameter) and weight.is_floating_point()


def dense(weight: torch.Tensor) -> torch.Tensor:
    """A quantised weight as a dense tensor; a plain one as it is."""
    return weight if is_dense(weight) else weight.dequantize()
