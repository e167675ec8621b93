"""What every family adapter shares: the ``Backbone`` base class with what each family declares, and the helpers
the adapters use (compiling a fixed-shape pass, the speech encoder's layout, fused projections). The output projection
and the CPU kernels it runs are ``cpu_kernels.py``'s."""

from __future__ import annotations

import contextlib
import os

import torch

try:
    from .cpu_kernels import ScreenedArgmax, fast_argmax, is_dense
    from .draft_trees import DraftTree
    from .kv_cache import DecodeState
    from .logits_rules import ChunkPath
    from .medusa_options import KernelOptions, compile_cache_dir
except ImportError:
    from cpu_kernels import ScreenedArgmax, fast_argmax, is_dense
    from draft_trees import DraftTree
    from kv_cache import DecodeState
    from logits_rules import ChunkPath
    from medusa_options import KernelOptions, compile_cache_dir


# --------------------------------------------------------------------------- helpers the adapters share

def compile_fixed_shape(fn):
    """``torch.compile`` of a fixed-shape pass (a round, a prompt's pass). Every shape (batch size, draft tree,
    cache capacity, prompt length) is one more specialisation of the same code, so the recompile limit must allow
    many of them. Inductor's caches go to ``compile_cache_dir()`` (read before the first compile of the process)."""
    import torch._dynamo

    folder = compile_cache_dir()
    if folder is not None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 64))
    return torch.compile(fn, dynamic=False)


def encoder_output(encoder: torch.nn.Module, features: torch.Tensor) -> torch.Tensor:
    """``encoder(features).last_hidden_state`` of a Whisper speech encoder, its residual stream contiguous
    (``contiguous_stream``)."""
    with contiguous_stream(encoder):
        return encoder(features).last_hidden_state


@contextlib.contextmanager
def contiguous_stream(encoder: torch.nn.Module):
    """While it lasts, a Whisper speech encoder's residual stream is laid out contiguously. The encoder permutes
    its convolutions' [B, C, T] output to [B, T, C] and adds the positions to that view, so the stream keeps the
    strides of [B, C, T] through every layer: each layer norm copies it first and each residual add runs
    strided, a sizeable share of the encoder on a GPU and a CPU alike (``benchmarks/round_cost/encoder_layout.py``).
    The same values in the same order: only the layout the first layer receives changes."""
    layers = getattr(encoder, "layers", None)
    # compiled, Inductor lays the stream out itself, and registering a hook there would break the graph
    hooked = bool(layers) and not torch.compiler.is_compiling()
    handle = layers[0].register_forward_pre_hook(_contiguous_first_argument, with_kwargs=True) if hooked else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def _contiguous_first_argument(module, args, kwargs):
    if args and isinstance(args[0], torch.Tensor):
        return (args[0].contiguous(), *args[1:]), kwargs
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"].contiguous()}
    return None


def fusable(linears, biases: bool = False) -> bool:
    """Whether ``nn.Linear`` layers can share one weight tensor (``fuse_linears``): plain layers (not quantised
    ones, which may have no dense weight at all) of one dtype, device and input width, without biases unless
    ``biases``."""
    if not all(type(linear) is torch.nn.Linear and is_dense(linear.weight) and (biases or linear.bias is None)
               for linear in linears):  # (a torchao weight-only layer is an nn.Linear whose weight is not dense)
        return False
    weights = [linear.weight for linear in linears]
    return len({(w.dtype, w.device, w.shape[1]) for w in weights}) == 1 and weights[0].device.type != "meta"


