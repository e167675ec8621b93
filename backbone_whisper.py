"""Whisper backbone adapter: prefill (encoder + decoder prompt) and a cache-owning decoder forward.

The forward reuses the base model's own modules (layer norms, projections, MLP) so the numerics are
the library's; only attention over our preallocated cache is written here.
"""

from __future__ import annotations

import contextlib

import math

import torch
import torch.nn.functional as F

try:
    from .backbone import Backbone, backs, contiguous_stream, encoder_output, fusable, fuse_linears
    from .cpu_kernels import Projection, attend_memory, is_dense, linear, speech_scores, weight_product
    from .kv_cache import DecodeState, StaticKVCache, attention_mask
    from .logits_rules import ChainedRules, ChunkPath, LogitsRules, SuppressionRules, device_ids
    from .medusa_decoding import WindowPlan
except ImportError:
    from backbone import Backbone, backs, contiguous_stream, encoder_output, fusable, fuse_linears
    from cpu_kernels import Projection, attend_memory, is_dense, linear, speech_scores, weight_product
    from kv_cache import DecodeState, StaticKVCache, attention_mask
    from logits_rules import ChainedRules, ChunkPath, LogitsRules, SuppressionRules, device_ids
    from medusa_decoding import WindowPlan


SPEECH_FRAME_MARGIN = 16  # encoder frames (0.32 s) the drafter reads past the end of the speech
LANGUAGE_SLOT = -1  # in a prompt template: where each row's language, detected from its speech, goes


def speech_frames(features: torch.Tensor, margin: int = SPEECH_FRAME_MARGIN) -> int | None:
    """Encoder frames up to the end of the speech in a batch of log-mel windows [B, mels, frames], plus
    ``margin``; None when that is the whole window. A window's padding is digital silence, whose frames
    all sit at the window's floor value (the feature extractor clamps to 8 below the maximum). Drafts read
    only these frames on a CPU: on the real recordings they accept as many tokens as with every frame."""
    floor = features.amin(dim=(1, 2), keepdim=True)
    above_floor = (features != floor).any(dim=1)  # [B, frames]
    if not bool(above_floor.any()):
        return None
    last = int(torch.nonzero(above_floor.any(dim=0)).max())
    total = features.shape[-1] // 2  # the encoder halves the frame rate
    frames = (last + 2) // 2 + margin
    return None if frames >= total else frames


