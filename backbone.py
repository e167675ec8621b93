"""What every family adapter shares: the ``Backbone`` base class with what each family declares, and the
device-laid-out output projection (plus the few-query speech attention) the adapters and heads use."""

from __future__ import annotations

import torch

try:
    from .draft_trees import DraftTree
    from .kv_cache import DecodeState
    from .logits_rules import ChunkPath
except ImportError:
    from draft_trees import DraftTree
    from kv_cache import DecodeState
    from logits_rules import ChunkPath


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

    def start_decoding(self, state: DecodeState, hidden: torch.Tensor, prompt: torch.Tensor, process_logits):
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