def fuse_linears(linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The layers' weights (and biases, zeros for a layer without one) concatenated row-wise, each layer's
    own weight and bias becoming a view of its block: one product for all of them, no memory added."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    bias = None
    if any(linear.bias is not None for linear in linears):
        bias = torch.cat([linear.weight.new_zeros(linear.out_features) if linear.bias is None else linear.bias.detach()
                          for linear in linears])
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = weight[start:start + rows]
        if linear.bias is not None:
            linear.bias.data = bias[start:start + rows]
        start += rows
    return weight, bias


def backs(fused: torch.Tensor, first: torch.nn.Module) -> bool:
    """Whether ``first`` is still the layer whose weight ``fuse_linears`` made a view of ``fused`` (``.to()`` or a
    reload replace the weight, swapping in a quantised layer replaces the layer)."""
    weight = first.weight if type(first) is torch.nn.Linear else None
    return weight is not None and weight.data_ptr() == fused.data_ptr() and weight.dtype == fused.dtype


# --------------------------------------------------------------------------- what adapters share


class Backbone:
    """The part every family adapter has in common, and what each family declares. Subclasses provide
    ``base`` (the loaded model), ``generation_config``, ``output_projection``, ``prefill``, ``decode``, ``logits``
    and ``format_output``; the class attributes and class methods below say what differs between families
    before any base is loaded (loading, detection, defaults, which generate options the loop takes as is)."""

    family: str = ""
    kernels = KernelOptions()  # the rounds' kernel forms: the model sets its options' (MedusaOptions.kernels)
    required_inputs: tuple = ()  # generate inputs a call must give (the first one may be passed positionally)
    max_audio_seconds: float = 30.0  # audio one call takes
    default_max_new_tokens: int = 224  # new tokens per window by default (transcription, benchmark, model card)
    window_seconds: float = 30.0  # audio per window in the transcription command
    timestamped: bool = False  # generate(return_timestamps=True, return_segments=True) gives the base's segments
    asr_pipeline: bool = False  # transformers' "automatic-speech-recognition" pipeline runs this family's artifacts
    word_timestamps: bool = False  # generate(return_token_timestamps=True) times the tokens (cross-attention alignment)
    temperature_fallback: bool = False  # the base's generate can retry a window at higher temperatures
    output_has_prompt: bool = False  # generate's sequences start with the prompt (a decoder-only base)
    remote_code: bool = False  # the base's model runs its own code (trust_remote_code; only with the caller's consent)
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
    def device(self) -> torch.device:
        """The base's device as ``base.device`` gives it (its first parameter's), without the generators that
        property walks the modules with: a call reads it a dozen times."""
        stack = [self.base]
        while stack:
            module = stack.pop()
            for parameter in module._parameters.values():
                if parameter is not None:
                    return parameter.device
            stack += [m for m in reversed(module._modules.values()) if m is not None]
        return self.base.device

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
    screens_argmax: bool = False  # the logits are the output projection's scores, unchanged (no soft-capping)

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

    def prompt_languages(self, prompt: torch.Tensor) -> set[str]:
        """The language codes a call's prompt [B, P] names (any row); empty where its prompt names none."""
        return set()

    def windowed(self, kwargs: dict) -> bool:
        """Whether a call takes the base's own generate, with our decoding for each window it hands over
        (``window_plan``), instead of being decoded here directly."""
        return False

    def around_base_generate(self, capture=None):
        """A context for a windowed call's run of the base's generate, in which this backbone may run parts of
        the base faster (``capture``: a ``CapturedCalls`` on a GPU) with the same results."""
        return contextlib.nullcontext()

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

    def predict(self, hidden: torch.Tensor, rules, num_generated: torch.Tensor, path: ChunkPath) -> torch.Tensor:
        """The base's own next token after each hidden state [B, T, H] -> [B, T]: the argmax of its logits under
        its generate's rules (``rules(logits, num_generated, path)``). Where the logits are the output
        projection's scores themselves (``screens_argmax``), a float32 CPU projection is screened
        (``ScreenedArgmax``: the same tokens, a fraction of the cost)."""
        projection = self._projection
        if self.screens_argmax and ScreenedArgmax.applies(hidden, projection.weight_of(), rules):
            masks, begin, finish = rules.screen_parts()
            return projection.screened_argmax(hidden, lambda logits: masks(logits, num_generated, path), begin, finish)
        return fast_argmax(rules(self.logits(hidden), num_generated, path), self.kernels.gpu_argmax_block)

    def start_decoding(self, state: DecodeState, hidden: torch.Tensor, prompt: torch.Tensor, process_logits):
        """The prefill's last step: the logits rules' history, then the first token (the processed argmax
        after the prompt's last hidden state ``hidden[:, -1]``)."""
        batch, device = hidden.shape[0], hidden.device
        state.hidden = hidden[:, -1]
        state.history = process_logits.start(batch, device)
        nothing_yet = torch.zeros(batch, 1, dtype=torch.long, device=device)
        path = ChunkPath(prompt[:, -1:].to(device), DraftTree(()).tensors(device), state.history, nothing_yet)
        state.next_token = self.predict(hidden[:, -1:], process_logits, nothing_yet, path)[:, -1]

    def padded(self, rows: list[list[int]], like: torch.Tensor) -> torch.Tensor:
        """Token rows right-padded with the pad id into one [B, max_len] tensor (one copy to the device, not one a
        row)."""
        width = max((len(r) for r in rows), default=0)
        padded = [list(row) + [self.pad_token_id] * (width - len(row)) for row in rows]
        return torch.tensor(padded, dtype=torch.long).reshape(len(rows), width).to(like.device)