class WhisperBackbone(Backbone):
    family = "whisper"
    required_inputs = ("input_features",)
    max_audio_seconds = 30.0
    default_max_new_tokens = 224  # OpenAI's sample length, half the 448 decoder positions: a fast-spoken 30 s window
    window_seconds = 30.0  # what Whisper's long-form generate makes its windows of
    timestamped = True
    asr_pipeline = True
    word_timestamps = True
    temperature_fallback = True
    # fallback thresholds on log-probabilities and no-speech probability need scores; its compression-ratio
    # threshold reads only the text, so windows take it, and its token-level timestamps read the cross-attentions,
    # which a window gives from one teacher-forced pass over the tokens it decoded
    greedy_as_is = {"logprob_threshold": (), "no_speech_threshold": ()}
    base_config_settings = ("eos_token_id", "pad_token_id", "max_length", "decoder_start_token_id", "suppress_tokens",
                            "begin_suppress_tokens", "forced_decoder_ids", "no_timestamps_token_id")
    # bf16/fp16 attention: "sdpa" (SDPA's default kernel everywhere), "memory" (cross-attention through
    # attend_memory), "auto" (that, and self-attention as matmuls) or "matmul" (matmuls everywhere)
    half_attention = "memory"
    screens_argmax = True

    @classmethod
    def load_base(cls, source: str, load_kwargs: dict):
        from transformers import WhisperForConditionalGeneration

        return WhisperForConditionalGeneration.from_pretrained(source, **load_kwargs)

    @classmethod
    def sampling_option(cls, kwargs: dict) -> tuple[str, str] | None:
        """Whisper's generate samples when its ``temperature`` argument (not the config's) is above 0. A sequence
        of temperatures is its fallback: each window is decoded greedily first (by us) and retried at the next
        temperature, by the base's own sampling, where its thresholds reject the result."""
        temperature = kwargs.get("temperature")
        first = temperature[0] if isinstance(temperature, (list, tuple)) and temperature else temperature
        if first is None or first == 0:
            return None
        return "temperature", "Whisper samples when its first temperature is above 0"

    @property
    def generation_config(self):
        """The base's, read at each use, as the base's generate reads it: a caller may replace the object."""
        return self.base.generation_config

    gen = generation_config

    def __init__(self, base):
        self.base = base
        self.decoder = base.model.decoder
        self.config = base.config
        self.num_heads = self.config.decoder_attention_heads
        self.head_dim = self.config.d_model // self.num_heads
        self.scaling = self.head_dim**-0.5
        self._projection = Projection(lambda: base.proj_out.weight, lambda: base.proj_out.bias)
        self.fused: list | None = None  # per decoder layer (q/k/v weight, bias) once fuse_projections() ran
        self._codes = None  # (generation config's lang_to_id, token id -> language code)

    def fuse_projections(self) -> bool:
        """Give every decoder layer's self-attention one q/k/v weight and bias, so a round runs one product where
        it ran three (a GPU round of a small Whisper is a chain of kernels that cost the same whatever their size). The base's
        own layers keep working: their weights and biases become views of the fused tensors (k has no bias: its
        block of the fused bias is zeros). False (and nothing changed) when the layers cannot share a tensor."""
        groups = [[layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj] for layer in self.decoder.layers]
        if not all(fusable(linears, biases=True) for linears in groups):
            return False
        self.fused = [fuse_linears(linears) for linears in groups]
        return True

    def _drop_stale_fusion(self):
        """A later ``.to()`` or weight reload gives the layers new tensors: then use them, unfused."""
        if self.fused is not None and not all(backs(weight, layer.self_attn.q_proj)
                                              for (weight, _), layer in zip(self.fused, self.decoder.layers)):
            self.fused = None

    # ------------------------------------------------------------------ facts
    @property
    def hidden_size(self) -> int:
        return self.config.d_model

    @property
    def output_projection(self) -> torch.nn.Module:
        return self.base.proj_out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._projection(hidden)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(tokens)

    @property
    def speech_heads(self) -> int:
        return self.num_heads

    def speech_memory(self, state: DecodeState) -> tuple:
        """The last layer's cross-attention keys and values [B, heads, L, D], cut to the frames that hold
        speech where the state says so (what the drafter attends; the base's own layers read every frame)."""
        keys, values = state.extra["cross_keys"][-1], state.extra["cross_values"][-1]
        if state.speech_frames is not None:
            keys, values = keys[:, :, : state.speech_frames], values[:, :, : state.speech_frames]
        return keys, values

    def unsupported_reason(self, kwargs: dict) -> str | None:
        return None

    def windowed(self, kwargs: dict) -> bool:
        """Timestamps, segments, prompt ids, temperature fallback and long-form audio (over 30 s of features)
        take the base's own generate, which hands each window's decoding to us (and decodes a fallback's
        sampled retries itself); plain short-form calls are decoded directly."""
        timestamps = kwargs.get("return_timestamps", getattr(self.gen, "return_timestamps", None))
        features = kwargs.get("input_features")
        long_form = features is not None and features.shape[-1] > 2 * self.config.max_source_positions
        temperature = kwargs.get("temperature")
        fallback = isinstance(temperature, (list, tuple)) and len(temperature) > 1
        return bool(timestamps or kwargs.get("return_segments") or kwargs.get("prompt_ids") is not None
                    or kwargs.get("return_token_timestamps") or long_form or fallback)

    @contextlib.contextmanager
    def around_base_generate(self, capture=None):
        """While the base's generate runs: its speech encoder is ours, as a CUDA graph on a GPU (``capture``), and
        features it already encoded are not encoded again (its language detection and its first window encode
        the same features). Same module, same results; calls asking for more than the last hidden state (head
        masks, attentions, hidden states) run the base's own forward."""
        from transformers.modeling_outputs import BaseModelOutput

        encoder, last = self.base.model.encoder, {}
        own = encoder.forward  # the base's, bound before ours replaces it

        def encode(features):
            with contiguous_stream(encoder):
                return own(features).last_hidden_state

        def forward(input_features=None, attention_mask=None, **kwargs):  # (Whisper's encoder ignores the mask)
            if input_features is None or any(kwargs.get(k) for k in ("head_mask", "output_attentions",
                                                                      "output_hidden_states")):
                return own(input_features, attention_mask=attention_mask, **kwargs)
            if "features" not in last or not torch.equal(last["features"], input_features):
                features = input_features.to(self.device, self.base.dtype)
                speech = encode(features) if capture is None else capture(
                    ("whisper-encoder", tuple(features.shape)), encode, features)
                last.update(features=input_features, speech=speech)
            return BaseModelOutput(last_hidden_state=last["speech"])

        encoder.forward = forward
        try:
            yield
        finally:
            del encoder.forward

    def window_plan(self, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs):
        """The window the base's generate hands to its decoding method (these are that method's arguments) as
        a ``WindowPlan`` for our decoding, or the reason it is not one (then the base decodes it itself)."""
        from transformers.generation import logits_process, stopping_criteria as criteria

        if generation_config.do_sample or (generation_config.num_beams or 1) > 1:
            return "sampling or beam search (a temperature-fallback retry)"
        token_timestamps = _asks_only_token_timestamps(generation_config)
        if generation_config.return_dict_in_generate and not token_timestamps:
            return "scores or other generate outputs beyond the ids"
        if token_timestamps:
            self.check_word_timestamps()
        prompt_length = input_ids.shape[1]
        max_length, eos = None, self.eos_token_ids
        for criterion in stopping_criteria:
            if isinstance(criterion, criteria.MaxLengthCriteria):
                max_length = criterion.max_length
            elif isinstance(criterion, criteria.EosTokenCriteria):
                eos = criterion.eos_token_id.tolist()
            else:
                return f"the stopping criterion {type(criterion).__name__}"
        if max_length is None or max_length <= prompt_length:
            return "a window without room for new tokens"
        suppress = {"always": [], "at_begin": [], "min_new_tokens": 0, "eos_token_ids": eos}
        timestamps = None
        for processor in logits_processor:
            if timestamps is not None:  # (the base applies its timestamp rules last)
                return f"the logits processor {type(processor).__name__} after the timestamp rules"
            if isinstance(processor, logits_process.WhisperTimeStampLogitsProcessor) and \
                    processor.begin_index == prompt_length:
                timestamps = TimestampRules(processor, self.vocab_size, self.device)
            elif not _add_suppression(suppress, processor, prompt_length):
                return f"the logits processor {type(processor).__name__}"
        mask = model_kwargs.get("decoder_attention_mask")
        if mask is not None and not _is_left_padding(mask):
            return "a decoder attention mask other than left padding"
        rules = SuppressionRules(self.vocab_size, self.device, suppress["eos_token_ids"],
                                 suppress["min_new_tokens"] or None, suppress["always"], suppress["at_begin"])
        inputs = {"encoder_outputs": model_kwargs["encoder_outputs"], "decoder_input_ids": input_ids,
                  "decoder_attention_mask": mask}
        return WindowPlan(inputs, ChainedRules(rules, timestamps) if timestamps else rules,
                          max_length - prompt_length, eos)

    def window_output(self, sequences: torch.Tensor, prompt_length: int, generation_config, model_kwargs: dict):
        """A decoded window as the base's generate takes it back: the ids, and where token timestamps are asked
        for, the cross-attentions that its ``_extract_token_timestamps`` aligns with the speech."""
        if not _asks_only_token_timestamps(generation_config):
            return sequences
        from transformers.generation.utils import GenerateEncoderDecoderOutput

        steps = self._cross_attention_steps(sequences, prompt_length, model_kwargs)
        return GenerateEncoderDecoderOutput(sequences=sequences, cross_attentions=steps)

    def _cross_attention_steps(self, sequences: torch.Tensor, prompt_length: int, model_kwargs: dict) -> tuple:
        """The base decoder's cross-attention weights over a window's tokens from ONE teacher-forced pass, laid
        out as its token-by-token decoding returns them: the prompt's rows, then a row for each generated token
        but the last (the base never feeds it back). The queries are the ones that decoding saw, the padding
        after a row's EOS and the left-padded, position-shifted prompts of long-form windows included."""
        tokens = sequences[:, :-1]
        mask, positions = model_kwargs.get("decoder_attention_mask"), None
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], tokens.shape[1] - mask.shape[1])], dim=1)
            positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        speech = model_kwargs["encoder_outputs"]
        speech = getattr(speech, "last_hidden_state", speech)
        out = self.decoder(input_ids=tokens, encoder_hidden_states=speech, attention_mask=mask, position_ids=positions,
                           output_attentions=True, use_cache=False)
        if not out.cross_attentions:
            raise RuntimeError("the base's decoder returned no attention weights; token timestamps need eager "
                               "attention, which the base's generate switches to for return_token_timestamps")
        rows = range(prompt_length, tokens.shape[1])
        return (tuple(layer[:, :, :prompt_length] for layer in out.cross_attentions),
                *(tuple(layer[:, :, i : i + 1] for layer in out.cross_attentions) for i in rows))

    def check_word_timestamps(self) -> None:
        """ValueError naming the problem when this base cannot time tokens: Whisper aligns them with the speech
        through the cross-attention of its generation config's ``alignment_heads`` ((decoder layer, head) pairs)."""
        heads = getattr(self.gen, "alignment_heads", None)
        if not heads:
            raise ValueError("this Whisper base's generation_config has no alignment_heads (the cross-attention "
                             "heads that word times are read from); add them to its generation_config.json as the "
                             "Hub's copy of the model has them (a base converted by tools.real_whisper takes "
                             "them from CTranslate2's config.json)")
        layers, heads_per_layer = len(self.decoder.layers), self.num_heads
        outside = [list(h) for h in heads if not (0 <= h[0] < layers and 0 <= h[1] < heads_per_layer)]
        if outside:
            raise ValueError(f"alignment_heads {outside} in the generation_config are outside this Whisper "
                             f"decoder's {layers} layers x {heads_per_layer} heads")

    def segment_words(self, tokenizer, segment: dict) -> list[tuple[str, float, float]]:
        """The words of one segment of ``generate(return_segments=True, return_token_timestamps=True)``, split
        by the rules of the language its window was decoded in, inside the segment's start and end."""
        return segment_words(tokenizer, segment["tokens"].tolist(), segment["token_timestamps"].tolist(),
                             self._window_language(segment), (float(segment["start"]), float(segment["end"])))

    def _window_language(self, segment: dict) -> str | None:
        """The language (its name, as the tokenizer's word rules take it) whose token is in the prompt of the
        segment's window; None for an English-only model."""
        from transformers.models.whisper.tokenization_whisper import LANGUAGES

        codes = self._language_codes()
        prompt = segment["result"]["sequences"][: segment["idxs"][0]].tolist()  # (and earlier segments' tokens)
        return next((LANGUAGES.get(codes[i]) for i in prompt if i in codes), None)

    def prompt_languages(self, prompt: torch.Tensor) -> set[str]:
        codes = self._language_codes()
        return {codes[i] for i in set(prompt.flatten().tolist()) if i in codes} if codes else set()

    def _language_codes(self) -> dict[int, str]:
        """Language token id -> its code (``"de"``); empty for an English-only model."""
        table = getattr(self.gen, "lang_to_id", None) or {}
        if self._codes is None or self._codes[0] is not table:  # (kept: auto asks on every call)
            self._codes = (table, {i: token.strip("<|>") for token, i in table.items()})
        return self._codes[1]

    # ------------------------------------------------------------------ prompt & logits rules
    def prompt_template(self, language=None, task=None) -> list[int]:
        """The decoder prompt the base's generate would build: start token, language (given, from the legacy
        forced ids, or ``LANGUAGE_SLOT`` where each row's is detected from its speech), task, <|notimestamps|>."""
        gen = self.gen
        tokens, language, task, detect = self._prompt_start(language, task)
        row = list(tokens)
        if language is not None or detect:
            row[1:2] = [self._language_id(language) if language is not None else LANGUAGE_SLOT]
        task_ids = set((getattr(gen, "task_to_id", None) or {}).values())
        if task is not None:
            row = [t for t in row if t not in task_ids] + [gen.task_to_id[task]]
        elif language is not None and task_ids and not task_ids.intersection(row):
            row.append(gen.task_to_id["transcribe"])
        no_timestamps = self._no_timestamps()
        if no_timestamps and row[-1] != no_timestamps[0]:
            row += no_timestamps
        return row

    def _prompt_start(self, language=None, task=None):
        """(first prompt tokens, language, task, whether the language must be detected from the speech)."""
        gen = self.gen
        self.check_prompt_options(language, task)
        language = language or getattr(gen, "language", None)
        task = task or getattr(gen, "task", None)
        tokens = [gen.decoder_start_token_id]
        if task is None and language is None:
            tokens += self._legacy_forced_tokens()
        detect = language is None and bool(getattr(gen, "lang_to_id", None)) and (len(tokens) <= 1 or tokens[1] is None)
        return tokens, language, task, detect

    def check_prompt_options(self, language=None, task=None) -> None:
        """Clear errors for a language or task this model cannot take, before any decoding."""
        if (language or task) and not getattr(self.gen, "lang_to_id", None):
            raise ValueError(f"This Whisper model is English-only: it takes no language or task (got "
                             f"language={language!r}, task={task!r}); leave them unset.")
        if language:
            self._language_id(language)
        if task and task not in (getattr(self.gen, "task_to_id", None) or {}):
            raise ValueError(f"Unknown Whisper task {task!r}; use 'transcribe' or 'translate'.")

    def effective_prompt_options(self, language=None, task=None) -> tuple:
        """An English-only Whisper transcribes English: language en/english and task transcribe are what it
        does anyway, so they are dropped instead of refused (translation or another language still fail)."""
        if getattr(self.gen, "lang_to_id", None):
            return language, task
        if language and language.strip("<|>").lower() in ("en", "english"):
            language = None
        return language, None if task == "transcribe" else task

    def max_new_tokens_limit(self, language=None, task=None) -> int:
        """Its decoder positions minus the prompt's."""
        return self.config.max_target_positions - len(self.prompt_template(language, task))

    def audio_inputs(self, processor, audios: list, instruction=None, language=None, task=None,
                     return_attention_mask: bool = False) -> dict:
        """Log-mel features; audio longer than one window is kept whole, for the base's long-form generate
        (sequential 30 s windows, each starting where the last complete segment ended), with an attention
        mask marking each row's length (given for short audio too with ``return_attention_mask``: token
        timestamps align only with the frames it marks, not with the padding after the speech)."""
        whole = {"truncation": False, "padding": "longest", "return_attention_mask": True} \
            if any(len(audio) > self.max_audio_seconds * 16000 for audio in audios) else {}
        if return_attention_mask:
            whole["return_attention_mask"] = True
        inputs = dict(processor(audios, sampling_rate=16000, return_tensors="pt", **whole))
        return {**inputs, **{k: v for k, v in (("language", language), ("task", task)) if v}}

    def _legacy_forced_tokens(self) -> list:
        forced = getattr(self.gen, "forced_decoder_ids", None) or getattr(self.config, "forced_decoder_ids", None)
        tokens = []
        for position, token in sorted(forced or []):
            if position != len(tokens) + 1:
                break
            tokens.append(token)
        return tokens

    def _no_timestamps(self) -> list[int]:
        token = getattr(self.gen, "no_timestamps_token_id", None)
        return [token] if token is not None else []

    def _language_id(self, language: str) -> int:
        from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

        code = language.strip("<|>").lower()
        code = TO_LANGUAGE_CODE.get(code, code)
        token = f"<|{code}|>"
        if token not in self.gen.lang_to_id:
            raise ValueError(f"Unknown Whisper language {language!r}; use a code such as 'en'.")
        return self.gen.lang_to_id[token]

    def language_ids(self) -> torch.Tensor:
        """The language tokens' ids on the base's device (made outside any captured function: a CUDA graph cannot
        hold the copy from the host)."""
        return device_ids(tuple(sorted(self.gen.lang_to_id.values())), self.device)

    def _with_languages(self, prompt: torch.Tensor, encoder_kv, language_ids: torch.Tensor) -> torch.Tensor:
        """``prompt`` [B, T] with its ``LANGUAGE_SLOT`` filled, per row, like the base's detect_language: the argmax
        over the language tokens after the start token. On the device, no host sync (a CUDA graph can hold it)."""
        batch = prompt.shape[0]
        start = torch.full((batch, 1), self.gen.decoder_start_token_id, device=self.device)
        state = self._empty_state(encoder_kv, batch, capacity=1)
        hidden = self._forward(state, start)[:, -1]
        detected = language_ids[self._language_logits(hidden, language_ids).argmax(-1)]
        return torch.where(prompt == LANGUAGE_SLOT, detected[:, None], prompt)

    def _language_logits(self, hidden: torch.Tensor, language_ids: torch.Tensor) -> torch.Tensor:
        """The output projection's scores of the language tokens alone [B, languages] (the same dot products as
        the full projection's: on a CPU that one row over the whole vocabulary cost more than the decoder's step,
        and its first call a transposed copy of the weight); a quantised weight's from the full projection."""
        weight, bias = self._projection.weight_of(), self._projection.bias_of()
        if not is_dense(weight):
            return self.logits(hidden)[:, language_ids]
        return F.linear(hidden, weight[language_ids], None if bias is None else bias[language_ids])

    def make_logits_processor(self, min_new_tokens: int | None):
        return SuppressionRules(
            self.vocab_size, self.device, self.eos_token_ids, min_new_tokens,
            always=getattr(self.gen, "suppress_tokens", None),
            at_begin=getattr(self.gen, "begin_suppress_tokens", None),
        )

    # ------------------------------------------------------------------ prefill & decode
    def encode(self, inputs: dict) -> torch.Tensor:
        """The speech encoder's output [B, L, H] for these inputs."""
        features = inputs["input_features"].to(self.device, self.base.dtype)
        return encoder_output(self.base.model.encoder, features)

    def speech_memory_of(self, encoder_out: torch.Tensor) -> tuple:
        """(keys, values) [B, heads, L, D] of the last decoder layer's cross-attention over ``encoder_out``."""
        attn = self.decoder.layers[-1].encoder_attn
        encoder_out = encoder_out.to(attn.k_proj.weight.dtype)
        return self._heads(attn.k_proj(encoder_out)), self._heads(attn.v_proj(encoder_out))

    def prefill(self, inputs: dict, max_new_tokens: int | None, extra_slots: int, process_logits, cache_pool=None,
                capture=None, compile: bool = False):
        """Encoder (unless ``encoder_outputs`` are given) and decoder prompt: the one the base's generate builds
        (each row's language detected from its speech where none is given), or ``decoder_input_ids`` as given
        (left-padded rows marked by ``decoder_attention_mask``). ``capture`` (a ``CapturedCalls``) replays the
        encoder and the cross-attention projections as a CUDA graph and, for the base's own prompt, the language
        detection and the prompt's decoder pass in the same graph. ``compile`` changes nothing here: the decoder's
        prompt is a few tokens; a compiled encoder is measured on the MERaLiON-2 shape only (``prompt_pass.py``)."""
        self._drop_stale_fusion()
        template = None if inputs.get("decoder_input_ids") is not None else \
            self.prompt_template(inputs.get("language"), inputs.get("task"))
        one_graph = capture is not None and template is not None and inputs.get("encoder_outputs") is None
        encoder_kv = None if one_graph else self._speech_kv(inputs, capture)
        batch = inputs["input_features"].shape[0] if one_graph else encoder_kv[0].shape[1]
        if template is None:
            prompt = inputs["decoder_input_ids"].to(self.device)
        else:  # (its language slots are filled by the prompt's pass below)
            prompt = device_ids(tuple(template), self.device).expand(batch, -1)
        detect = template is not None and LANGUAGE_SLOT in template
        prompt_len = prompt.shape[1]
        max_new = self._max_new_tokens(max_new_tokens, prompt_len)
        state = self._empty_state(encoder_kv, batch, prompt_len + max_new + extra_slots, cache_pool)
        state.first_slot = _left_padding(inputs.get("decoder_attention_mask"), batch, self.device)
        if self.device.type == "cpu" and inputs.get("input_features") is not None:
            state.speech_frames = speech_frames(inputs["input_features"])  # (a host read: CPU only)
        if one_graph:
            hidden, prompt = self._captured_speech_and_prompt(state, inputs["input_features"], prompt, detect, capture)
        else:
            if detect:
                prompt = self._with_languages(prompt, encoder_kv, self.language_ids())
            hidden = self._forward(state, prompt)
        state.lengths = state.lengths + prompt_len
        self.start_decoding(state, hidden, prompt, process_logits)
        return state, max_new, prompt

    def _captured_speech_and_prompt(self, state: DecodeState, features, prompt, detect: bool, capture) -> tuple:
        """One CUDA graph per (cache, batch, prompt): features -> cross-attention keys and values (into
        ``state.extra``) -> each row's language (``detect``) -> the prompt's pass, which writes its keys and values
        into the pool's cache. Returns the prompt's hidden states and the prompt."""
        cache = state.cache

        def speech_and_prompt(features, prompt, first_slot, language_ids):
            keys, values = self._speech_kv_of(features)
            if detect:
                prompt = self._with_languages(prompt, (keys, values), language_ids)
            prompt_state = DecodeState(cache, torch.zeros_like(first_slot), first_slot, hidden=None, next_token=None,
                                       extra={"cross_keys": keys, "cross_values": values})
            return keys, values, self._forward(prompt_state, prompt), prompt

        features = features.to(self.device, self.base.dtype)
        key = ("whisper-prefill", id(cache), tuple(features.shape), tuple(prompt.shape), detect)
        # (the language ids are an input too: a tensor the graph only closed over would be freed after this call)
        language_ids = self.language_ids() if detect else prompt.new_empty(0)
        keys, values, hidden, prompt = capture(key, speech_and_prompt, features, prompt, state.first_slot, language_ids,
                                               keep=cache)
        state.extra = {"cross_keys": keys, "cross_values": values}
        return hidden, prompt

    def _speech_kv(self, inputs: dict, capture=None):
        """Every decoder layer's cross-attention keys and values [layers, B, heads, L, D] for the speech."""
        encoder_out = getattr(inputs.get("encoder_outputs"), "last_hidden_state", inputs.get("encoder_outputs"))
        if encoder_out is not None:  # (the base's generate ran the encoder)
            return self._cross_attention_kv(encoder_out.to(self.device, self.base.dtype))
        features = inputs["input_features"].to(self.device, self.base.dtype)
        if capture is None:
            return self._speech_kv_of(features)
        return capture(("whisper-speech-kv", tuple(features.shape)), self._speech_kv_of, features)

    def _speech_kv_of(self, features: torch.Tensor) -> tuple:
        return self._cross_attention_kv(self.encode({"input_features": features}))

    def _max_new_tokens(self, max_new_tokens, prompt_len) -> int:
        limit = self.config.max_target_positions
        if max_new_tokens is None:
            max_new_tokens = getattr(self.gen, "max_new_tokens", None) or (self.gen.max_length or limit) - prompt_len
        if max_new_tokens + prompt_len > limit:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} plus the {prompt_len}-token decoder prompt exceeds Whisper's "
                f"max_target_positions={limit}; use max_new_tokens <= {limit - prompt_len}."
            )
        return max_new_tokens

    def _cross_attention_kv(self, encoder_out):
        keys, values = [], []
        for layer in self.decoder.layers:
            attn = layer.encoder_attn
            keys.append(self._heads(attn.k_proj(encoder_out)))
            values.append(self._heads(attn.v_proj(encoder_out)))
        return torch.stack(keys), torch.stack(values)

    def _empty_state(self, encoder_kv, batch, capacity, cache_pool=None) -> DecodeState:
        device, dtype = self.device, self.base.dtype
        make = cache_pool.get if cache_pool is not None else StaticKVCache
        cache = make(len(self.decoder.layers), batch, self.num_heads, capacity, self.head_dim, dtype, device)
        cache.index_put_when_compiled = self.kernels.cache_index_put
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        extra = {} if encoder_kv is None else {"cross_keys": encoder_kv[0], "cross_values": encoder_kv[1]}
        return DecodeState(cache, zeros, zeros.clone(), hidden=None, next_token=None, extra=extra)

    def _forward(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        """Causal forward of a plain prompt chunk (prefill)."""
        n = tokens.shape[1]
        depths = torch.arange(n, device=tokens.device)
        causal = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril()
        return self.decode(state, tokens, depths, causal, upto=n, prompt=True)  # (called on an empty cache)

    def decode(self, state: DecodeState, tokens, depths, ancestors, upto: int, prompt: bool = False) -> torch.Tensor:
        """Hidden states [B, n, H] of a chunk: a verify pass's draft nodes, or (``prompt``) a prompt in one pass, as
        the base's generate runs it."""
        n = tokens.shape[1]
        positions = state.positions(depths).clamp(0, self.config.max_target_positions - 1)  # (padding: < 0)
        hidden = self.decoder.embed_tokens(tokens) + self.decoder.embed_positions.weight[positions]
        # on a CPU in half precision, a verify pass's nodes attend one by one, as the base's steps do (attend_one_by_one)
        one_by_one = not prompt and n > 1 and hidden.device.type == "cpu" and hidden.dtype != torch.float32
        mask = attention_mask(state, depths, ancestors, upto)
        slots = state.slots(n)
        cross_k, cross_v = state.extra["cross_keys"], state.extra["cross_values"]
        for i, layer in enumerate(self.decoder.layers):
            x = layer.self_attn_layer_norm(hidden)
            attn = layer.self_attn
            if self.fused is None:
                query, key, value = None, linear(attn.k_proj, x), linear(attn.v_proj, x)
            else:
                query, key, value = weight_product(x, *self.fused[i]).chunk(3, dim=-1)
            state.cache.write(i, slots, self._heads(key), self._heads(value))
            keys, values = state.cache.layer(i, upto)
            hidden = hidden + self._attend(attn, x, keys, values, mask, query, one_by_one)
            x = layer.encoder_attn_layer_norm(hidden)
            hidden = hidden + self._attend(layer.encoder_attn, x, cross_k[i], cross_v[i], None, one_by_one=one_by_one)
            x = layer.final_layer_norm(hidden)
            hidden = hidden + linear(layer.fc2, layer.activation_fn(linear(layer.fc1, x)))
        return self.decoder.layer_norm(hidden)

    def _attend(self, attn, x, keys, values, mask, projected_query=None, one_by_one: bool = False):
        """``attn`` of ``x`` (its query projected already where ``projected_query`` is given) over keys/values."""
        query = self._heads((linear(attn.q_proj, x) if projected_query is None else projected_query) * self.scaling)
        if one_by_one:
            out = attend_one_by_one(query, keys, values, mask)
            return linear(attn.out_proj, out.transpose(1, 2).flatten(2))
        if query.dtype == torch.float32:  # CPU: speech_scores' tuned forms; GPU: attend_memory's float32 form
            mode = "memory" if mask is None and query.is_cuda else "matmul"
        else:
            mode = self.half_attention
        if mode in ("auto", "memory"):
            mode = "memory" if mask is None else ("matmul" if mode == "auto" else "sdpa")
        if mode == "matmul":
            # A verify chunk has a handful of queries: SDPA's fused kernels run one block per head for them,
            # which leaves most of a GPU idle; two matmuls do not
            scores = torch.matmul(query, keys.transpose(-1, -2)) if mask is not None else speech_scores(query, keys)
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype), values)
        elif mode == "memory":
            out = attend_memory(query, keys, values, scale=1.0)
        else:  # SDPA accumulates in fp32, as the base's own attention does
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=1.0)
        return linear(attn.out_proj, out.transpose(1, 2).flatten(2))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)

    # ------------------------------------------------------------------ output format
    def format_output(self, generated: list[list[int]], prompt: torch.Tensor) -> torch.Tensor:
        """Like Whisper's short-form generate: the new tokens without the final EOS, right-padded."""
        eos = set(self.eos_token_ids)
        return self.padded([g[:-1] if g and g[-1] in eos else g for g in generated], prompt)


def attend_one_by_one(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask) -> torch.Tensor:
    """[B, heads, n, D]: each query alone over exactly the keys its mask [B, 1, n, L] lets it see (all without one),
    as the base's one-token step attends. On a CPU, SDPA in half precision sums a row in another order when it gets
    several queries or masked keys past the row's own, so a verify pass would part from the base's numbers."""
    rows = []
    for b in range(query.shape[0]):
        for i in range(query.shape[2]):
            seen = slice(None) if mask is None else mask[b, 0, i]
            rows.append(F.scaled_dot_product_attention(query[b:b + 1, :, i:i + 1], keys[b:b + 1, :, seen],
                                                       values[b:b + 1, :, seen], scale=1.0))
    out = torch.cat(rows, 2)[0]  # [heads, B * n, D]
    return out.unflatten(1, (query.shape[0], query.shape[2])).transpose(0, 1)


def _asks_only_token_timestamps(generation_config) -> bool:
    """Whether the outputs asked for beyond the ids are those of ``return_token_timestamps``: the base's generate
    then asks for attentions (a window gives the cross-attentions) and scores, which only its log-probability
    threshold reads (a call with one is the base's own, see ``greedy_as_is``)."""
    return bool(getattr(generation_config, "return_token_timestamps", False)
                and not generation_config.output_hidden_states and not generation_config.output_logits)


def segment_words(tokenizer, tokens: list[int], times: list[float], language: str | None = None,
                  within: tuple[float, float] = (-math.inf, math.inf)) -> list[tuple[str, float, float]]:
    """(word, start, end) of one segment from its tokens and their times in seconds (a segment's
    ``token_timestamps``). A token lasts from the time of the token before it to its own, as transformers' ASR
    pipeline reads them (a token's time is where the alignment moves past it); the tokenizer's own Whisper
    rules group the text tokens into words (a word starts with a space, punctuation joins its neighbour;
    per character for languages without spaces) and timestamp and other special tokens time only their
    neighbours. Times are held ``within`` (the segment's own start and end): the alignment runs into the pause
    around a segment, past where the next window of a long recording starts."""
    from transformers.models.whisper.tokenization_whisper import _collate_word_timestamps

    text = [i for i, token in enumerate(tokens) if token < tokenizer.eos_token_id]
    spans = [(times[i - 1] if i else times[i], times[i]) for i in text]
    words = _collate_word_timestamps(tokenizer, [tokens[i] for i in text], spans, language, return_language=False)

    def held(seconds: float) -> float:
        return min(max(seconds, within[0]), within[1])

    return [(word["text"].strip(), held(word["timestamp"][0]), held(word["timestamp"][1]))
            for word in words if word["text"].strip()]


def _left_padding(mask, batch: int, device) -> torch.Tensor:
    """Per row, how many leading prompt tokens are padding (the base's long-form generate left-pads the
    previous windows' text); the base then numbers positions from the first real token, as the state does."""
    if mask is None:
        return torch.zeros(batch, dtype=torch.long, device=device)
    return (mask.to(device) == 0).long().cumprod(dim=1).sum(dim=1)


def _is_left_padding(mask: torch.Tensor) -> bool:
    padding = _left_padding(mask, mask.shape[0], mask.device)
    return bool((mask.long().sum(dim=1) == mask.shape[1] - padding).all())


def _add_suppression(suppress: dict, processor, prompt_length: int) -> bool:
    """Fold one of the base's token-blocking processors into ``suppress`` (the arguments of
    ``SuppressionRules``); False when it is not one this window can take."""
    from transformers.generation import logits_process as lp

    if isinstance(processor, lp.SuppressTokensLogitsProcessor):
        suppress["always"] += processor.suppress_tokens.tolist()
    elif isinstance(processor, lp.SuppressTokensAtBeginLogitsProcessor) and processor.begin_index == prompt_length:
        suppress["at_begin"] += processor.begin_suppress_tokens.tolist()
    elif isinstance(processor, lp.MinNewTokensLengthLogitsProcessor) and \
            processor.prompt_length_to_skip == prompt_length:
        suppress["min_new_tokens"] = max(suppress["min_new_tokens"], processor.min_new_tokens)
        suppress["eos_token_ids"] = torch.as_tensor(processor.eos_token_id).flatten().tolist()
    elif isinstance(processor, lp.MinLengthLogitsProcessor):
        suppress["min_new_tokens"] = max(suppress["min_new_tokens"], processor.min_length - prompt_length)
        suppress["eos_token_ids"] = torch.as_tensor(processor.eos_token_id).flatten().tolist()
    else:
        return False
    return True


class TimestampRules(LogitsRules):
    """transformers' ``WhisperTimeStampLogitsProcessor`` at every node of a verify chunk at once, a node's
    history being the tokens generated so far plus the drafts on its path: <|notimestamps|> never; timestamps
    in pairs except before EOS; never below the last one (nor the same again, unless it closes a pair);
    the first token a timestamp no later than ``max_initial_timestamp_index``; and text blocked where the
    timestamps' total log-probability beats every single text token. The per-row history is the token before
    the root and the last timestamp before it (-1: none)."""

    def __init__(self, processor, vocab: int, device):
        self.timestamp_begin = int(processor.timestamp_begin)
        self.no_timestamps = int(processor.no_timestamps_token_id)
        self.text_end = int(processor.eos_token_id)  # a closing timestamp is followed by a timestamp or EOS on
        self.max_initial = processor.max_initial_timestamp_index
        self.from_logprob = bool(processor._detect_timestamp_from_logprob)
        self.ids = torch.arange(vocab, device=device)
        self.key = ("timestamps", self.timestamp_begin, self.no_timestamps, self.text_end, self.max_initial,
                    self.from_logprob, vocab)

    def start(self, batch: int, device) -> dict:
        none = torch.full((batch,), -1, dtype=torch.long, device=device)
        return {"before_root": none, "last_timestamp": none.clone()}

    def _last_timestamps(self, path: ChunkPath) -> torch.Tensor:
        """[B, N] the last timestamp generated up to and including each node (-1: none yet)."""
        tokens, generated = path.path_tokens()
        is_timestamp = generated & (tokens >= self.timestamp_begin)
        steps = torch.arange(tokens.shape[-1], device=tokens.device)
        deepest = torch.where(is_timestamp, steps, -1).max(dim=-1).values
        on_path = tokens.gather(-1, deepest.clamp(min=0)[..., None])[..., 0]
        return torch.where(deepest >= 0, on_path, path.history["last_timestamp"][:, None])

    def __call__(self, logits, num_generated, path=None):
        logits = self.blocks(logits, num_generated, path)
        return self.overrule_text(logits) if self.from_logprob else logits

    def screen_parts(self):
        return self.blocks, self.timestamp_begin, (self.overrule_text if self.from_logprob else None)

    def blocks(self, logits, num_generated, path=None):
        """The rules that only block tokens (all of them but the total-probability one)."""
        begin, ids = self.timestamp_begin, self.ids
        before = torch.where(path.tree.depths[None, :] == 0, path.history["before_root"][:, None], path.parent_tokens)
        last_is_timestamp = (num_generated >= 1) & (path.tokens >= begin)
        before_is_timestamp = (num_generated < 2) | (before >= begin)
        opens_pair = last_is_timestamp & ~before_is_timestamp
        last = self._last_timestamps(path)
        lowest = torch.where(last < 0, begin, torch.where(opens_pair, last, last + 1))
        is_timestamp = ids >= begin
        blocked = ((ids == self.no_timestamps)
                   | ((last_is_timestamp & before_is_timestamp)[..., None] & is_timestamp)
                   | (opens_pair[..., None] & (ids < self.text_end))
                   | (is_timestamp & (ids < lowest[..., None])))
        first = (num_generated == 0)[..., None]
        blocked |= first & ~is_timestamp
        if self.max_initial is not None:
            blocked |= first & (ids > begin + self.max_initial)
        return logits.masked_fill(blocked, float("-inf"))

    def overrule_text(self, logits):
        """Every text token blocked in the rows where the timestamps' total probability beats each text token's."""
        begin = self.timestamp_begin
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        timestamp = logprobs[..., begin:].logsumexp(dim=-1)
        text = logprobs[..., :begin].max(dim=-1).values
        return logits.masked_fill((timestamp > text)[..., None] & (self.ids < begin), float("-inf"))

    def advance(self, path, best) -> dict:
        rows = torch.arange(best.shape[0], device=best.device)
        return {"before_root": path.tokens[rows, best], "last_timestamp": self._last_timestamps(path)[rows, best]}

    def hint_drafts(self, chunk, history):
        """After a timestamp that closes a segment the rules allow only a timestamp no lower, or EOS; Whisper mostly
        opens the next segment at the same time, so that timestamp is drafted (the heads never draft timestamps:
        one more round per segment otherwise)."""
        root, before = chunk[:, 0], history["before_root"]
        closes = (root >= self.timestamp_begin) & (before >= 0) & (before < self.timestamp_begin)
        hinted = chunk.clone()
        hinted[:, 1] = torch.where(closes, root, chunk[:, 1])
        return hinted

